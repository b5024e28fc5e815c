"""One access rule for every route: with STUDIO_API_KEY set, every request needs the key, as a Bearer token or as
Basic's password (a browser asks once per session); else 401 in OpenAI's error shape. STUDIO_OPEN_PAGE=1 opens the
page and its events (so gradio's API too), never `/v1` or MCP. The key never appears in an answer or a log line."""

from __future__ import annotations

import base64
import binascii
import hmac
import json

from studio.app.limits import from_this_machine, route

# The paths that ask for the key even when the page is open: the ways in that are not the page's.
PROGRAM_ONLY = ("/v1/", "/gradio_api/mcp")
# Gradio's launch calls this itself, without headers, to start the queue: it does once what launch does (a second
# call does nothing) and makes no picture, so it is open to all.
ALWAYS_OPEN = ("/gradio_api/startup-events",)
# Headers a proxy adds: a request carrying one came from outside through it, whatever address it connected from.
FORWARDED = (b"x-forwarded-for", b"forwarded", b"x-real-ip")


def needs_key(path: str) -> str:
    """The sentence a request without the key is answered with."""
    how = (
        "send `Authorization: Bearer <key>` (gradio_client: headers=; the OpenAI SDK: api_key=; an MCP client: its "
        "headers), or open the page and sign in with any user name and the key as the password"
    )
    return f"this studio wants its API key (the operator's STUDIO_API_KEY) for {path}: {how}"


def carries_key(authorization: str, key: str) -> bool:
    """Whether an Authorization header carries `key` (Bearer, or Basic's password with any user), in constant time."""
    scheme, _, given = authorization.strip().partition(" ")
    given = given.strip()
    if scheme.lower() == "basic":
        try:
            given = base64.b64decode(given, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.encode(), key.encode())


def mcp_reading(scope) -> bool:
    """Whether the request is gradio's MCP server reading the app from this machine: its client sends the caller's key
    only with a submit, so its GETs are let through (docs/library-behaviour.md G15)."""
    headers = dict(scope.get("headers") or [])
    client, server = scope.get("client") or (None,), scope.get("server") or (None,)
    return (
        scope.get("method") == "GET"
        and headers.get(b"x-gradio-user") == b"mcp"
        and from_this_machine(client[0], server[0])
        and not any(h in headers for h in FORWARDED)  # a proxy on this machine forwarded it: a visitor's, not MCP's
    )


def open_to_all(path: str, open_page: bool) -> bool:
    """Whether `path` is open without the key: the page and its events, where the operator opened the page."""
    if path in ALWAYS_OPEN:
        return True
    return open_page and not any(path == p.rstrip("/") or path.startswith(p) for p in PROGRAM_ONLY)


class KeyGate:
    """ASGI middleware: 401 for a request without `key` (None: every request passes)."""

    def __init__(self, app, key: str | None, open_page: bool = False):
        self.app, self.key, self.open_page = app, key, open_page

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or not self.key:
            return await self.app(scope, receive, send)
        path = route(scope)
        authorization = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        if open_to_all(path, self.open_page) or carries_key(authorization, self.key) or mcp_reading(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":  # close before accepting (the client sees 403)
            return await send({"type": "websocket.close", "code": 1008, "reason": "this studio wants its API key"})
        await _refuse(send, needs_key(path))


async def _refuse(send, sentence: str) -> None:
    body = json.dumps(
        {"error": {"message": sentence, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Basic realm="DiT Speed Studio", charset="UTF-8"'),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
