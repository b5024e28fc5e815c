"""The ways programs call the studio, through their own clients against the running app: the `openai` SDK on
`/v1/images/generations` and `/v1/models`, the `mcp` package's client on gradio's MCP server, and the checks under
them (the request's reading, the history a browser keeps).

The app runs as app.py runs it: the embedded model in the supervised device worker, served by app.serve.launch.
"""

from __future__ import annotations

import asyncio
import base64
import io
import socket

import httpx
import numpy as np
import pytest
from PIL import Image

from studio.engine.baseline import Pairing
from studio.spec import PresetLibrary
from studio.spec.checks import ConfigError
from studio.spec.images_api import ImagesRequest, Served, UnknownModel, parse_size
from studio.spec.settings import Settings, current

PROMPT = "a red circle in the center, blue background"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(device, bind: str = "127.0.0.1", reach: str = "127.0.0.1", **kw):
    """The app launched bound to `bind`, and its URL at `reach`."""
    from studio.app.serve import launch
    from studio.app.ui import build_app

    demo = build_app(device, **kw)
    port = _free_port()
    launch(demo, server_name=bind, server_port=port, prevent_thread_lock=True, quiet=True, mcp=True)
    return demo, f"http://{reach}:{port}/"


def _own_address() -> str | None:
    """This machine's address on its default route (a Space pod's, as its proxy reaches it); None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # a UDP connect sends nothing: it only picks the route
        except OSError:
            return None
        host = s.getsockname()[0]
    return None if host.startswith("127.") or host == "0.0.0.0" else host


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from studio.worker import WorkerClient, WorkerConfig

    lib = PresetLibrary(user_dir=tmp_path_factory.mktemp("presets"))
    one_pair = Pairing(cheap_pairs=1, max_extra_pairs=0)  # these tests check pictures and shapes, not timing
    device = WorkerClient(WorkerConfig(model="tiny", device="cpu", presets=lib, pairing=one_pair))
    demo, url = _serve(device, default_preset="cache", compare="on")
    yield demo, url
    demo.close()
    device.close()


@pytest.fixture(scope="module")
def oai(served):
    from openai import OpenAI

    return OpenAI(base_url=served[1] + "v1", api_key="unused", max_retries=0, timeout=300)


def _picture(item) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json))).convert("RGB"))


def test_the_openai_sdk_generates_pictures_of_the_asked_size_with_the_studios_numbers(oai):
    assert [m.id for m in oai.models.list()] == ["tiny"]
    r = oai.images.generate(model="tiny:cache", prompt=PROMPT, size="80x48", extra_body={"seed": 3})
    assert len(r.data) == 1 and _picture(r.data[0]).shape == (48, 80, 3)
    n = r.data[0].model_extra["studio"]
    assert n["preset"] == "cache" and n["seed"] == 3 and n["model"] == "tiny"
    assert "DBCache" in n["tag"] and n["cached_steps"] > 0 and n["full_steps"] + n["cached_steps"] == 28
    assert n["speedup"] is None or n["speedup_lo"] <= n["speedup"] <= n["speedup_hi"]
    assert n["timed_pairs"] >= 1 and n["psnr_db"] is not None  # compare `on` (this app's default): base beside it
    two = oai.images.generate(
        model="tiny", prompt=PROMPT, n=2, size="64x64", extra_body={"preset": "base", "seed": 5, "compare": "off"}
    )
    pics = [_picture(d) for d in two.data]
    assert [p.shape for p in pics] == [(64, 64, 3)] * 2 and not np.array_equal(pics[0], pics[1])
    assert [d.model_extra["studio"]["seed"] for d in two.data] == [5, 6]
    assert all("DBCache" not in d.model_extra["studio"]["tag"] for d in two.data)  # base: no cache ran


def test_openai_errors_come_in_openais_shape_and_leave_the_studio_serving_the_same_pixels(served, oai):
    import openai

    ask = dict(model="tiny", prompt=PROMPT, size="64x64", extra_body={"preset": "base", "seed": 11, "compare": "off"})
    before = _picture(oai.images.generate(**ask).data[0])
    cases = [
        (dict(ask, size="100x100"), openai.BadRequestError, "size '100x100' is not a size this model takes"),
        (dict(ask, prompt="   "), openai.BadRequestError, "prompt is empty"),
        (
            dict(ask, model="dall-e-3"),
            openai.NotFoundError,
            "model 'dall-e-3' is not served here: the models are tiny",
        ),
        (dict(ask, extra_body={"stepz": 4}), openai.BadRequestError, "field 'stepz' is not one this endpoint reads"),
        (dict(ask, n=9), openai.BadRequestError, "n=9 is not valid: use a whole number from 1 to 4"),
    ]
    for kwargs, kind, sentence in cases:
        with pytest.raises(kind) as e:
            oai.images.generate(**kwargs)
        assert set(e.value.body) == {"message", "type", "param", "code"} and sentence in e.value.body["message"]
    assert np.array_equal(before, _picture(oai.images.generate(**ask).data[0]))  # the refusals changed nothing
    # a URL in place of the picture, served by the same server
    url = oai.images.generate(**dict(ask, response_format="url")).data[0].url
    fetched = np.asarray(Image.open(io.BytesIO(httpx.get(url, timeout=30).content)).convert("RGB"))
    assert url.startswith(served[1]) and np.array_equal(fetched, before)


def test_the_openai_endpoints_calls_back_leave_no_thread_behind(served, oai):
    """Each /v1 call goes through gradio's queue over plain HTTP: no client, session or heartbeat thread outlives it
    (a gradio_client per call left its heartbeat thread and connection behind, each: a public Space's memory grew
    with every call). A refusal said inside gradio comes back with its sentence and OpenAI's status."""
    import threading

    import openai

    ask = dict(model="tiny", prompt=PROMPT, size="64x64", extra_body={"preset": "base", "seed": 2, "compare": "off"})
    oai.images.generate(**ask)  # the pool threads a call uses, started once
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        with pytest.raises(openai.BadRequestError) as e:
            oai.images.generate(**dict(ask, prompt="x" * 2001))  # refused by gradio's admission, not by /v1's reading
        assert "request.prompt is 2001 characters long: at most 2000 are allowed" in e.value.body["message"]
        assert len(oai.images.generate(**ask).data) == 1
    left = [t.name for t in threading.enumerate() if t.ident not in before and not t.name.startswith("AnyIO")]
    assert left == []


def test_mcp_clients_list_the_studios_tools_and_generate_on_the_embedded_model(served):
    """An MCP client (the `mcp` package's, over gradio's streamable HTTP transport) finds the endpoints as tools with
    descriptions naming the presets and the numbers, and `images` returns the picture as an image with its numbers,
    with progress streamed while it runs. (A client that asks for no progress gets the outputs as one text in
    gradio 6.31: docs/library-behaviour.md G-MCP1.)"""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    steps = []

    async def progress(done, total, message):
        steps.append((done, total, message))

    async def go():
        async with streamablehttp_client(served[1] + "gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                tools = {t.name: t for t in (await s.list_tools()).tools}
                args = dict(prompt=PROMPT, preset="cache", seed=2, steps=28, width=64, height=64, compare="on")
                return tools, await s.call_tool("images", args, progress_callback=progress)

    tools, res = asyncio.run(go())
    assert set(tools) == {"images", "generate", "compare", "matrix", "tune", "headroom"}  # no UI plumbing offered
    for name in ("base", "cache", "cache-int8-sage"):
        assert f"`{name}`:" in tools["images"].description
    assert "speedup_lo" in tools["images"].description and "what ran" in tools["images"].description
    assert not res.isError, res.content
    pics = [c for c in res.content if c.type == "image"]
    assert len(pics) >= 1, [str(c)[:300] for c in res.content]
    assert Image.open(io.BytesIO(base64.b64decode(pics[0].data))).size == (64, 64)
    text = " ".join(c.text for c in res.content if c.type == "text")
    assert "DBCache" in text and "cached_steps" in text
    assert steps, "no progress reached the client"


def test_a_public_visitor_is_the_same_visitor_through_the_openai_endpoint(tmp_path, random_model_dir):
    """The rate counts a visitor's calls whichever way they come (the OpenAI endpoint, gradio_client); a header a
    client writes to pass for another visitor is not believed. A refusal is 429 in OpenAI's shape."""
    import openai
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from studio.app.limits import PublicLimits
    from studio.engine import ModelManager, Runner

    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    demo, url = _serve(runner, public=True, limits=PublicLimits(requests_per_minute=1), models=[random_model_dir])
    try:
        oai = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=300)
        ok = oai.images.generate(
            model=random_model_dir, prompt=PROMPT, extra_body={"preset": "base", "compare": "off"}
        )
        assert _picture(ok.data[0]).shape[2] == 3
        with pytest.raises(openai.RateLimitError) as e:
            oai.images.generate(model=random_model_dir, prompt=PROMPT, extra_body={"preset": "base"})
        assert "at most 1 requests a minute per visitor" in e.value.body["message"]
        assert e.value.body["type"] == "rate_limit_error"
        forged = Client(url, verbose=False, headers={"x-studio-visitor": "guess 198.51.100.9"})
        with pytest.raises(AppError, match="at most 1 requests a minute per visitor"):
            forged.predict(prompt=PROMPT, model=random_model_dir, preset="base", api_name="/generate")
    finally:
        demo.close()
        runner.manager.unload()


@pytest.mark.parametrize("reach", ["127.0.0.2", "own address"])
def test_openai_callers_behind_a_proxy_keep_their_own_limit_whatever_address_the_server_is_bound_to(
    tmp_path, random_model_dir, reach, settings
):
    """The OpenAI endpoint calls /images back through gradio's queue, on behalf of the caller. Bound to 0.0.0.0 (as
    on a Space) and reached on another loopback address or on the machine's own (as a Space's proxy reaches the pod),
    each caller is still the visitor the trusted proxy named: one caller's limit refuses that caller only. (Calling
    back at the pod's address had made every caller one visitor, "address <pod>", one bucket for all.)"""
    import openai

    from studio.app.limits import PublicLimits
    from studio.engine import ModelManager, Runner

    host = _own_address() if reach == "own address" else reach
    if host is None:
        pytest.skip("this machine has no address on a default route")
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    settings(proxy_hops=1)  # one proxy in front, as on a Space
    limits = PublicLimits(requests_per_minute=1)
    demo, url = _serve(runner, bind="0.0.0.0", reach=host, public=True, limits=limits, models=[random_model_dir])

    def caller(address: str, first_hop: str = ""):  # the proxy appends the address it was reached from
        hops = f"{first_hop}, {address}" if first_hop else address
        headers = {"x-forwarded-for": hops}
        return openai.OpenAI(base_url=url + "v1", api_key="-", max_retries=0, timeout=300, default_headers=headers)

    ask = dict(model=random_model_dir, prompt=PROMPT, extra_body={"preset": "base", "compare": "off"})
    try:
        assert _picture(caller("203.0.113.7").images.generate(**ask).data[0]).shape[2] == 3
        # another caller is served: not "address <the pod>", one bucket for every caller
        assert _picture(caller("203.0.113.8").images.generate(**ask).data[0]).shape[2] == 3
        # the first caller, again, with a first hop of its own writing: its own limit
        with pytest.raises(openai.RateLimitError, match="at most 1 requests a minute per visitor"):
            caller("203.0.113.7", first_hop="198.51.100.99").images.generate(**ask)
    finally:
        demo.close()
        runner.manager.unload()


def _mcp_picture(url: str, headers: dict, gen: dict) -> np.ndarray:
    """The `images` tool's picture for `gen`'s request, called by the `mcp` package's client with `headers`."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    args = {k: v for k, v in gen.items() if k != "api_name"}

    async def go():
        async with streamablehttp_client(url + "gradio_api/mcp/", headers=headers) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                return await s.call_tool("images", args, progress_callback=lambda *a: asyncio.sleep(0))

    res = asyncio.run(go())
    assert not res.isError, res.content
    png = next(c for c in res.content if c.type == "image").data
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"))


@pytest.mark.parametrize("open_page", [False, True])
def test_with_an_api_key_every_way_in_asks_for_it_and_the_page_only_where_the_operator_opened_it(
    tmp_path, random_model_dir, settings, open_page
):
    """STUDIO_API_KEY set: the page, gradio's API (gradio_client), the OpenAI endpoint and MCP each answer 401 with
    the sentence without the key, and serve with it (a Bearer token; a browser's Basic sign-in, any user name). With
    STUDIO_OPEN_PAGE=1 the page and its gradio events are open, and `/v1` and MCP still ask."""
    import openai
    from gradio_client import Client
    from gradio_client.exceptions import AuthenticationError

    from studio.engine import ModelManager, Runner

    settings(api_key="s3cret", open_page=open_page)
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    demo, url = _serve(runner, models=[random_model_dir])
    ask = dict(
        model=random_model_dir,
        prompt=PROMPT,
        size="64x64",
        extra_body={"preset": "base", "compare": "off", "seed": 3, "num_inference_steps": 4},
    )
    gen = dict(prompt=PROMPT, model=random_model_dir, preset="base", compare="off", seed=3, steps=4, width=64)
    gen.update(height=64, api_name="/generate")
    try:
        page = httpx.get(url, timeout=30)
        mcp = httpx.post(url + "gradio_api/mcp/", json={}, timeout=30)
        models = httpx.get(url + "v1/models", timeout=30)
        for answer in [mcp, models] + ([] if open_page else [page]):
            assert answer.status_code == 401, (answer.request.url, answer.status_code)
            assert "this studio wants its API key (the operator's STUDIO_API_KEY)" in answer.json()["error"]["message"]
            assert answer.headers["www-authenticate"].startswith("Basic ")  # a browser asks for the key
        signed_in = httpx.get(url, auth=("anyone", "s3cret"), timeout=30)
        assert signed_in.status_code == 200 and "<html" in signed_in.text.lower()
        assert httpx.get(url, auth=("anyone", "wrong"), timeout=30).status_code == (200 if open_page else 401)
        assert page.status_code == (200 if open_page else 401)
        oai = openai.OpenAI(base_url=url + "v1", api_key="wrong", max_retries=0, timeout=300)
        with pytest.raises(openai.AuthenticationError, match="wants its API key"):
            oai.images.generate(**ask)
        keyed = oai.with_options(api_key="s3cret")  # its call back through gradio's queue passes the gate too
        by_key = _picture(keyed.images.generate(**ask).data[0])
        with_key = Client(url, verbose=False, headers={"authorization": "Bearer s3cret"})
        k = by_key.shape[0]  # the Generate tab shows a small picture enlarged by a whole factor, pixel for pixel
        shown = np.asarray(Image.open(with_key.predict(**gen)[0]).convert("RGB"))
        by_client = shown[:: shown.shape[0] // k, :: shown.shape[1] // k]
        assert np.array_equal(by_key, by_client)  # the same request, the same pixels, whichever way in
        assert np.array_equal(by_key, _mcp_picture(url, {"authorization": "Bearer s3cret"}, gen))  # MCP too
        if open_page:  # the page's events are gradio's API: open to a program that calls them as the page does
            assert Client(url, verbose=False, download_files=False).predict(**gen)[0]
        else:
            with pytest.raises(AuthenticationError, match="credentials were not provided"):
                Client(url, verbose=False, download_files=False)
    finally:
        demo.close()
        runner.manager.unload()


# ------------------------------------------------------------------------------------------------- no server
@pytest.mark.quick
def test_a_body_is_read_in_the_studios_terms_and_refused_by_field():
    s = Served(("tiny", "org/flux"), ("base", "cache"), "cache", "auto")
    rule = lambda model: ((8, 32, 128), ["64x64", "72x56"])  # noqa: E731
    r = ImagesRequest.read({"prompt": "p", "model": "tiny:base", "size": "72x56", "n": 2, "quality": "hd"}, s, rule)
    assert (r.model, r.preset, r.size, r.n, r.compare, r.ignored) == (
        "tiny",
        "base",
        (72, 56),
        2,
        "auto",
        ("quality",),
    )
    r = ImagesRequest.read({"prompt": "p", "model": "tiny:base", "preset": "cache", "size": "auto"}, s, rule)
    assert (r.preset, r.size, r.response_format) == ("cache", None, "b64_json")  # the field wins over the suffix
    assert ImagesRequest.read({"prompt": "p"}, s, rule).model == "tiny"
    with pytest.raises(UnknownModel, match=r"model 'org/flux:fast' is not served here"):
        ImagesRequest.read({"prompt": "p", "model": "org/flux:fast"}, s, rule)
    with pytest.raises(ConfigError, match=r"preset 'turbo' is not one of this studio's presets: use one of"):
        ImagesRequest.read({"prompt": "p", "preset": "turbo"}, s, rule)
    for body, sentence in [
        ({"prompt": "p", "n": 0}, "n=0 is not valid"),
        ({"prompt": "p", "n": 1.5}, "n=1.5 is not valid"),
        ({"prompt": "p", "n": True}, "n=True is not valid"),
        ({"prompt": "p", "response_format": "png"}, "response_format='png' is not valid: use b64_json or url"),
        ({"prompt": "p", "compare": "yes"}, "compare='yes' is not valid"),
        ({"prompt": "p", "guidance_scale": -1}, "guidance_scale=-1 is not valid"),
        ({"prompt": ""}, "prompt is empty"),
        (["p"], "must be a JSON object"),
    ]:
        with pytest.raises(ConfigError, match=sentence.replace("(", r"\(").replace(".", r"\.")):
            ImagesRequest.read(body, s, rule)
    assert parse_size(" 64 x 32 ", (8, 32, 128), []) == (64, 32)
    for bad in ("64", "64x33", "16x64", "256x64", "ax b"):
        with pytest.raises(ConfigError, match="each side a multiple of 8 from 32 to 128, e.g. 64x64"):
            parse_size(bad, (8, 32, 128), ["64x64"])


@pytest.mark.quick
def test_every_error_title_the_studio_raises_has_an_openai_status():
    from studio.app.errors import TITLES, title_of
    from studio.app.limits import RateLimited, Refused
    from studio.app.openai_api import STATUS
    from studio.spec.errors import OverTime

    assert {t for _, t in TITLES} == set(STATUS)
    assert STATUS[title_of(RateLimited("x"))] == (429, "rate_limit_error")
    assert STATUS[title_of(Refused("x"))][0] == STATUS[title_of(ConfigError("x"))][0] == 400
    assert STATUS[title_of(OverTime("x"))][0] == 500


@pytest.mark.quick
def test_the_internal_visitor_header_is_believed_only_from_this_process():
    from studio.app.limits import INTERNAL_TOKEN, visitor

    signed = {"x-studio-visitor": f"{INTERNAL_TOKEN} address 203.0.113.5"}
    assert visitor("127.0.0.1", signed, "s", 0) == "address 203.0.113.5"
    assert visitor("127.0.0.2", signed, "s", 0) == "address 203.0.113.5"  # all of 127/8 is this machine
    assert visitor("::1", signed, "s", 0) == "address 203.0.113.5"
    assert visitor("198.51.100.1", signed, "s", 0) == "address 198.51.100.1"  # not from this machine
    # a call from this machine to its own address (a Space's pod): the connection left from the address it reached
    assert visitor("10.0.0.7", signed, "s", 1, local="10.0.0.7") == "address 203.0.113.5"
    assert visitor("10.0.0.8", signed, "s", 0, local="10.0.0.7") == "address 10.0.0.8"  # the Space's proxy
    assert visitor("127.0.0.1", {"x-studio-visitor": "guess address 1.2.3.4"}, "s", False) == "address 127.0.0.1"


@pytest.mark.quick
def test_the_key_is_read_from_a_bearer_token_or_a_browsers_sign_in_and_mcp_reads_only_from_this_machine():
    from studio.app.access import carries_key, mcp_reading, open_to_all

    basic = lambda user_key: "Basic " + base64.b64encode(user_key.encode()).decode()  # noqa: E731
    assert carries_key("Bearer k3y", "k3y") and carries_key("bearer  k3y ", "k3y")
    assert carries_key(basic("anyone:k3y"), "k3y") and carries_key(basic(":k3y"), "k3y")
    for wrong in ("Bearer k3", "k3y", "Token k3y", basic("k3y:"), basic("anyone:k3yy"), "Basic !!!", ""):
        assert not carries_key(wrong, "k3y"), wrong
    get = {"method": "GET", "headers": [(b"x-gradio-user", b"mcp")], "server": ("10.0.0.7", 7860)}
    assert mcp_reading(dict(get, client=("127.0.0.1", 5)))
    assert mcp_reading(dict(get, client=("10.0.0.7", 5)))  # from this machine to its own address
    assert not mcp_reading(dict(get, client=("10.0.0.8", 5)))  # from elsewhere (a Space's proxy): the header is theirs
    assert not mcp_reading(dict(get, method="POST", client=("127.0.0.1", 5)))  # a submit carries the caller's key
    assert not mcp_reading(dict(get, headers=[], client=("127.0.0.1", 5)))
    assert open_to_all("/gradio_api/startup-events", False)  # gradio's launch starts its queue with it
    assert not open_to_all("/", False) and open_to_all("/", True) and open_to_all("/gradio_api/queue/join", True)
    for program in ("/v1/models", "/v1/images/generations", "/gradio_api/mcp", "/gradio_api/mcp/sse"):
        assert not open_to_all(program, True), program
    # a reverse proxy on this machine connects from 127.0.0.1 too: what it forwards is a visitor's, not MCP's reads
    proxied = dict(
        get, client=("127.0.0.1", 5), headers=[(b"x-gradio-user", b"mcp"), (b"x-forwarded-for", b"1.2.3.4")]
    )
    assert not mcp_reading(proxied)
    # behind a proxy that mounts the studio under a prefix, the doors read the path within the studio
    from studio.app.limits import route

    assert route({"path": "/studio/v1/models", "root_path": "/studio"}) == "/v1/models"
    assert route({"path": "/v1/models", "root_path": "/studio"}) == "/v1/models"  # a server that strips it itself
    assert route({"path": "/gradio_api/upload", "root_path": ""}) == "/gradio_api/upload"


@pytest.mark.quick
def test_mcp_is_off_on_a_public_studio_unless_the_operator_turns_it_on():
    assert Settings.from_env({}).mcp is True and Settings.from_env({"SPACE_ID": "a/b"}).mcp is False
    assert Settings.from_env({"SPACE_ID": "a/b", "STUDIO_MCP": "1"}).mcp is True
    assert Settings.from_env({"STUDIO_API_KEY": " k "}).api_key == "k" and Settings.from_env({}).api_key is None


@pytest.mark.quick
def test_a_history_kept_in_a_browser_is_read_back_checked():
    from studio.app.history import HISTORY_COLUMNS, history_max, restored

    row = [1, "a prompt", 7, 28, "64x64"] + ["x"] * (len(HISTORY_COLUMNS) - 5)
    kept = [row, [2] + row[1:], "junk", [3, "short"], [True] + row[1:], [4] + row[1:-1] + [{"a": 1}]]
    assert restored(kept).rows == [row, [2] + row[1:]] and restored(kept).thumbs == []
    assert restored({"rows": []}).rows == [] and restored(None).rows == []
    many = [[i] + row[1:] for i in range(1, history_max() + 20)]
    assert [r[0] for r in restored(many).rows][:1] == [20] and len(restored(many).rows) == history_max()


def test_a_body_over_the_cap_is_refused_413_unread_on_every_route(served):
    """STUDIO_MAX_BODY_MB (16 by default) caps every request's body before a route reads it, and an OpenAI images
    request's STUDIO_MAX_API_BODY_KB (64 by default): by its Content-Length at once, and a chunked one as it is
    counted; the studio serves on afterwards."""
    import httpx

    url = served[1]
    big = b"x" * (16 * 2**20 + 1)
    r = httpx.post(url + "gradio_api/upload", content=big, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413, (r.status_code, r.text[:200])
    msg = r.json()["error"]["message"]
    assert msg.startswith("request body of 16.0 MiB is over this studio's limit of 16 MiB (STUDIO_MAX_BODY_MB)")
    r = httpx.post(url + "v1/images/generations", content=b"x" * 2**20, headers={"content-type": "application/json"})
    assert r.status_code == 413  # 1 MiB: refused unread, by its Content-Length
    assert r.json()["error"]["message"].startswith(
        "request body of 1024.0 KiB is over this studio's limit of 64 KiB for an images request "
        "(STUDIO_MAX_API_BODY_KB)"
    )

    # no Content-Length: counted as it arrives (the same count under either cap)
    r = httpx.post(url + "v1/images/generations", content=(b"z" * 2**14 for _ in range(8)), timeout=60)
    assert r.status_code == 413 and "limit of 64 KiB for an images request" in r.json()["error"]["message"]
    small = httpx.post(url + "v1/images/generations", json={"model": "tiny", "prompt": " "}, timeout=60)
    assert small.status_code == 400 and "prompt is empty" in small.json()["error"]["message"]  # still serving
