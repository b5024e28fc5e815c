"""the native crash (docs/known-crashes.md), each reproduction in a child process so the suite survives it.

torch's CPU kernel for `aten._weight_int8pack_mm` (bfloat16 x int8) walks K in vector steps with aligned loads and no
tail: 16 on an AVX512 build path, 8 on AVX2. A K off that step segfaults (row 1 of x is off alignment). Inductor
hands it torchao's INT8 weight-only matmuls in bfloat16, and the tiny Z-Image's feed_forward.w2 has K = 170.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from worker_hooks import hooked

ROOT = Path(__file__).resolve().parents[1]
CAPABILITY = torch.backends.cpu.get_cpu_capability()  # the ATen kernels this CPU runs: AVX512, AVX2, DEFAULT, ...
K_STEP = {"AVX512": 16, "AVX2": 8}.get(CAPABILITY)
needs_vector_kernel = pytest.mark.skipif(
    K_STEP is None,
    reason=f"ATen runs its {CAPABILITY} kernels here: the crashing vector paths of _weight_int8pack_mm are the x86 "
    "AVX512 and AVX2 ones (the scalar one walks K one by one)",
)


def child(code: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter from the repository root; a crash there is only its own."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def crashed(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode == -signal.SIGSEGV


EAGER_KERNEL = """
    import torch
    K = {k}
    x = torch.randn(2, K, dtype=torch.bfloat16)
    w = torch.randint(-128, 127, (4, K), dtype=torch.int8)
    y = torch._weight_int8pack_mm(x, w, torch.ones(4, dtype=torch.bfloat16))
    ref = x.float() @ w.float().t()
    assert ((y.float() - ref).abs() <= 0.02 * ref.abs().max()).all(), (y, ref)
    print("ok")
"""


@needs_vector_kernel
@pytest.mark.parametrize("k", [170, 168, 176])
def test_int8pack_mm_kernel_crashes_where_k_is_off_its_vector_step(k):
    """The kernel alone, eagerly: 170 crashes on AVX512 and AVX2, 168 on AVX512 only, 176 nowhere."""
    proc = child(EAGER_KERNEL.format(k=k), timeout=120)
    if k % K_STEP:
        assert crashed(proc), (proc.returncode, proc.stderr[-2000:])
    else:
        assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


# The shortest way in from the studio's libraries: one torchao INT8 weight-only Linear under torch.compile, per K.
COMPILED_LINEAR = """
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from studio.engine.int8pack import GUARD, at_risk_layers, compile_options

    for k in {ks}:
        torch.manual_seed(0)
        lin = torch.nn.Linear(k, 64, bias=False).to(torch.bfloat16)
        quantize_(lin, Int8WeightOnlyConfig())
        x = torch.randn(256, k, dtype=torch.bfloat16)
        eager = lin(x)
        before = GUARD.rewritten
        y = torch.compile(lin, **({options}))(x)
        print(json.dumps(dict(k=k, risky=at_risk_layers(torch.nn.Sequential(lin)), rewritten=GUARD.rewritten - before,
                              err=(y.float() - eager.float()).abs().max().item())), flush=True)
"""


def compiled_linear(ks: list[int], guarded: bool) -> subprocess.CompletedProcess:
    options = "dict(options=compile_options())" if guarded else "{}"
    code = "import json\n" + textwrap.dedent(COMPILED_LINEAR).format(ks=ks, options=options)
    # A fresh Inductor cache: a graph found in the cache is not compiled again, so the pass would not run.
    return child(code, env={"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})


@pytest.mark.slow
@needs_vector_kernel
def test_compiled_int8_linear_crashes_and_the_guard_avoids_it_leaving_aligned_ones_alone():
    plain = compiled_linear([170], guarded=False)
    assert crashed(plain), (plain.returncode, plain.stderr[-2000:])

    guarded = compiled_linear([170, 176], guarded=True)  # one child: one import of torch and torchao, two compiles
    assert guarded.returncode == 0, guarded.stderr[-3000:]
    off, aligned = (json.loads(line) for line in guarded.stdout.strip().splitlines()[-2:])
    assert off["k"] == 170 and off["risky"] == ["0"] and off["rewritten"] == 1
    assert off["err"] == 0.0  # lowered as torchao's eager math: the converted weight's matmul, then the scale
    # a K on the kernel's vector step keeps the int8 kernel: nothing at risk, nothing rewritten
    assert aligned["k"] == 176 and aligned["risky"] == [] and aligned["rewritten"] == 0


@pytest.mark.slow
def test_at_risk_layers_of_each_tiny_family():
    """Only the tiny Z-Image has such layers (dim 64: feed-forward width int(64 / 3 * 8) = 170); in float32 none is
    at risk, since Inductor's rewrite is for bfloat16 only. (The real Z-Image, dim 3840, has 10240: aligned.)"""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from studio.engine.int8pack import at_risk_layers
    from studio.tiny.families import FAMILIES, build_family

    found = {}
    for name in FAMILIES:
        tr = build_family(name).transformer.to(torch.bfloat16)
        quantize_(tr, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear))
        found[name] = at_risk_layers(tr)
    assert {k: len(v) for k, v in found.items()} == {"flux": 0, "qwen-image": 0, "sd3": 0, "z-image": 6}
    assert all(n.endswith("feed_forward.w2") for n in found["z-image"])

    tr = build_family("z-image").transformer
    quantize_(tr, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear))
    assert at_risk_layers(tr) == []


@pytest.mark.slow
def test_doctor_row_for_z_image_int8_compile_finishes_in_bfloat16():
    """The studio's own path, as a user first met it (bfloat16 on every CPU, so that the crash's condition holds)."""
    args = "doctor --families z-image --presets cache-int8wo-sage-compile --json"
    code = f"import sys; from studio.cli import main; sys.exit(main({args.split()!r}))"
    proc = child(code, timeout=900, env={"STUDIO_DTYPE": "bfloat16"})
    assert not crashed(proc), proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["rows"]
    compiled = next(line for line in row["engaged"] if line.startswith("compile:"))
    assert "regional" in compiled and "without aten._weight_int8pack_mm" in compiled
    assert "dtype: auto: bfloat16" in " ".join(row["engaged"]) and row["quality"] != "broken"


def test_a_crash_in_the_doctor_costs_its_own_row_not_the_table():
    """Each family runs in the device worker: the preset whose run kills it (a real SIGSEGV, from the worker's
    test-only hook) is a row that says so, the rows before it stand, and the presets after it run in a new worker."""
    from studio.bench.doctor import healthy
    from studio.report.text import doctor_table
    from studio.worker import WorkerClient, WorkerConfig, reruns

    worker, lines = WorkerClient(WorkerConfig(device="cpu", settings=hooked("crash_on", preset="cache")), warm=()), []
    try:
        rows = reruns.doctor(worker, ["flux"], ["base", "cache", "sage"], on_status=lines.append)
        assert worker.restarts == 1
    finally:
        worker.close()
    assert [(r.preset, r.crashed) for r in rows] == [("base", None), ("cache", "SIGSEGV"), ("sage", None)]
    assert rows[0].quality == "identical" and rows[2].quality == "identical" and not healthy(rows)
    assert "the run crashed its process (SIGSEGV)" in rows[1].fallbacks[0]
    assert "flux: cache crashed the device worker (SIGSEGV); the rest in a new one" in lines
    table = doctor_table(rows)
    assert table.count("| flux |") == 3 and "crashed" in table


def _bench_worker(model: str, crash_on: str):
    from studio.worker import WorkerClient, WorkerConfig

    return WorkerClient(WorkerConfig(model=model, device="cpu", settings=hooked("crash_on", preset=crash_on)), warm=())


def test_a_crash_in_the_bench_costs_its_stack_and_the_bench_runs_again_without_it(random_model_dir):
    """The CLI's bench in the device worker: `sage` kills it mid-run; the bench runs again in a new worker without
    it, every other row stands, and the report lists the stack under "Crashed" with how it died."""
    from studio.report.text import bench_markdown
    from studio.worker import reruns

    worker, lines = _bench_worker(random_model_dir, "sage"), []
    try:
        req = worker.request("a red circle in the center, blue background", seed=1, steps=8)
        rep = reruns.bench(worker, [req], ["cache", "sage"], on_status=lines.append, repeats=1)
        assert worker.restarts == 1
    finally:
        worker.close()
    assert rep.crashed == {"sage": "SIGSEGV"} and [r.preset for r in rep.matrix.rows] == ["base", "cache"]
    assert lines == ["sage crashed the device worker (SIGSEGV); the bench runs again without it"]
    assert "- sage: the run crashed its process (SIGSEGV); the bench ran again without it" in bench_markdown(rep)
    assert rep.as_dict()["crashed"] == {"sage": "SIGSEGV"}


def test_a_crash_in_base_ends_the_bench_with_a_sentence(random_model_dir):
    from studio.spec import RunError
    from studio.worker import reruns

    worker = _bench_worker(random_model_dir, "base")
    try:
        req = worker.request("a red circle in the center, blue background", seed=1, steps=8)
        with pytest.raises(RunError, match=r"^base crashed the device worker \(SIGSEGV\); every speed-up is measured"):
            reruns.bench(worker, [req], ["cache"], repeats=1)
        assert worker.restarts == 1  # not run again: nothing could be measured without base
    finally:
        worker.close()
