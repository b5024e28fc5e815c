"""Was the machine quiet? A bench's own check, against the fastest this machine has run the same base.

A speed-up is a ratio taken in one moment, and paired rounds cancel what a moment does to both sides alike. What they
cannot cancel is a busy HOST (a shared VM's neighbours, a throttled or stolen vCPU): measured on a 2-core VM, a bench
whose every base run was 20-26% slower than on a quiet stretch read `cache` at 1.63x (1.54-1.76) and `cache-compile`
at 2.05x (1.91-2.22) against 1.84x and 2.49x quiet, intervals tight and both off (docs/measuring.md). A busy host slows
the overhead-bound work of a cached step (many small operators, each a parallel region that waits for the slowest
thread) more than a full step's matrix products: the speed-up itself is lower in that moment, so no estimator of one
process's runs removes it, and the runs show no stall to see.

So the bench remembers, per machine and request shape, base's floor price per step (studio.measure.estimate's floor,
over base's runs in that bench) in a small JSON file, and calls a bench QUIET when both
- its own base floor is within QUIET_SLACK of the fastest seen there (the host was at its usual pace), and
- base agreed with its own second run in the same rounds within AGREE (the interval's half-width: the moments of
  the rounds were alike; the bench times extra rounds while they do not, studio.bench.rotation), and
- other programs took under CROWDED of the cores it needed (studio.measure.crowding; then its rows are withheld too).
Measured on the 2-core VM (docs/measuring.md, "Was the machine quiet?"): benches that pass both agreed within 8% on
every row with each other; those that did not read 6-14% off. A bench that is not quiet says why, and that its
speed-ups may read off (mostly low, measured). The first bench on a machine has no record to compare with and says
so. A floor over more rounds is a little lower (the fastest of more steps), but base's steps on a quiet machine lie
close together (its fastest and its tenth-percentile step 1.5% apart over 10 recorded rounds), well inside the slack.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from studio.measure.crowding import CROWDED

QUIET_SLACK = 0.08  # base's floor within 8% of the fastest seen here (module doc; docs/measuring.md)
CARD_SLACK = 0.20  # a card's base floor (3 runs) over 20% of the fastest here: its host was slow (docs/measuring.md)
AGREE = 0.03  # base against its own second run within +-3% (the interval's half-width)
DEFAULT_FILE = Path.home() / ".cache" / "dit-speed-studio" / "pace.json"


@dataclass(frozen=True)
class Pace:
    """A bench's base floor against the fastest this machine has run the same (`key`) before."""

    key: str
    floor_ms: float  # this bench's base floor, per step
    best_ms: float | None  # the fastest floor seen here before this bench (None: none recorded)
    seen: int  # benches recorded for this key before this one
    where: str = ""  # the record file
    note: str = ""  # what was lost, where the record could not be read or written
    agree: float | None = None  # base against its own second run: the interval's half-width (None: not timed)
    taken: float | None = None  # what other programs took of the cores it needed (measure.crowding; None: not read)

    @property
    def over(self) -> float | None:
        """How much slower this bench's base ran than the fastest seen (0.19 = 19%); None with nothing to compare."""
        return None if self.best_ms is None else self.floor_ms / self.best_ms - 1.0

    @property
    def quiet(self) -> bool | None:
        """Both checks passed (module doc); False when either failed; None when the pace has no record to compare
        with and base agreed with itself."""
        if self.agree is not None and self.agree > AGREE or self.taken is not None and self.taken >= CROWDED:
            return False
        return None if self.over is None else self.over <= QUIET_SLACK

    def why_busy(self) -> list[str]:
        """What made the bench not quiet, in words ([] when it was, or when that cannot be told)."""
        out = []
        if self.over is not None and self.over > QUIET_SLACK:
            out.append(f"base {self.over * 100:.0f}% over its fastest here, quiet within {QUIET_SLACK * 100:.0f}%")
        if self.agree is not None and self.agree > AGREE:
            out.append(f"base against its own second run ±{self.agree * 100:.1f}%, quiet within ±{AGREE * 100:.0f}%")
        if self.taken is not None and self.taken >= CROWDED:
            out.append(f"other programs took {self.taken * 100:.0f}% of the cores, quiet under {CROWDED * 100:.0f}%")
        return out

    def as_dict(self) -> dict:
        return {**asdict(self), "over": self.over, "quiet": self.quiet, "why_busy": self.why_busy()}


def cpu_name(path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (a pace is a property of the machine; '' where /proc/cpuinfo says none)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux: the key goes without it, and the device name still tells machines apart
        return ""
    return ""


def machine_key(*, device: str, threads: int, model: str, dtype: str) -> str:
    """The machine (CPU, device, threads) with the model and dtype: what two benches must share to be compared."""
    return f"{cpu_name()}|{device}|{threads} threads|{model}|{dtype}"


def pace_key(*, device: str, threads: int, model: str, dtype: str, work: str) -> str:
    """What must match for two benches' base floors to be compared: the machine (`machine_key`), and `work`, what
    one step of the request does (its shape, steps, calls per step)."""
    return f"{machine_key(device=device, threads=threads, model=model, dtype=dtype)}|{work}"


def work_of(request, calls: int) -> str:
    """What one step of `request` (a spec GenerationRequest) does, as the pace key's `work`: its shape, the steps it
    runs, transformer calls a step (2 under true CFG), its LoRAs."""
    q = request
    return f"shape {q.graph_shape}|{q.executed_steps} steps|{calls} calls a step|{len(q.loras)} LoRAs"


def _load(path: Path) -> tuple[dict, str]:
    """The record, and what was lost reading it ('' when nothing)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as e:  # unreadable: this bench starts a new record, and its report says so
        return {}, f"the pace record {path} could not be read ({type(e).__name__}: {e}); a new one was started"
    if not isinstance(data, dict):
        return {}, f"the pace record {path} held no record (a {type(data).__name__}); a new one was started"
    return data, ""


def _write(path: Path, data: dict) -> str:
    """Write the record atomically (two benches at once leave one whole file); what was lost, '' when nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pace-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: the bench is still compared, this floor is not kept for the next
        return f"this bench's floor was not kept ({type(e).__name__}: {e}); set STUDIO_PACE_FILE to a writable path"
    return ""


def record(
    path: str | Path | None, key: str, floor_ms: float, agree: float | None = None, taken: float | None = None
) -> Pace:
    """This bench's `floor_ms` against the record at `path` (None: DEFAULT_FILE), which then keeps the faster;
    `agree`: base against its own second run, the interval's half-width; `taken`: what other programs took of the
    cores (studio.measure.crowding)."""
    p = Path(path) if path else DEFAULT_FILE
    data, lost = _load(p)
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    best, seen = entry.get("best_ms"), int(entry.get("benches", 0))
    best = float(best) if isinstance(best, (int, float)) and best > 0 else None
    data[key] = {"best_ms": floor_ms if best is None else min(best, floor_ms), "benches": seen + 1}
    lost = "; ".join(x for x in (lost, _write(p, data)) if x)
    return Pace(key, floor_ms, best, seen, str(p), lost, agree, taken)


# -- compiled rows, process to process (lab.processes) ------------------------------------------------------
SPREAD_SUFFIX = "|compiled rows, process to process"
SPREAD_KEPT = 20  # measurements kept per machine (the newest)


@dataclass(frozen=True)
class SpreadSeen:
    """What `python -m lab processes` has measured on this machine: how far apart the processes read a compiled row."""

    apart: float  # the largest spread of the quiet measurements (0.05 = 5%); of all of them when none was quiet
    quiet: bool  # whether `apart` comes from measurements on a quiet machine (studio.measure.pace.Pace.quiet)
    measurements: int  # how many `apart` is the largest of
    command: str  # the command of the measurement `apart` comes from
    date: str  # its date (YYYY-MM-DD)

    def as_dict(self) -> dict:
        return asdict(self)


def keep_spread(path: str | Path | None, key: str, apart: float, quiet: bool, command: str, date: str) -> str:
    """Keep one measurement of the compiled rows' process-to-process spread (`key`: `machine_key`) in the record at
    `path` (None: DEFAULT_FILE), the newest SPREAD_KEPT of them; what was lost, '' when nothing."""
    p = Path(path) if path else DEFAULT_FILE
    data, lost = _load(p)
    entries = data.get(key + SPREAD_SUFFIX)
    entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    entries.append({"apart": apart, "quiet": quiet, "command": command, "date": date})
    data[key + SPREAD_SUFFIX] = entries[-SPREAD_KEPT:]
    return "; ".join(x for x in (lost, _write(p, data)) if x)


def spread_seen(path: str | Path | None, key: str) -> SpreadSeen | None:
    """The compiled rows' spread this machine has measured (`keep_spread`), None when it has measured none."""
    data, _lost = _load(Path(path) if path else DEFAULT_FILE)  # unreadable: nothing measured, the bench says so
    entries = data.get(key + SPREAD_SUFFIX)
    ok = [e for e in entries if _spread_entry(e)] if isinstance(entries, list) else []
    if not ok:
        return None
    quiet = [e for e in ok if e["quiet"]]
    pool = quiet or ok
    top = max(pool, key=lambda e: e["apart"])
    return SpreadSeen(float(top["apart"]), bool(quiet), len(pool), str(top["command"]), str(top["date"]))


def _spread_entry(e) -> bool:
    return (
        isinstance(e, dict)
        and isinstance(e.get("apart"), (int, float))
        and e["apart"] >= 0
        and isinstance(e.get("quiet"), bool)
        and all(isinstance(e.get(k), str) for k in ("command", "date"))
    )
