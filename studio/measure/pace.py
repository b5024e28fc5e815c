"""Was the machine quiet? A bench's own check, against the fastest this machine has run the same base.
Paired rounds cannot cancel a busy HOST, which slows a cached step more than a full one (docs/measuring.md), so a JSON
file keeps base's fastest floor per machine and request shape; a bench is QUIET when its base floor is within
QUIET_SLACK of it, base agreed with its second run within AGREE, and others took under CROWDED of its cores."""

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
        """Every check passed; False when one failed; None with no record to compare with and base agreeing."""
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
    """What two benches' base floors must share to be compared: `machine_key`, and `work` (what one step does)."""
    return f"{machine_key(device=device, threads=threads, model=model, dtype=dtype)}|{work}"


def work_of(request, calls: int) -> str:
    """What one step of `request` does, as the pace key's `work`; `calls`: transformer calls a step (2: true CFG)."""
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
    """This bench's `floor_ms` against the record at `path` (None: DEFAULT_FILE), which then keeps the faster; `agree`
    and `taken` as Pace reads them."""
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
