"""`python -m studio bench` in a child process, so a native crash costs one stack's row, not the table (issue 20).

The bench times its stacks round-robin in one process (their ratios are pairs measured at the same moment), so a
stack that kills its process (a segfault in a kernel, an abort, the OOM killer) would take every row with it. The
CLI therefore runs the bench in a child (`python -m studio.bench.contained JOB REPORT`): the child says which stack
each run is on before it starts it, and writes its BenchReport (pickled) when done. When the child dies by a
signal, the stack it was running is recorded as crashed, and a new child runs the bench again without it (its
eager and non-cache twins stay: they ran). The report lists the crashed stacks and how each died. A crash in `base`
ends the bench with that sentence: every speed-up is measured against it.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from studio.spec.errors import RunError, how_it_died
from studio.spec.hosting import child_env
from studio.spec.presets import BASE

CRASH_ENV = "STUDIO_BENCH_CRASH_ON"  # TEST ONLY: a stack's name makes the child kill itself with SIGSEGV there


@dataclass(frozen=True)
class BenchJob:
    """What a child needs to run one bench: run_bench's arguments, and where the runner's parts come from."""

    requests: list
    presets: list[str] | None
    model: str | None
    repeats: int
    device: str | None = None
    presets_dir: str | None = None
    cache_enabled: bool | None = None
    compile_enabled: bool | None = None
    vs_raw: bool = False
    exclude: tuple = field(default=())


def _child(job: BenchJob, progress, on_status) -> tuple[object | None, str | None, str | None]:
    """One child over `job`: (its report or None, how it died or None, the stack it was last running)."""
    with tempfile.TemporaryDirectory(prefix="studio-bench-") as tmp:
        job_file, out_file = Path(tmp) / "job.pkl", Path(tmp) / "report.pkl"
        job_file.write_bytes(pickle.dumps(job))
        cmd = [sys.executable, "-m", "studio.bench.contained", str(job_file), str(out_file)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env())
        last, error = None, None
        for line in proc.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "start":
                last = rest
            elif kind == "tick" and progress:
                done, total, label = rest.split(" ", 2)
                progress(int(done), int(total), label)
            elif kind == "error":
                error = rest
            elif on_status and line.strip():
                on_status(line.strip())
        code = proc.wait()
        if code == 0:
            return pickle.loads(out_file.read_bytes()), None, last
    if code > 0:  # the child ended itself: a refused request, or a Python error whose traceback is above
        raise RunError(error or f"the bench's process failed ({how_it_died(code)}); its traceback is above")
    return None, how_it_died(code), last


def run_contained(job: BenchJob, progress=None, on_status=None):
    """The bench of `job` in child processes (module doc): its BenchReport, `crashed` filled in."""
    crashed: dict[str, str] = {}
    while True:
        rep, died, last = _child(replace(job, exclude=tuple(crashed)), progress, on_status)
        if died is None:
            rep.crashed = crashed
            return rep
        if last is None:
            raise RunError(f"the bench's process died ({died}) while loading, before its first run")
        if last == BASE or last in crashed:
            raise RunError(f"{last} crashed the bench's process ({died}); every speed-up is measured against base")
        crashed[last] = died
        if on_status:
            on_status(f"{last} crashed the bench's process ({died}); the bench runs again without it")


def _main(job_file: str, out_file: str) -> int:
    from studio.bench.bench import run_bench
    from studio.cli_support import quiet_libraries
    from studio.engine import ModelLoadError, ModelManager, Runner
    from studio.spec import ConfigError, PresetLibrary

    quiet_libraries()
    job: BenchJob = pickle.loads(Path(job_file).read_bytes())
    crash_on = os.environ.get(CRASH_ENV, "")

    def started(name: str) -> None:
        print(f"start {name}", flush=True)
        if name == crash_on:
            os.kill(os.getpid(), signal.SIGSEGV)

    def progress(done, total, label) -> None:
        print(f"tick {done} {total} {label}", flush=True)

    runner = Runner(ModelManager(job.device), PresetLibrary(user_dir=job.presets_dir), model=job.model)
    try:
        rep = run_bench(
            runner, job.requests, job.presets, model=job.model, repeats=job.repeats, progress=progress,
            cache_enabled=job.cache_enabled, compile_enabled=job.compile_enabled, vs_raw=job.vs_raw,
            exclude=job.exclude, started=started,
        )  # fmt: skip
    except (ConfigError, ModelLoadError, RunError, ValueError) as e:  # said by the parent as the CLI says it
        print("error " + " ".join(str(e).split()), flush=True)
        return 2
    finally:
        runner.manager.unload()
    Path(out_file).write_bytes(pickle.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2]))
