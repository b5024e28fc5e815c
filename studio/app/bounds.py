"""ASGI middleware bounding what a request may bring, before any route reads it: a body's size (a route that reads a
body whole would hold whatever it is sent), a visitor's uploads, and a visitor's requests waiting in gradio's queue.
Refusals come in OpenAI's error shape, as every other refusal does."""

from __future__ import annotations

import json
from collections import Counter

from studio.app.limits import Refused, route

MB = 2**20
UPLOAD_ROUTES = ("/gradio_api/upload", "/upload")  # gradio's: each POST writes the files it carries to its cache
JOIN_ROUTES = ("/gradio_api/queue/join", "/gradio_api/call/")  # gradio's: each POST puts one event in its queue
API_ROUTES = ("/v1/",)  # the OpenAI endpoint's: a call holds a thread while its event waits (app.openai_api)


class BodyTooLarge(Exception):
    """A body read past the cap (raised inside the route's receive)."""


UPLOAD = "STUDIO_MAX_UPLOAD_MB"


def too_large(size: int, cap: int, setting: str = "STUDIO_MAX_BODY_MB") -> str:
    if setting == UPLOAD:
        return (
            f"an upload of {size / MB:.1f} MiB is over this public studio's limit of {cap / MB:g} MiB for one file "
            f"({setting}): a picture or a preset needs a few MiB"
        )
    if setting == "STUDIO_MAX_BODY_MB":
        said = f"{size / MB:.1f} MiB" if size else "over the cap"
        return (
            f"request body of {said} is over this studio's limit of {cap / MB:g} MiB ({setting}): "
            "send a smaller picture or request"
        )
    said = f"{size / 1024:.1f} KiB" if size else "over the cap"
    return (
        f"request body of {said} is over this studio's limit of {cap / 1024:g} KiB for an images request ({setting}): "
        "send the prompt and its fields"
    )


class BodyCap:
    """413 for a request body over `max_bytes` (None: no cap) or a route's tighter cap (`routes`: (path prefix, bytes,
    setting)...): at once from its Content-Length, else (chunked) as soon as the count passes it."""

    def __init__(self, app, max_bytes: int | None, routes: tuple = ()):
        self.app, self.max_bytes, self.routes = app, max_bytes, tuple(routes)

    def _cap(self, path: str) -> tuple[int | None, str]:
        for prefix, most, setting in self.routes:
            if path.startswith(prefix):
                return (most if self.max_bytes is None else min(most, self.max_bytes)), setting
        return self.max_bytes, "STUDIO_MAX_BODY_MB"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cap, setting = self._cap(route(scope))
        if cap is None:
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > cap:
            return await _refuse(send, int(length), cap, setting)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
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
            await _refuse(send, seen, cap, setting)


class UploadCount:
    """Each upload counted against its visitor by `count(scope, nbytes)` (None: not a public studio) before its body
    is read: 429 when `count` refuses, 413 over `max_bytes`, 411 without a Content-Length."""

    def __init__(self, app, count=None, max_bytes: int | None = None):
        self.app, self.count, self.max_bytes = app, count, max_bytes

    async def __call__(self, scope, receive, send):
        if (
            self.count is None
            or scope["type"] != "http"
            or scope.get("method") != "POST"
            or route(scope).rstrip("/") not in UPLOAD_ROUTES
        ):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if not length.isdigit():
            sentence = "an upload to this public studio says its size (Content-Length): send it as a browser does"
            return await _answer(send, 411, sentence, "invalid_request_error")
        if self.max_bytes is not None and int(length) > self.max_bytes:
            return await _answer(send, 413, too_large(int(length), self.max_bytes, UPLOAD), "invalid_request_error")
        try:
            self.count(scope, int(length))
        except Refused as e:
            return await _answer(send, 429, str(e), "rate_limit_error")
        return await self.app(scope, receive, send)


class WaitingCap:
    """429 for a POST that would put more than `most` of a visitor's requests in gradio's queue (the rate is read only
    when an event runs: a burst would fill it); joins on their way in count too. A /v1 call counts from arrival to end
    (it holds a thread), its own join (`internal`) not again. `who` None: not a public studio."""

    def __init__(self, app, who=None, queued=None, most: int = 4, internal=None):
        self.app, self.who, self.queued, self.most, self.internal = app, who, queued, most, internal
        self.joining: Counter = Counter()  # visitor -> joins passed on and not yet answered

    async def __call__(self, scope, receive, send):
        if (
            self.who is None
            or scope["type"] != "http"
            or scope.get("method") != "POST"
            or not route(scope).startswith(JOIN_ROUTES + API_ROUTES)
            or (self.internal is not None and self.internal(scope))  # an OpenAI call's own join: counted as the call
        ):
            return await self.app(scope, receive, send)
        me = self.who(scope)
        if self.joining[me] + self.queued(me) >= self.most:
            sentence = (
                f"this public studio keeps at most {self.most} of a visitor's requests waiting in its queue "
                "(STUDIO_WAITING_PER_VISITOR): send the next when one has finished"
            )
            return await _answer(send, 429, sentence, "rate_limit_error")
        self.joining[me] += 1  # no await between the count and this: the event loop runs one request here at a time
        try:
            return await self.app(scope, receive, send)
        finally:
            self.joining[me] -= 1
            if not self.joining[me]:
                del self.joining[me]


async def _refuse(send, size: int, cap: int, setting: str = "STUDIO_MAX_BODY_MB") -> None:
    await _answer(send, 413, too_large(size, cap, setting), "invalid_request_error")


async def _answer(send, status: int, sentence: str, kind: str) -> None:
    body = json.dumps({"error": {"message": sentence, "type": kind, "param": None, "code": str(status)}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
