"""Bounds on what a request may bring: the size of a request's body, checked before any route reads it, and the
uploads a visitor sends (each a file written into gradio's cache), counted against their writes a minute.

A public Space takes requests from anyone; a route that reads a body whole (the OpenAI endpoint's JSON, gradio's
uploads) would hold whatever it is sent. `BodyCap` is an ASGI middleware on the studio's server (app.serve): a body
whose Content-Length says it is over the cap is answered 413 at once, unread; one sent without a length (chunked) is
counted as it is read and answered 413 once it passes the cap, before its route answers. The answer is OpenAI's
error shape with the sentence, so the images endpoint's callers read it as they read every other refusal.
"""

from __future__ import annotations

import json

from studio.app.limits import Refused

MB = 2**20
UPLOAD_ROUTES = ("/gradio_api/upload", "/upload")  # gradio's: each POST writes the files it carries to its cache


class BodyTooLarge(Exception):
    """A body read past the cap (raised inside the route's receive; BodyCap answers it)."""


def too_large(size: int, cap: int) -> str:
    said = f"{size / MB:.1f} MiB" if size else "over the cap"
    return (
        f"request body of {said} is over this studio's limit of {cap / MB:g} MiB (STUDIO_MAX_BODY_MB): "
        "send a smaller picture or request"
    )


class BodyCap:
    """ASGI middleware: 413 for a request body over `max_bytes` (None: no cap)."""

    def __init__(self, app, max_bytes: int | None):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.max_bytes is None:
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return await _refuse(send, int(length), self.max_bytes)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(seen)
            return message

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge:
            if started:  # the route answered before it read the rest: nothing more can be said on this response
                raise
            await _refuse(send, seen, self.max_bytes)


class UploadCount:
    """ASGI middleware: each upload (a POST to gradio's upload route) is a writing event of its visitor, counted by
    `count(scope)` (app.handlers.Studio.wrote_scope: Refused over the visitor's writes a minute) and answered 429
    with the sentence when over, before the body is read. `count` None: nothing counted (not a public studio)."""

    def __init__(self, app, count=None):
        self.app, self.count = app, count

    async def __call__(self, scope, receive, send):
        if (
            self.count is not None
            and scope["type"] == "http"
            and scope.get("method") == "POST"
            and scope.get("path", "").rstrip("/") in UPLOAD_ROUTES
        ):
            try:
                self.count(scope)
            except Refused as e:
                return await _answer(send, 429, str(e), "rate_limit_error")
        return await self.app(scope, receive, send)


async def _refuse(send, size: int, cap: int) -> None:
    await _answer(send, 413, too_large(size, cap), "invalid_request_error")


async def _answer(send, status: int, sentence: str, kind: str) -> None:
    body = json.dumps({"error": {"message": sentence, "type": kind, "param": None, "code": str(status)}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
