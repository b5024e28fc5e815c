"""Bounds on what a request may bring: the size of a request's body, checked before any route reads it, and the
uploads a visitor sends (each a file written into gradio's cache), counted against their writes a minute.

A public Space takes requests from anyone; a route that reads a body whole (the OpenAI endpoint's JSON, gradio's
uploads) would hold whatever it is sent. `BodyCap` is an ASGI middleware on the studio's server (app.serve): a body
whose Content-Length says it is over the cap is answered 413 at once, unread; one sent without a length (chunked) is
counted as it is read and answered 413 once it passes the cap, before its route answers. The answer is OpenAI's
error shape with the sentence, so the images endpoint's callers read it as they read every other refusal.

`WaitingCap` bounds a public visitor's requests waiting in gradio's queue: the rate is read when an event runs, inside
the queue, so a burst of concurrent requests from one visitor would otherwise take every place in it
(STUDIO_QUEUE_SIZE) before its rate is read, and every other visitor would be refused "queue full" meanwhile.
"""

from __future__ import annotations

import json
from collections import Counter

from studio.app.limits import Refused, route

MB = 2**20
UPLOAD_ROUTES = ("/gradio_api/upload", "/upload")  # gradio's: each POST writes the files it carries to its cache
JOIN_ROUTES = ("/gradio_api/queue/join", "/gradio_api/call/")  # gradio's: each POST puts one event in its queue
API_ROUTES = ("/v1/",)  # the OpenAI endpoint's: a call holds a thread while its event waits (app.openai_api)


class BodyTooLarge(Exception):
    """A body read past the cap (raised inside the route's receive; BodyCap answers it)."""


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
    """ASGI middleware: 413 for a request body over `max_bytes` (None: no cap), or over a tighter cap for the routes
    `routes` names ((path prefix, bytes, setting)...: the OpenAI images requests)."""

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
    """ASGI middleware: each upload (a POST to gradio's upload route) is a writing event of its visitor and weighs
    its bytes, counted by `count(scope, nbytes)` (app.handlers.Studio.wrote_scope: Refused over the visitor's writes
    a minute or their bytes an hour) and answered 429 with the sentence when over, before the body is read; one
    upload over `max_bytes` (STUDIO_MAX_UPLOAD_MB) is 413, one that does not say its size (Content-Length) 411.
    `count` None: nothing counted (not a public studio)."""

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
    """ASGI middleware: at most `most` (STUDIO_WAITING_PER_VISITOR) of a visitor's requests wait in gradio's queue.
    A POST that would join one more (gradio's queue join and its call routes) is answered 429 with the sentence before
    its body is read. `who(scope)` is the request's visitor (app.handlers.Studio.visitor_scope), `queued(visitor)` how
    many of their events wait in the queue now (app.serve reads gradio's queue); the joins on their way in are counted
    here, so a burst that arrives at once is counted before any of it reaches the queue. `who` None: nothing counted
    (not a public studio). An OpenAI images call (/v1) counts as one waiting request from the moment it arrives,
    before its body is read; the event it joins for its caller (`internal(scope)`: signed by this process) is not
    counted again, here or in `queued`. A /v1 call counts while it runs as well as while it waits (it holds a thread
    of the pool either way), so a /v1 caller has one waiting place fewer than a page's visitor while one runs."""

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
