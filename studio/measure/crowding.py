"""Did other programs take the cores while a speed-up was timed? Read from the kernel's own accounting.

The estimator (studio.measure.estimate) prices each side by its floor, the fastest steps, which a stall of a few
steps cannot lift. A program that holds a core through the whole timing is another matter: measured on a 2-core VM
with `python3 -c "while True: pass"` beside the card's pairing (docs/measuring.md, "Another program on the cores"),
base's floor itself ran 2.2-2.7x its quiet value (no step of 28 escaped), and the card's `cache` read 1.69x to 2.36x
over clicks whose quiet reading was 1.96-2.04x, intervals that missed the quiet point in both directions. A step
cache's cached step (many small operators, each a parallel region waiting for its slowest thread) and a full step's
matrix products are slowed by different amounts, so the speed-up itself moves while the cores are shared.

So a timing on the CPU is watched: over the timed runs, the kernel's count of busy time on every core (/proc/stat) less
this process's own CPU time (every thread, the compilers a cold torch.compile runs for it, and its helpers': a bench's
plain-diffusers workers) is what other programs took. Only what they took from the cores this process's threads needed
counts (`taken`): a second pytest worker on the other core of two, beside a one-thread run, takes nothing from it. At
CROWDED or more the number is withheld and the card says so, whatever the interval says. CROWDED sits between what was
measured: the hog took 36-44% and moved the readings; a headless Chromium drawing the app on the same two cores took
16% in a first click, and its readings of four requests held (3 of 4 intervals holding the same requests' readings
through the API, the fourth 1% short). Linux only: elsewhere (and for spans too short for the kernel's 10 ms ticks)
nothing is read and the estimate stands as it is. A busy HOST (a VM's neighbours) is not seen here: its time is not
another program's in this machine's accounting; the pace record (studio.measure.pace) is what catches that.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CROWDED = 0.25  # other programs took 25% or more of the cores this process needed: the speed-up is not read
MIN_SPAN_S = 0.5  # shorter spans are a few kernel ticks: not read
STAT = "/proc/stat"


@dataclass(frozen=True)
class Crowding:
    """What other programs took of the cores while a timing ran."""

    taken: float | None  # share of the cores this process's threads needed that others took; None: not read
    others: float | None  # other programs' share of every core
    seconds: float
    threads: int
    cores: int
    note: str = ""  # why it was not read

    @property
    def crowded(self) -> bool:
        return self.taken is not None and self.taken >= CROWDED

    def words(self) -> str:
        """What the programs took, in words ('' when not read)."""
        if self.taken is None:
            return ""
        return (
            f"other programs took {self.taken * 100:.0f}% of the cores its {self.threads} "
            f"thread{'s' if self.threads != 1 else ''} needed over {self.seconds:.1f} s"
        )


def _busy_s(path: str) -> tuple[float, float] | None:
    """(seconds of busy time summed over every core, seconds of all time summed over every core) since boot, from the
    first line of /proc/stat; None where there is none (not Linux)."""
    try:
        with open(path) as f:
            fields = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = sum(fields)
    return (total - fields[3] - fields[4]) / hz, total / hz


COMPILERS = frozenset({"cc", "c++", "gcc", "g++", "cc1", "cc1plus", "as", "ld", "collect2", "clang", "clang++"})
COMPILE_WORKER = b"_inductor/compile_worker"  # torch.compile's pool of compile processes (its cmdline)


def _proc_stat(pid: int | str) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) from /proc/PID/stat; None when it is gone (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")  # the command name may hold spaces and parentheses
    return head.partition("(")[2], rest.split()


def _cpu_s(fields: list[str]) -> float:
    """CPU seconds of a process from its stat fields: user + system, its own and its waited-for children's."""
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds of a process and of the children it has waited for (the compilers it ran), from /proc/PID/stat;
    None when it is gone (its time is lost, and counts as another program's)."""
    st = _proc_stat(pid)
    return None if st is None else _cpu_s(st[1])


def _compiling(roots) -> float:
    """CPU seconds of the live processes under `roots` that compile for them: torch.compile's compile workers (and
    what they run) and C/C++ compilers. Waited-for ones are in their parent's own count already."""
    kids: dict[int, list[tuple[int, str, list[str]]]] = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    for p in pids:
        st = _proc_stat(p)
        if st is not None and len(st[1]) > 14:
            kids.setdefault(int(st[1][1]), []).append((int(p), *st))
    total, todo = 0.0, [(r, False) for r in roots]
    while todo:
        pid, inside = todo.pop()
        for child, comm, fields in kids.get(pid, ()):
            ours = inside or comm in COMPILERS or COMPILE_WORKER in _cmdline(child)
            total += _cpu_s(fields) if ours else 0.0  # with its waited-for children (cc1plus under g++)
            todo.append((child, ours))
    return total


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def own_cpu_s(helpers=()) -> float:
    """CPU seconds the timing itself used: this process (every thread), the programs it ran and waited for, the
    compilers and torch.compile workers still running under it, and `helpers`, the pids of processes that work for
    the timing (a bench's plain-diffusers workers), with theirs. Any other process, this one's children too (the
    `busy` command's load is one), is another program. (A cold torch.compile of two presets, its C++ compilers
    counted as other programs, had withheld every row of a bench as "the machine was busy".)"""
    helpers = list(helpers)
    t = os.times()
    mine = time.process_time() + t.children_user + t.children_system
    return mine + sum(x for x in map(_proc_cpu_s, helpers) if x is not None) + _compiling([os.getpid(), *helpers])


class CoreWatch:
    """`with CoreWatch(threads) as w: ...` then `w.result`: a Crowding over the block (module doc)."""

    def __init__(self, threads: int, cores: int | None = None, path: str = STAT, helpers=None):
        """
        Args:
            helpers: a callable returning the pids of processes that work for this timing, read at both ends (one
                started in between counts from its start).
        """
        self.helpers = helpers or (lambda: ())
        self.threads = max(1, int(threads))
        self.cores = cores or os.cpu_count() or 1
        self.path = path
        self.result: Crowding | None = None

    def __enter__(self) -> CoreWatch:
        self._stat = _busy_s(self.path)
        self._mine = own_cpu_s(self.helpers())
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.result = self.peek()

    def peek(self) -> Crowding:
        """What other programs have taken since the watch began (the result so far)."""
        return self.read(_busy_s(self.path), own_cpu_s(self.helpers()), time.monotonic())

    def read(self, stat_end, mine_end: float, t_end: float) -> Crowding:
        wall = t_end - self._t0
        said = dict(seconds=wall, threads=self.threads, cores=self.cores)
        if self._stat is None or stat_end is None:
            return Crowding(None, None, note=f"{self.path} could not be read (not Linux?)", **said)
        if wall < MIN_SPAN_S:
            return Crowding(None, None, note=f"{wall:.2f} s is too short to read", **said)
        busy = stat_end[0] - self._stat[0]
        cap = stat_end[1] - self._stat[1]  # core-seconds the kernel counted (its ticks, not our clock)
        if cap <= 0:
            return Crowding(None, None, note="the kernel counted no time", **said)
        others_s = max(0.0, busy - (mine_end - self._mine))
        others = min(1.0, others_s / cap)
        free = max(0, self.cores - self.threads)  # cores this process's threads leave to others
        taken = max(0.0, others * self.cores - free) / min(self.threads, self.cores)
        return Crowding(min(1.0, taken), others, **said)
