"""ZeroGPU as it runs: every device event's handler in a process forked afresh for the call, through `spaces`' own
wrapper (spaces 0.51.3, zero/wrappers.py: `regular_function_wrapper`, its Worker, its pickling of the arguments and
the result, its forwarding of gradio's progress), with only the scheduler answered here: no GPU is attached, and
every call is told no idle worker is left, so each one forks a new process from the app's, as `spaces` does when
the GPU it gets is not the idle one.

What must outlive a call lives in the app's process and crosses each call (app.zerogpu): compare `auto` still costs
one run of the stack (and, in a new process, its warm-up) once a shape's base timing is kept; the public limits
refuse before any GPU is reserved.
"""

from __future__ import annotations

import os
import socket
import sys
import types
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from studio.spec.settings import using

PROMPT = "a red circle in the center, blue background"
OTHER = "an orange triangle on the left, black background"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def forked_gpu(monkeypatch):
    """spaces.GPU as ZeroGPU runs it, each call in a freshly forked process; yields the seconds each call reserved
    and the workers `spaces` forked."""
    import spaces
    import spaces.zero

    # spaces' own branch for a machine without torch: nothing to attach to a GPU or move onto it (its CUDA patching
    # cannot load over a CPU build of torch)
    no_gpu = types.ModuleType("spaces.zero.torch")
    for name in ("enter_mode", "patch", "unpatch", "pack", "init", "move"):
        setattr(no_gpu, name, lambda *a, **k: None)
    no_gpu.size, no_gpu.is_in_bad_fork = (lambda *a, **k: 0), (lambda *a, **k: False)
    monkeypatch.setitem(sys.modules, "spaces.zero.torch", no_gpu)
    monkeypatch.setattr(spaces.zero, "torch", no_gpu, raising=False)
    from spaces.zero import client, wrappers
    from spaces.zero.api import ScheduleResponse
    from spaces.zero.gradio import patch_gradio_queue

    reserved, workers, tokens = [], [], []

    def schedule(task_id, request=None, duration=None, gpu_size=None):
        assert gpu_size == "large"  # the slice the studio asks for (STUDIO_ZEROGPU_SIZE's default), reaching spaces
        reserved.append(duration.total_seconds() if duration is not None else None)
        tokens.append(client._get_headers(request).get(client.TOKEN_HEADER.lower()))  # whose quota: spaces' read
        return ScheduleResponse(idle=False, nvidiaIndex=0, nvidiaUUID="no-gpu", allowToken="harness")

    def worker_init(res_queue, allow_token, nvidia_uuid, fds):  # spaces' own, less attaching a GPU
        for fd in fds:  # the child does not hold the server's sockets
            try:
                os.close(fd)
            except OSError:
                pass
        patch_gradio_queue(res_queue)

    class Worker(wrappers.Worker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            workers.append(self)

    monkeypatch.setattr(client, "schedule", schedule)
    monkeypatch.setattr(client, "release", lambda *a, **k: None)
    monkeypatch.setattr(client, "get_duration_seconds", lambda d, size: d.total_seconds() if d else 60.0)
    monkeypatch.setattr(wrappers, "worker_init", worker_init)
    monkeypatch.setattr(wrappers, "Worker", Worker)
    monkeypatch.setattr(
        spaces, "GPU", lambda fn, duration=None, size=None: wrappers.regular_function_wrapper(fn, duration, size)
    )
    yield reserved, workers, tokens
    for w in workers:
        w.process.kill()
        w.process.join(10)


def _count_transformer_calls(log):
    """Every transformer call, in whichever process it runs, appended to `log` as its process id (a fork inherits
    the hook)."""
    import torch

    def saw(module, args):
        if type(module).__name__.endswith("Transformer2DModel"):
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")

    return torch.nn.modules.module.register_module_forward_pre_hook(saw)


def test_each_gpu_call_in_a_fresh_process_loses_nothing_the_studio_keeps(
    forked_gpu, random_model_dir, tmp_path, monkeypatch
):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    import studio.worker
    from studio.app.limits import PublicLimits
    from studio.app.serve import launch
    from studio.app.ui import CSS, build_app
    from studio.worker import WorkerConfig
    from studio.worker.service import InProcess

    reserved, workers, tokens = forked_gpu
    log = tmp_path / "calls.log"
    aot = tmp_path / "aot"
    with using(zerogpu=True, proxy_hops=1, aot_dir=str(aot)):  # as on a ZeroGPU Space (the settings read at start)
        device = studio.worker.start_device(WorkerConfig(model=random_model_dir, device="cpu", max_steps=20))
        assert isinstance(device, InProcess)  # the engine in the app's process, its model loaded at import
        demo = build_app(device, public=True, limits=PublicLimits(requests_per_minute=30))
        port = _free_port()
        launch(
            demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS, mcp=True
        )
    hook = _count_transformer_calls(log)
    try:
        c = Client(f"http://127.0.0.1:{port}/", verbose=False, headers={"X-IP-Token": "t-client"})
        common = dict(model=random_model_dir, steps=10, preset="cache", threshold=0.5, api_name="/generate")

        def generate(prompt, compare):
            before = log.read_text().split() if log.exists() else []
            out = c.predict(prompt=prompt, compare=compare, **common)
            pids = Counter(log.read_text().split()[len(before) :])
            assert len(pids) == 1, pids  # the call's transformer ran in one process...
            pid = int(next(iter(pids)))
            assert pid == workers[-1].process.pid != os.getpid()  # ...the one forked for it, not the app's
            return out, pids[str(pid)]

        for _ in range(3):  # a pair spoilt by a stall keeps no shape timing: time again (at most 3 times)
            generate(PROMPT, "on")
            if len(device.kept().shapes):
                break
        assert len(device.kept().shapes) == 1, "no base timing of the shape agreed in 3 tries"
        # another prompt of that shape, in a new process: its warm-up (a new process warms again) and its one run;
        # no base run, the base timing kept in the app's process divides it
        res, calls = generate(OTHER, "auto")
        m = res[-1]
        assert calls == 2 * 10, calls
        assert m["timing"].startswith("warm-up run done in this call")
        assert "base timed on a request of the same shape (prompt and seed aside)" in m["timing"]
        assert m["psnr_db"] is None  # this prompt's base picture was never made
        on, _ = generate(OTHER, "on")  # "Compare with base": now this request's base picture is kept
        again, calls = generate(OTHER, "auto")  # in yet another process: the kept picture came with the call
        assert calls == 2 * 10 and again[-1]["psnr_db"] == on[-1]["psnr_db"] is not None
        picture = np.asarray(Image.open(again[0]))
        assert np.array_equal(picture, np.asarray(Image.open(on[0])))
        assert len({w.process.pid for w in workers}) == len(workers) == len(reserved)  # a fork a call
        # a compiled preset compiles ahead of time (engine.aot): the first call's process builds the packages, the
        # next call's process finds them on disk, and only the first reserved a compile (app.gpu_time)
        with using(zerogpu=True, proxy_hops=1, aot_dir=str(aot)):  # the app process's settings, as at start
            first = c.predict(prompt=PROMPT, **{**common, "preset": "cache-compile", "compare": "off"})
            built = {p.name: p.stat().st_mtime_ns for p in aot.glob("*.pt2")}
            second = c.predict(prompt=OTHER, **{**common, "preset": "cache-compile", "compare": "off"})
        assert first[-1]["tag"].endswith("+aot") and second[-1]["tag"].endswith("+aot")
        assert len(built) == 2 and {p.name: p.stat().st_mtime_ns for p in aot.glob("*.pt2")} == built
        assert reserved[-2] > reserved[-1]  # the build was reserved for once
        # the public limits refuse in the app's process, before a GPU is reserved
        n = len(reserved)
        with pytest.raises(AppError, match="compile is this public studio's operator's choice"):
            c.predict(prompt=PROMPT, **{**common, "compile": "true"})
        with pytest.raises(AppError, match="steps 50 is over this studio's limit of 20"):
            c.predict(prompt=PROMPT, **{**common, "steps": 50})
        assert len(reserved) == n
        # whose quota each way in spends: the caller's X-IP-Token reaches spaces' scheduler (gradio_client above,
        # the OpenAI images endpoint's call back, an MCP tool call), as a browser's does through the Space's proxy
        assert set(tokens) == {"t-client"}, tokens
        _through_v1_and_mcp(f"http://127.0.0.1:{port}/", random_model_dir)
        assert tokens[-2:] == ["t-v1", "t-mcp"], tokens
    finally:
        hook.remove()
        demo.close()
        device.close()


def _through_v1_and_mcp(url: str, model: str) -> None:
    """One picture through `/v1/images/generations` and one through the MCP `images` tool, each with its caller's
    X-IP-Token."""
    import asyncio

    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    body = {"prompt": PROMPT, "model": model, "size": "64x64", "num_inference_steps": 10, "preset": "cache"}
    body.update(compare="off", response_format="b64_json")
    r = httpx.post(url + "v1/images/generations", json=body, headers={"X-IP-Token": "t-v1"}, timeout=120)
    assert r.status_code == 200, r.text

    async def go():
        async with streamablehttp_client(url + "gradio_api/mcp/", headers={"X-IP-Token": "t-mcp"}) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                args = dict(prompt=PROMPT, model=model, steps=10, width=64, height=64, preset="cache", compare="off")
                return await s.call_tool("images", args)

    res = asyncio.run(go())
    assert not res.isError, res.content
