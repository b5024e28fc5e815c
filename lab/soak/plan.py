"""`python -m lab soak`: the studio in public mode, driven by honest and hostile visitors for some minutes (this
module: the plan, the app, the tally and the report; lab.soak.visitors drives it).

The soak starts app.py in public mode on a loopback port (its own folder for the studio's files and gradio's cache)
and plays the Space's proxy: every request carries the X-Forwarded-For entry the proxy would write, the visitor's
address, last (STUDIO_PROXY_HOPS=1). Then, for `minutes`:

- V honest visitors pace themselves under the per-visitor rate, each through the three ways a program calls the
  studio in turn: the UI's API (`/generate`, gradio_client), `/images` (gradio_client) and `/v1` (the OpenAI SDK).
  Each should be served; one refused with the rate's sentence while it had asked less than the rate in the last
  60 s was refused by another visitor's limit (a key that is not theirs);
- H hostile visitors go round attacks, each past one limit: a burst over the rate with a new first X-Forwarded-For
  hop on every request (a client's own writing), a crowd sent at once (past the requests a visitor may have waiting
  in the queue), an oversize body, an oversize prompt, steps, a size and a batch
  over the limits, and uploads (writing events) in a loop. An attempt within the limits is served; one past a limit
  must be refused with that limit's sentence (or the rate's, once the visitor spent it).

It reports what each got, the honest requests' wall time (p50, p95), the app's and its worker's resident memory and
the disk the studio's files and gradio's cache use, at the start, after a warm-up and at the end, and every request
lost (a broken connection) or hung (no answer within `timeout_s`). Bounded: loopback only, at most `max_attempts`
requests per visitor, each with its timeout, and the app stopped at the end whatever happened.

The warm-up is one request of each kind (the shapes the honest visitors ask, loaded once), then as many sessions as
the app keeps (`sessions`, STUDIO_SESSIONS), each asking `/headroom` (no device): gradio keeps a copy of the page's
configuration for every session it holds (about 0.3 MiB each, measured with tracemalloc: docs/deploy.md), so a
public app's memory climbs by that until its session store is full, in its first minute of traffic, and then holds.
Memory growth is read from after that ("after warm-up"); the reading after the first requests alone is kept too
("after one request of each kind"), so the store's share is seen.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from studio.spec.checks import check_int

ROOT = Path(__file__).resolve().parents[2]  # the repository: app.py beside studio/
PROMPTS = ("a red circle in the center, blue background", "a green square on the right, white background")
BODY_MB = 16  # STUDIO_MAX_BODY_MB as the soak sets it
API_BODY_KB = 64  # STUDIO_MAX_API_BODY_KB as the soak sets it
KINDS = ("generate", "images", "v1")


@dataclass(frozen=True)
class SoakPlan:
    """What the soak runs, validated on construction (errors name the field and the fix)."""

    minutes: float = 1.0
    visitors: int = 8
    hostile: int = 4
    requests_per_minute: int = 12  # the app's STUDIO_REQUESTS_PER_MINUTE
    writes_per_minute: int = 30  # STUDIO_WRITES_PER_MINUTE
    max_steps: int = 40  # STUDIO_MAX_STEPS
    max_side: int = 128  # STUDIO_MAX_SIDE
    files_mb: int = 64  # STUDIO_MAX_FILES_MB
    cache_mb: int = 256  # STUDIO_MAX_CACHE_MB: gradio's cache in total (uploads, results)
    upload_mb_per_hour: int = 64  # STUDIO_UPLOAD_MB_PER_HOUR
    sessions: int = 64  # STUDIO_SESSIONS (its public default): the sessions whose state the app keeps
    timeout_s: float = 120.0  # a request unanswered this long is hung
    max_attempts: int = 5000  # requests per visitor, at most
    start_s: float = 300.0  # the app must serve its page within this

    def __post_init__(self):
        if not 0.05 <= self.minutes <= 24 * 60:
            raise ValueError(f"soak: minutes={self.minutes!r} is not valid: from 0.05 to 1440")
        check_int("soak", "visitors", self.visitors, 1, 64)
        check_int("soak", "hostile", self.hostile, 0, 64)
        check_int("soak", "requests_per_minute", self.requests_per_minute, 3, 1000)
        check_int("soak", "writes_per_minute", self.writes_per_minute, 1, 1000)
        check_int("soak", "sessions", self.sessions, 1, 10_000)

    def env(self, folder: Path, port: int) -> dict:
        """The app's environment: public mode on loopback, behind one (played) proxy, its files in `folder`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STUDIO_", "GRADIO_", "SPACE"))}
        return env | {
            "STUDIO_PUBLIC": "1",
            "STUDIO_PROXY_HOPS": "1",
            "GRADIO_SERVER_NAME": "127.0.0.1",
            "GRADIO_SERVER_PORT": str(port),
            "GRADIO_TEMP_DIR": str(folder / "gradio"),
            "GRADIO_ANALYTICS_ENABLED": "False",
            "TMPDIR": str(folder / "tmp"),
            "HF_HUB_OFFLINE": "1",
            "STUDIO_LPIPS_FETCH": "0",
            "STUDIO_MAX_BODY_MB": str(BODY_MB),
            "STUDIO_MAX_API_BODY_KB": str(API_BODY_KB),
            "STUDIO_REQUESTS_PER_MINUTE": str(self.requests_per_minute),
            "STUDIO_WRITES_PER_MINUTE": str(self.writes_per_minute),
            "STUDIO_MAX_STEPS": str(self.max_steps),
            "STUDIO_MAX_SIDE": str(self.max_side),
            "STUDIO_MAX_FILES_MB": str(self.files_mb),
            "STUDIO_MAX_CACHE_MB": str(self.cache_mb),
            "STUDIO_UPLOAD_MB_PER_HOUR": str(self.upload_mb_per_hour),
            "STUDIO_SESSIONS": str(self.sessions),
        }


# ----------------------------------------------------------------------------------------------- the app
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """`pid` and every process under it (the device worker, its children), from /proc."""
    parents: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # a process that ended while read
            parents.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, ()))
    return out


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return 0.0  # ended meanwhile
    return 0.0


def _du_mb(folder: Path) -> float:
    total = 0
    for dirpath, _, names in os.walk(folder):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except FileNotFoundError:
                continue  # pruned meanwhile
    return total / 2**20


@dataclass(frozen=True)
class Snapshot:
    """The app's and its worker's resident memory, and the disk of its files, at one moment."""

    when: str
    app_rss_mb: float
    worker_rss_mb: float
    studio_files_mb: float  # the studio's pictures and downloads (app.keep's cap)
    gradio_cache_mb: float  # gradio's cache (bounded by age and by STUDIO_MAX_CACHE_MB)
    presets_mb: float  # visitors' saved presets


class App:
    """app.py in public mode, started in its own folder, stopped at the end."""

    def __init__(self, plan: SoakPlan):
        self.folder = Path(tempfile.mkdtemp(prefix="studio-soak-"))
        (self.folder / "tmp").mkdir()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = self.folder / "app.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "app.py")],
                cwd=ROOT,
                env=plan.env(self.folder, self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, within_s: float) -> None:
        import httpx

        end = time.monotonic() + within_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app stopped with code {self.proc.returncode} (its log: {self.log})")
            try:
                if httpx.get(self.url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet: asked again below
            time.sleep(1.0)
        raise RuntimeError(f"the app did not serve its page within {within_s:.0f} s (its log: {self.log})")

    def snapshot(self, when: str) -> Snapshot:
        pids = _descendants(self.proc.pid)
        studio = [d for d in (self.folder / "tmp").glob("studio-*") if d.is_dir()]
        files = sum(_du_mb(d / sub) for d in studio for sub in ("pictures", "downloads"))
        return Snapshot(
            when,
            _rss_mb(self.proc.pid),
            sum(_rss_mb(p) for p in pids if p != self.proc.pid),
            files,
            _du_mb(self.folder / "gradio"),
            sum(_du_mb(d / "sessions") for d in studio),
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the app exits through Python and stops its worker
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for p in reversed(_descendants(self.proc.pid)):
                    os.kill(p, signal.SIGKILL)
                self.proc.wait(timeout=30)


# ------------------------------------------------------------------------------------------- the outcomes
@dataclass
class Tally:
    """What every request got, by who and what (thread-safe)."""

    counts: dict = field(default_factory=dict)  # (who: honest|hostile, kind, outcome) -> n
    honest_s: list = field(default_factory=list)  # wall seconds of honest requests served
    lost: list = field(default_factory=list)  # "who kind: what" of requests lost or hung
    wrong: list = field(default_factory=list)  # hostile attempts refused with another sentence (or served)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, who: str, kind: str, outcome: str, note: str = "") -> None:
        with self._lock:
            key = (who, kind, outcome)
            self.counts[key] = self.counts.get(key, 0) + 1
            if outcome in ("lost", "hung"):
                self.lost.append(f"{who} {kind}: {outcome} ({note[:200]})")
            elif outcome == "refused otherwise" and len(self.wrong) < 50:
                self.wrong.append(f"{who} {kind}: {note[:300]}")


@dataclass
class SoakReport:
    plan: SoakPlan
    url: str
    log: str
    counts: dict
    lost: list
    wrong: list
    honest_p50_s: float | None
    honest_p95_s: float | None
    snapshots: list
    minutes_run: float

    def total(self, who: str, outcome: str | None = None) -> int:
        return sum(n for (w, _, o), n in self.counts.items() if w == who and (outcome is None or o == outcome))

    def snapshot(self, when: str) -> Snapshot:
        return next(s for s in self.snapshots if s.when == when)

    @property
    def rss_growth(self) -> float:
        """Resident memory (app and worker) at the end over after the warm-up, minus 1."""
        warm, end = self.snapshot("after warm-up"), self.snapshot("end")
        return (end.app_rss_mb + end.worker_rss_mb) / (warm.app_rss_mb + warm.worker_rss_mb) - 1

    def targets(self) -> dict[str, bool]:
        """The issue's targets, each with whether it held."""
        return {
            "every honest request served": self.total("honest") == self.total("honest", "served") > 0,
            "none lost or hung": not self.lost,
            "every hostile attempt past a limit refused with its sentence": self.total("hostile", "refused otherwise")
            == 0,
            "resident memory after the warm-up grew at most 10%": self.rss_growth <= 0.10,
            f"the studio's files within STUDIO_MAX_FILES_MB={self.plan.files_mb} throughout": all(
                s.studio_files_mb <= self.plan.files_mb for s in self.snapshots
            ),
            # gradio's cache is pruned at each upload, never a file younger than its grace (app.keep: 2 minutes):
            # within the cap and what the uploads of the last grace can add
            f"gradio's cache within STUDIO_MAX_CACHE_MB={self.plan.cache_mb} (+ its grace) throughout": all(
                s.gradio_cache_mb <= self.plan.cache_mb + self.grace_mb for s in self.snapshots
            ),
        }

    @property
    def grace_mb(self) -> float:
        """What the hostile visitors' uploads can add to gradio's cache within the keeper's grace (2 minutes): each
        at most its bytes an hour."""
        return self.plan.hostile * float(self.plan.upload_mb_per_hour)

    @property
    def passed(self) -> bool:
        return all(self.targets().values())

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {
            "plan": asdict(self.plan),
            "url": self.url,
            "log": self.log,
            "minutes_run": self.minutes_run,
            "counts": [{"who": w, "kind": k, "outcome": o, "n": n} for (w, k, o), n in sorted(self.counts.items())],
            "honest_p50_s": self.honest_p50_s,
            "honest_p95_s": self.honest_p95_s,
            "rss_growth": self.rss_growth,
            "snapshots": [asdict(s) for s in self.snapshots],
            "lost": self.lost,
            "wrong": self.wrong,
            "targets": self.targets(),
            "passed": self.passed,
        }


def percentile(xs: list, q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
