"""Did other programs take the cores while a speed-up was timed? Read from the kernel's own accounting.

The floor escapes a stall, not a program holding a core throughout, which slows cached and full steps unequally
(docs/measuring.md). So the kernel's busy time less this process's own is what others took of the cores its threads
needed (`taken`); at CROWDED or more the number is withheld. Linux only. The host's share (a VM's steal, a container's
waits for a CPU: its cgroup is read, as its /proc/stat counts other tenants) is only said beside the number."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CROWDED = 0.25  # other programs took 25% or more of the cores this process needed: the speed-up is not read
MIN_SPAN_S = 0.5  # shorter spans are a few kernel ticks: not read
HOST_SAID = 0.05  # the host took 5% or more: said beside the number
STAT = "/proc/stat"
CGROUP = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Crowding:
    """What other programs took of the cores while a timing ran."""

    taken: float | None  # share of the cores this process's threads needed that others took; None: not read
    others: float | None  # other programs' share of every core
    seconds: float
    threads: int
    cores: int
    note: str = ""  # why it was not read
    host: float | None = None  # the host's share of the cores (a VM's steal; a container's waits for a CPU)
    source: str = ""  # what was read (Accounting.name)

    @property
    def crowded(self) -> bool:
        return self.taken is not None and self.taken >= CROWDED

    def words(self) -> str:
        """What the programs took, and the host where it took HOST_SAID or more, in words ('' when not read)."""
        if self.taken is None:
            return ""
        said = (
            f"other programs took {self.taken * 100:.0f}% of the cores its {self.threads} "
            f"thread{'s' if self.threads != 1 else ''} needed over {self.seconds:.1f} s"
        )
        return said + (f"; {self.host_words()}" if self.host_words() else "")

    def host_words(self) -> str:
        """The host's share in words, where it took HOST_SAID or more ('' otherwise)."""
        if self.host is None or self.host < HOST_SAID:
            return ""
        share = f"{self.host * 100:.0f}%"
        if self.source == "/proc/stat":
            return f"the host was slow: its hypervisor gave {share} of the cores' time to other machines"
        return f"the host was slow: this container's tasks waited for a CPU {share} of the time"


@dataclass(frozen=True)
class Reading:
    """One read of an accounting: core-seconds since some origin."""

    busy_s: float  # every program's CPU time (this machine's, or this container's)
    cap_s: float  # the core-seconds there were
    host_s: float  # what the host took (a VM's steal; a container's waits for a CPU, times its cores)


class Accounting:
    """Where other programs' CPU time is read: `read()` a Reading or None, `cores` the cores it counts over, `name`,
    `blind` a sentence where nothing can be read."""

    name, cores, blind = "", 1, ""

    def read(self) -> Reading | None:
        return None


def _ints(path: str) -> list[int]:
    with open(path) as f:
        return [int(x) for x in f.read().split() if x.lstrip("-").isdigit()]


def _keyed(path: str) -> dict[str, int]:
    """`key value` lines (cgroup's cpu.stat) or `some avg10=.. total=N` (a pressure file: `some` -> N)."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
            elif parts and parts[-1].startswith("total="):
                out[parts[0]] = int(parts[-1][6:])
    return out


def _affinity() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class ProcStat(Accounting):
    """A machine's (a VM's) own counters: the first line of /proc/stat."""

    name = "/proc/stat"

    def __init__(self, path: str = STAT, cores: int | None = None):
        self.path, self.cores = path, cores or os.cpu_count() or 1

    def read(self) -> Reading | None:
        try:
            with open(self.path) as f:
                fields = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        except (OSError, ValueError):
            return None
        if len(fields) < 5:
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        steal = fields[7] if len(fields) > 7 else 0
        total = sum(fields)
        return Reading((total - fields[3] - fields[4] - steal) / hz, total / hz, steal / hz)


class Cgroup(Accounting):
    """A container's own counters (cgroup v2, or v1's cpu and cpuacct controllers), over the cores it may use; the
    cap is the wall clock times those cores (the kernel keeps no per-container total)."""

    def __init__(self, folder: str, v1_cpu: str | None = None, clock=time.monotonic):
        self.folder, self.v1_cpu, self.clock = folder, v1_cpu, clock
        self.name = f"cgroup {'v1' if v1_cpu else 'v2'} {folder}"
        self.cores = min(_affinity(), self._quota() or _affinity())

    def _quota(self) -> float | None:
        try:
            if self.v1_cpu is None:
                with open(os.path.join(self.folder, "cpu.max")) as f:
                    quota, period = f.read().split()[:2]
                return None if quota == "max" else max(1, round(int(quota) / int(period)))
            quota = _ints(os.path.join(self.v1_cpu, "cpu.cfs_quota_us"))[0]
            period = _ints(os.path.join(self.v1_cpu, "cpu.cfs_period_us"))[0]
            return None if quota <= 0 else max(1, round(quota / period))
        except (OSError, ValueError, IndexError):
            return None

    def read(self) -> Reading | None:
        now = self.clock()
        try:
            if self.v1_cpu is None:
                busy = _keyed(os.path.join(self.folder, "cpu.stat"))["usage_usec"] / 1e6
                try:  # the time some task of the container waited for a CPU (wall seconds)
                    waited = _keyed(os.path.join(self.folder, "cpu.pressure")).get("some", 0) / 1e6
                except OSError:
                    waited = 0.0  # a kernel without pressure stall information: the host's share reads 0
            else:
                busy = _ints(os.path.join(self.folder, "cpuacct.usage"))[0] / 1e9
                waited = _keyed(os.path.join(self.v1_cpu, "cpu.stat")).get("throttled_time", 0) / 1e9
        except (OSError, ValueError, IndexError, KeyError):
            return None
        return Reading(busy, now * self.cores, waited * self.cores)


def accounting(proc: str = "/proc/self/cgroup", root: str = CGROUP) -> Accounting:
    """This process's accounting: its container's cgroup where it is in one (a cgroup that limits its CPU, or one
    of its own), else the machine's /proc/stat. A container whose counters cannot be read is blind, and says so."""
    try:
        with open(proc) as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return ProcStat()
    v1 = {c: path for _, ctrls, path in lines for c in ctrls.split(",") if ctrls}
    if not v1:  # v2: inside a cgroup of its own (namespaced: it is the root here), or one named from the host's root
        own = next((path for _, ctrls, path in lines if not ctrls), "/")
        for folder in (root, os.path.join(root, own.lstrip("/"))):
            if os.path.exists(os.path.join(folder, "cpu.max")):
                return Cgroup(folder)
    if v1.get("cpuacct", "/") != "/" or v1.get("cpu", "/") != "/":  # v1, inside a container's cgroup
        for acct, cpu in (("cpu,cpuacct", "cpu,cpuacct"), ("cpuacct", "cpu")):
            folder = os.path.join(root, acct)
            if os.path.exists(os.path.join(folder, "cpuacct.usage")):
                return Cgroup(folder, v1_cpu=os.path.join(root, cpu))
        blind = Accounting()
        blind.blind = "inside a container whose CPU accounting cannot be read: its neighbours are not seen"
        return blind
    return ProcStat()


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
    """CPU seconds of a process and its waited-for children; None when it is gone (its time counts as another's)."""
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
    """CPU seconds the timing itself used: this process (every thread), the programs it waited for, compilers and
    torch.compile workers still running under it, and `helpers` (pids working for the timing) with theirs. Any other
    process, this one's other children too (the `busy` command's load), is another program."""
    helpers = list(helpers)
    t = os.times()
    mine = time.process_time() + t.children_user + t.children_system
    return mine + sum(x for x in map(_proc_cpu_s, helpers) if x is not None) + _compiling([os.getpid(), *helpers])


class CoreWatch:
    """`with CoreWatch(threads) as w: ...` then `w.result`: a Crowding over the block (module doc)."""

    def __init__(self, threads: int, cores: int | None = None, path: str | None = None, helpers=None, source=None):
        """`path`: a /proc/stat to read (tests; None: `source`, else `accounting()`); `helpers`: a callable returning
        the pids working for this timing, read at both ends (one started in between counts from its start)."""
        self.helpers = helpers or (lambda: ())
        self.threads = max(1, int(threads))
        self.source = source or (ProcStat(path, cores) if path else accounting())
        self.cores = cores or self.source.cores
        self.result: Crowding | None = None

    def __enter__(self) -> CoreWatch:
        self._stat = self.source.read()
        self._mine = own_cpu_s(self.helpers())
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.result = self.peek()

    def peek(self) -> Crowding:
        """What other programs have taken since the watch began (the result so far)."""
        return self.read(self.source.read(), own_cpu_s(self.helpers()), time.monotonic())

    def read(self, end: Reading | None, mine_end: float, t_end: float) -> Crowding:
        wall = t_end - self._t0
        said = dict(seconds=wall, threads=self.threads, cores=self.cores, source=self.source.name)
        if self.source.blind:
            return Crowding(None, None, note=self.source.blind, **said)
        if self._stat is None or end is None:
            return Crowding(None, None, note=f"{self.source.name or 'the CPU accounting'} could not be read", **said)
        if wall < MIN_SPAN_S:
            return Crowding(None, None, note=f"{wall:.2f} s is too short to read", **said)
        busy = end.busy_s - self._stat.busy_s
        cap = end.cap_s - self._stat.cap_s  # core-seconds the kernel counted (its ticks, not our clock)
        if cap <= 0:
            return Crowding(None, None, note="the kernel counted no time", **said)
        others_s = max(0.0, busy - (mine_end - self._mine))
        others = min(1.0, others_s / cap)
        free = max(0, self.cores - self.threads)  # cores this process's threads leave to others
        taken = max(0.0, others * self.cores - free) / min(self.threads, self.cores)
        host = min(1.0, max(0.0, end.host_s - self._stat.host_s) / cap)
        return Crowding(min(1.0, taken), others, host=host, **said)
