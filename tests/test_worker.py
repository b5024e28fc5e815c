"""The supervised device worker (studio.worker) with the real engine in it: a native crash during a request costs
that request only, progress streams back, the memory limit restarts it, and no worker outlives the app.

The crash is real: the worker started with the tests' hook (tests/worker_hooks.py crash_on) kills itself with SIGSEGV
at the third denoising step of that preset's run, as a segfaulting kernel would.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from worker_hooks import hooked

from studio.spec import ConfigError, PresetLibrary, RunError
from studio.spec.ask import Switches
from studio.spec.errors import StudioBug
from studio.spec.settings import current
from studio.worker import WorkerClient, WorkerConfig, WorkerCrashed

CRASHES = "int8-weight-only"  # the stack whose runs kill the worker (tests/worker_hooks.py crash_on)

PROMPT = "a red circle in the center, blue background"
ROOT = Path(__file__).resolve().parents[1]
CACHED = dict(preset="cache", threshold=0.5)  # random weights cache at R=0.5


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    return not _alive(pid)


@pytest.fixture(scope="module")
def worker(random_model_dir):
    w = WorkerClient(WorkerConfig(model=random_model_dir, device="cpu", settings=hooked("crash_on", preset=CRASHES)))
    yield w
    w.close()


def _generate(w, seed=5, **kw):
    kw = {**CACHED, **kw}
    p = Switches(threshold=kw.pop("threshold")).apply(w.presets.get(kw.pop("preset")))
    return w.generate(w.request(PROMPT, seed=seed, steps=10), p, **kw)


def test_progress_and_status_lines_stream_back_from_the_worker(worker):
    steps, lines = [], []
    res = _generate(worker, progress=lambda i, n, rec: steps.append((i, n, rec.cached)), on_status=lines.append)
    runs = [steps[k : k + 10] for k in range(0, len(steps), 10)]  # the warm-up and timed runs, step by step
    assert runs and all([s[:2] for s in run] == [(i, 10) for i in range(10)] for run in runs)
    assert [i for i, _, cached in runs[-1] if cached] == res.metrics.cache.cached_step_indices != []
    assert any("base" in line for line in lines)  # the slow phases' status lines came too
    assert res.image.shape == (64, 64, 3) and res.image.dtype == np.uint8


def test_an_error_in_the_worker_comes_back_as_its_class_with_its_sentence(worker):
    pid = worker.pid
    with pytest.raises(ConfigError, match="width 60 is not a multiple of 8"):
        worker.generate(worker.request(PROMPT, width=60, steps=10), "base")
    with pytest.raises(ConfigError, match="warp-speed"):
        worker.generate(worker.request(PROMPT, steps=10), "warp-speed")
    assert worker.pid == pid and worker.restarts == 0  # a Python error changes nothing


def test_a_bug_in_a_worker_call_is_logged_and_said_as_one_a_user_error_as_its_sentence(random_model_dir, capfd):
    """One error boundary: a bench handed one request where its list is due (a caller's bug, which no check of the
    studio catches) fails inside the worker with a TypeError: the caller reads "a bug in the studio (logged)", and
    the worker's stderr has the traceback. A preset name that does not exist is the user's: its plain sentence, no
    traceback. The worker serves on after both."""
    w = WorkerClient(WorkerConfig(model=random_model_dir, device="cpu"), warm=())
    try:
        req = w.request(PROMPT, steps=4)
        with pytest.raises(StudioBug) as bug:
            w.bench(req, ["base"])
        with pytest.raises(ConfigError, match="warp-speed") as user:
            w.bench([req], ["warp-speed"])
        assert w.info()["pid"] == w.pid and w.restarts == 0
    finally:
        w.close()
    assert isinstance(bug.value, RunError)  # what the handlers and the CLI say as any failed run
    assert str(bug.value) == (
        "a bug in the studio (logged): TypeError: object of type 'GenerationRequest' has no len()"
    )
    assert "a bug" not in str(user.value)
    err = capfd.readouterr().err
    assert "ERROR: device call bench failed: a bug in the studio\nTraceback (most recent call last):" in err
    assert "in run_bench" in err and err.count("Traceback") == 1  # the user error left no traceback


def test_the_in_process_device_keeps_the_same_boundary(runner, caplog):
    """ZeroGPU's device and the CLI's `bench --in-process`: the same two answers, the bug's traceback logged."""
    from studio.worker.service import InProcess

    device = InProcess(runner)
    req = device.request(PROMPT, steps=4)
    with caplog.at_level(logging.ERROR, logger="studio.worker"):
        with pytest.raises(StudioBug, match=r"^a bug in the studio \(logged\): TypeError: object of type"):
            device.bench(req, ["base"])
    (record,) = [r for r in caplog.records if r.name == "studio.worker"]
    assert record.getMessage() == "device call bench failed: a bug in the studio" and record.exc_info is not None
    with pytest.raises(ConfigError, match="warp-speed"):
        device.bench([req], ["warp-speed"])


def test_a_native_crash_is_forgiven_once_and_refused_on_the_second_in_a_row(worker, random_model_dir):
    """A stack that crashes the worker on every run (a deterministic segfault): the call runs once more on the new
    worker, crashes it again, and ends with the sentence; the stack is refused from then on, with how to clear it."""
    before = _generate(worker)
    pid, steps, lines = worker.pid, [], []
    with pytest.raises(WorkerCrashed) as crash:
        _generate(
            worker,
            preset="int8-weight-only",
            threshold=None,
            progress=lambda i, t, rec: steps.append(i),
            on_status=lines.append,
        )
    died = f"the device worker crashed (SIGSEGV) while running int8-weight-only on {random_model_dir}"
    assert str(crash.value) == (
        f"{died}; it has been restarted and the model is loading again; int8-weight-only is refused from now on (its "
        "second crash in a row)"
    )
    assert isinstance(crash.value, RunError) and not crash.value.forgiven  # the handlers show it as a failed run
    assert (
        f"{died}; it has been restarted and the model is loading again; running int8-weight-only once more (a second "
        "crash in a row refuses it)"
    ) in lines
    assert steps == [0, 1, 2, 0, 1, 2]  # each run's progress reached this process up to the step it died in
    assert not _alive(pid) and worker.pid != pid and worker.restarts == 2
    after = _generate(worker)
    assert np.array_equal(after.image, before.image)
    assert after.metrics.cache.cached_step_indices == before.metrics.cache.cached_step_indices
    with pytest.raises(
        RunError,
        match=r"int8-weight-only on .* is refused: it crashed the device worker twice in a row \(SIGSEGV, SIGSEGV\) "
        r"in this app's run.*\(restart the app to clear this\)",
    ):
        _generate(worker, preset="int8-weight-only", threshold=None)
    assert worker.restarts == 2  # refused, not crashed again


def test_a_transient_crash_costs_a_wait_not_the_request(worker, random_model_dir, tmp_path):
    """A stack that crashes the worker once (the file `once` marks it done): the same call runs again on the
    new worker and returns the picture a worker that never crashed gives; the stack stays allowed, and its count of
    crashes in a row starts again after a run of it finishes."""
    once = tmp_path / "crashed-once"
    crashes_once = hooked("crash_on", preset="cache", once=str(once))
    w = WorkerClient(WorkerConfig(model=random_model_dir, device="cpu", settings=crashes_once))
    try:
        lines = []
        res = _generate(w, on_status=lines.append)
        assert once.exists() and w.restarts == 1
        assert any(
            line.endswith("running cache.override once more (a second crash in a row refuses it)") for line in lines
        ), lines
        assert w.refused == {} and w.crashes == {}  # it ran to the end: nothing in a row any more
        again = _generate(w)
        assert np.array_equal(res.image, again.image) and w.restarts == 1
    finally:
        w.close()
    assert np.array_equal(_generate(worker).image, res.image)  # the same pixels as a worker that never crashed


def test_the_memory_limit_restarts_the_worker_between_requests(random_model_dir):
    w = WorkerClient(WorkerConfig(model=random_model_dir, device="cpu", max_rss_gb=0.05))
    try:
        first_pid = w.pid
        first = _generate(w, preset="base", threshold=None)  # returned whole; then the worker (over 50 MB) goes
        assert w.restarts == 1 and w.pid != first_pid and _gone_within(first_pid, 5)
        again = _generate(w, preset="base", threshold=None)
        assert np.array_equal(again.image, first.image)
    finally:
        w.close()
    assert _gone_within(w.pid, 5)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _app_env(model: str, **extra) -> dict:
    env = dict(os.environ, STUDIO_MODEL=model, STUDIO_DEVICE="cpu", STUDIO_PREWARM="0", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT)
    return {**env, **extra}


APP_SCRIPT = """
import os, sys
import app
res = app.device.generate(app.device.request("a red circle", steps=4), "base")
fns = {f.name: f.fn for f in app.demo.fns.values()}  # the UI's own handlers, as gradio calls them
fns["show_preset"]("cache")
exported = next(iter(fns["export_preset"]("cache", 28).values()))  # made by the worker
assert "cache_config:" in open(exported).read() and exported.endswith("cache.cache-dit.yaml"), exported
print("torch loaded:", "torch" in sys.modules, "worker:", app.device.pid, "image:", res.image.shape, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_the_app_process_loads_no_torch_and_leaves_no_worker_behind(random_model_dir, end):
    """The app's process (app.py, imported as a Space does) serves a generation, shows a preset and exports it for
    cache-dit without importing torch; when it exits its worker is stopped, and when it is killed outright its worker
    stops by itself."""
    out = subprocess.run(
        [sys.executable, "-c", APP_SCRIPT, end],
        cwd=ROOT,
        env=_app_env(random_model_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("torch loaded:")]
    assert line, out.stdout + out.stderr[-3000:]
    words = line[0].split()
    assert words[2] == "False" and words[6:] == ["(64,", "64,", "3)"]
    assert out.returncode == (-9 if end == "kill" else 0)
    assert _gone_within(int(words[4]), 15)  # killed: the worker saw its pipe close and stopped


def test_sigterm_to_a_running_app_stops_its_worker(random_model_dir):
    """`python app.py` as a Space runs it; a supervisor stops it with SIGTERM."""
    from gradio_client import Client

    port = _port()
    env = _app_env(random_model_dir, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port))
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                client = Client(f"http://127.0.0.1:{port}/", verbose=False)
                break
            except Exception:  # not listening yet (httpx's connect error, or gradio's while it starts)
                assert time.monotonic() < deadline and proc.poll() is None, "the app did not come up"
                time.sleep(0.5)
        out = client.predict(prompt=PROMPT, preset="base", steps=4, width=64, height=64, api_name="/generate")
        assert np.asarray(Image.open(out[0])).shape[2] == 3
        workers = _children(proc.pid)
        assert len(workers) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert _gone_within(workers[0], 15)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_app_refuses_a_crashed_stack_and_keeps_serving_through_gradio(random_model_dir, tmp_path):
    """The same crash through the app: /generate ends with the sentence, the app still serves the same pixels."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from studio.app.ui import CSS, build_app

    device = WorkerClient(
        WorkerConfig(
            model=random_model_dir,
            device="cpu",
            presets=PresetLibrary(user_dir=tmp_path),
            settings=hooked("crash_on", preset=CRASHES),
        )
    )
    demo = build_app(device, default_preset="cache")
    port = _port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    try:
        c = Client(f"http://127.0.0.1:{port}/", verbose=False)
        kw = dict(prompt=PROMPT, model=random_model_dir, seed=3, steps=10, api_name="/generate")
        before = c.predict(preset="cache", threshold=0.5, **kw)
        with pytest.raises(
            AppError, match=r"the device worker crashed \(SIGSEGV\) while running int8-weight-only on .* refused"
        ):
            c.predict(preset="int8-weight-only", **kw)
        after = c.predict(preset="cache", threshold=0.5, **kw)
        assert np.array_equal(np.asarray(Image.open(after[0])), np.asarray(Image.open(before[0])))
        assert after[-1]["cached_step_indices"] == before[-1]["cached_step_indices"] != []
        with pytest.raises(AppError, match=r"int8-weight-only on .* is refused"):
            c.predict(preset="int8-weight-only", **kw)
        pid = device.pid
    finally:
        demo.close()
        device.close()
    assert _gone_within(pid, 10)


def test_on_zerogpu_the_device_runs_in_the_apps_process(random_model_dir, monkeypatch):
    """ZeroGPU's `spaces` runs each device event in a process it forks: the same facade, no second process."""
    import studio.worker
    from studio.engine.thread import DEVICE_THREAD
    from studio.worker.service import InProcess

    zero = replace(current(), zerogpu=True)  # the settings the edge read on ZeroGPU, handed to the device
    device = studio.worker.start_device(
        WorkerConfig(model=random_model_dir, device="cpu", settings=zero), warm=["base"]
    )
    try:
        assert isinstance(device, InProcess)
        res = _generate(device)
        info = device.info()
        assert info["pid"] == os.getpid() and info["device_thread"] == DEVICE_THREAD._ident
        assert res.metrics.cache.cached_step_indices and res.image.shape == (64, 64, 3)
    finally:
        device.close()
