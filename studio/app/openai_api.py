"""The OpenAI images API on the studio's own server: `POST /v1/images/generations` and `GET /v1/models`. An adapter
over `/images`, not a second way in: each call goes through gradio's queue on the caller's behalf (its address
signed for this process, so its public limits are the same; ZeroGPU's `x-ip-token`, so it bills the caller's quota).
Answers and errors take OpenAI's shapes and statuses, with the studio's numbers per picture under `studio`."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from studio.app.limits import INTERNAL_TOKEN, VISITOR_HEADER
from studio.spec.checks import ConfigError
from studio.spec.images_api import ImagesRequest, Served, UnknownModel

READ_S = 120.0  # the longest silence of a call back's event stream

# The status and OpenAI error type of each kind of error the studio says (app.errors.TITLES' titles).
STATUS = {
    "Too many requests": (429, "rate_limit_error"),
    "Over this studio's limits": (400, "invalid_request_error"),
    "That request can't run": (400, "invalid_request_error"),
    "The model could not load": (500, "server_error"),
    "Over the time limit": (500, "server_error"),
    "The run failed": (500, "server_error"),
}


def _detail(answer: httpx.Response) -> str:
    """The sentence of an HTTP error answer from gradio (FastAPI's `detail`), or its first characters."""
    try:
        said = answer.json()
        return str(said.get("detail") or said.get("error", {}).get("message") or answer.text[:200])
    except (ValueError, AttributeError):  # not JSON, or not an object
        return answer.text[:200] or f"HTTP {answer.status_code}"


def _outcome(http: httpx.Client, url: str, headers: dict) -> tuple[str, object]:
    """The last event of a gradio event stream (`complete` or `error`) and its data, read as JSON."""
    event = None
    with http.stream("GET", url, headers=headers) as answer:
        if answer.status_code != 200:
            answer.read()
            raise ApiFailure(503, f"the studio's event stream answered: {_detail(answer)}", "server_error")
        for line in answer.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                return event, json.loads(line.split(":", 1)[1])
    raise ApiFailure(503, "the studio's event stream ended before the run did: try again", "server_error")


def self_url(request: Request) -> str:
    """This server's URL for a call from this process: the address and port the caller's connection reached (surely
    listened on, whatever the bind), loopback where the server did not say."""
    host, port = request.scope.get("server") or ("127.0.0.1", 7860)
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "", None) else host  # noqa: S104 (reading, not binding)
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


class ApiFailure(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


class ImagesEndpoint:
    """The two routes, over the studio's facade (app.handlers.Studio) and its defaults."""

    def __init__(self, studio, default_preset: str, compare: str, api_key: str | None = None):
        self.studio, self.default_preset, self.compare, self.api_key = studio, default_preset, compare, api_key
        # calls back to this server: a read waits at most READ_S between two messages (gradio's queue sends a
        # heartbeat every 15 s while an event waits or runs)
        self.http = httpx.Client(timeout=httpx.Timeout(READ_S, connect=10.0))

    def routes(self) -> list[APIRoute]:
        """For FastAPI's `routes` (ahead of gradio's own)."""
        return [
            APIRoute("/v1/images/generations", self.generations, methods=["POST"], include_in_schema=True),
            APIRoute("/v1/models", self.models, methods=["GET"]),
        ]

    # --------------------------------------------------------------------------------------------- the routes
    async def generations(self, request: Request) -> JSONResponse:
        try:
            try:
                body = json.loads(await request.body() or b"null")
            except ValueError as e:
                raise ApiFailure(400, f"the request body is not JSON ({e}): send a JSON object") from None
            return JSONResponse(await run_in_threadpool(self._generate, request, body))
        except ApiFailure as f:
            return f.response()

    async def models(self, request: Request) -> JSONResponse:
        served = self.served()
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "dit-speed-studio", "presets": list(served.presets)}
            for m in served.models
        ]
        return JSONResponse({"object": "list", "data": data})

    # ------------------------------------------------------------------------------------------------ the work
    def served(self) -> Served:
        names = tuple(self.studio.library().names())
        return Served(tuple(self.studio.models), names, self.default_preset, self.compare)

    def _size_rule(self, model: str):
        p = self.studio.device.profile(model)
        cap = min(p.max_size, self.studio.device.caps[1] or p.max_size)
        own = (p.width, p.height)
        usual = [f"{w}x{h}" for w, h in [own] + [(w, h) for _, w, h in p.aspect_sizes() if (w, h) != own]]
        return (p.size_multiple, p.min_size, cap), usual

    def _read(self, body) -> ImagesRequest:
        try:
            return ImagesRequest.read(body, self.served(), self._size_rule)
        except UnknownModel as e:
            raise ApiFailure(404, str(e), code="model_not_found") from None
        except ConfigError as e:
            raise ApiFailure(400, str(e)) from None

    def _generate(self, request: Request, body) -> dict:
        ask = self._read(body)
        profile = self.studio.device.profile(ask.model)
        width, height = ask.size or (profile.width, profile.height)
        params = dict(
            prompt=ask.prompt,
            model=ask.model,
            preset=ask.preset,
            seed=ask.seed or 0,
            steps=ask.steps or profile.steps,
            width=width,
            height=height,
            guidance=ask.guidance if ask.guidance is not None else (profile.guidance or 0.0),
            negative_prompt=ask.negative_prompt,
            true_cfg_scale=ask.true_cfg_scale or profile.true_cfg_scale or 1.0,
            num_images_per_prompt=ask.n,
            compare=ask.compare,
            loras="",
            cache="unset",
            compile="unset",
            threshold=0,
        )
        pictures, numbers = self._call(request, params)
        data = [self._picture(request, pic, ask.response_format) | {"studio": n} for pic, n in zip(pictures, numbers)]
        return {"created": int(time.time()), "data": data, "studio": {"ignored": list(ask.ignored)}}

    def _call(self, request: Request, params: dict) -> tuple[list, list]:
        """/images through gradio's queue for the caller (`/call/v2/images`, then its event stream), in plain HTTP:
        a gradio_client per call would leave its heartbeat thread and connection behind."""
        headers = {VISITOR_HEADER: f"{INTERNAL_TOKEN} {self.studio.visitor(request)}"}
        if self.api_key:  # the caller passed app.access's gate with it; the call back passes the same gate
            headers["authorization"] = f"Bearer {self.api_key}"
        if request.headers.get("x-ip-token"):  # ZeroGPU: the caller's quota, as gradio's own calls carry it
            headers["x-ip-token"] = request.headers["x-ip-token"]
        route = f"{self_url(request)}gradio_api/call/v2/images"
        try:
            joined = self.http.post(route, json=params, headers=headers)
            if joined.status_code == 429:  # the visitor's requests waiting (app.bounds.WaitingCap)
                raise ApiFailure(429, _detail(joined), "rate_limit_error")
            if joined.status_code != 200:  # the queue full (503), the server stopping
                said = _detail(joined)
                raise ApiFailure(503, f"the studio could not take the request now ({said}): try again", "server_error")
            event, data = _outcome(self.http, f"{route}/{joined.json()['event_id']}", headers)
        except httpx.HTTPError as e:  # the server stopping, or silent past the read limit
            raise ApiFailure(
                503, f"the studio could not take the request now ({e!r}): try again", "server_error"
            ) from e
        if event == "complete":
            _, pictures, numbers = data
            return pictures, numbers
        said = data if isinstance(data, dict) else {"error": data}  # an unexpected error sends its sentence alone
        status, kind = STATUS.get(said.get("title"), (500, "server_error"))
        raise ApiFailure(status, said.get("error") or "the run failed (the server logged why)", kind)

    @staticmethod
    def _picture(request: Request, item: dict, fmt: str) -> dict:
        """One gallery item ({image: FileData, caption}) as OpenAI's image object."""
        path = item["image"]["path"]
        if fmt == "url":
            return {"url": f"{str(request.base_url).rstrip('/')}/gradio_api/file={path}", "revised_prompt": None}
        return {"b64_json": base64.b64encode(Path(path).read_bytes()).decode(), "revised_prompt": None}
