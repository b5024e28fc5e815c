"""Other programs on the cores (studio.measure.crowding): the kernel's accounting read over a span, what they took of
the cores this process's threads needed, and the card that withholds its number then."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from studio.measure.crowding import CROWDED, MIN_SPAN_S, Cgroup, CoreWatch, Crowding, ProcStat, Reading, accounting
from studio.measure.estimate import Estimate
from tests.switched import stack

HOG = "while True: pass"


def _watch_read(threads, cores, busy_s, cap_s, mine_s, wall_s):
    """A watch over made-up readings: the kernel counted `busy_s` busy core-seconds of `cap_s`, this process used
    `mine_s` of them, over `wall_s`."""
    w = CoreWatch(threads, cores=cores, path="/nonexistent")
    w._stat, w._mine, w._t0 = Reading(100.0, 1000.0, 0.0), 50.0, 0.0
    return w.read(Reading(100.0 + busy_s, 1000.0 + cap_s, 0.0), 50.0 + mine_s, wall_s)


@pytest.mark.quick
def test_what_others_took_is_the_kernels_busy_time_less_this_processs_own():
    # 2 cores, 10 s: 20 core-seconds; this process's 2 threads used 13 of them, the kernel counted 20 busy: others 7
    c = _watch_read(threads=2, cores=2, busy_s=20.0, cap_s=20.0, mine_s=13.0, wall_s=10.0)
    assert c.others == pytest.approx(7 / 20) and c.taken == pytest.approx(0.35) and c.crowded
    assert c.words() == "other programs took 35% of the cores its 2 threads needed over 10.0 s"
    # quiet: others used 0.4 core-seconds of 20 (2%)
    q = _watch_read(threads=2, cores=2, busy_s=19.9, cap_s=20.0, mine_s=19.5, wall_s=10.0)
    assert q.taken == pytest.approx(0.02) and not q.crowded


@pytest.mark.quick
def test_a_program_on_a_core_this_process_does_not_need_takes_nothing_from_it():
    # one thread on 2 cores (a pytest-xdist worker): another worker on the other core is half of all, none of ours
    c = _watch_read(threads=1, cores=2, busy_s=20.0, cap_s=20.0, mine_s=10.0, wall_s=10.0)
    assert c.others == pytest.approx(0.5) and c.taken == pytest.approx(0.0) and not c.crowded
    # a third program beside the two: 1.3 cores of others, 0.3 of them the core this thread needed
    c = _watch_read(threads=1, cores=2, busy_s=20.0, cap_s=20.0, mine_s=7.0, wall_s=10.0)
    assert c.taken == pytest.approx(0.3) and c.crowded


@pytest.mark.quick
def test_nothing_is_read_where_the_kernel_says_nothing_or_the_span_is_a_few_ticks():
    w = CoreWatch(2, cores=2, path="/nonexistent")
    with w:
        pass
    assert w.result.taken is None and "could not be read" in w.result.note and not w.result.crowded
    short = _watch_read(threads=2, cores=2, busy_s=0.4, cap_s=0.4, mine_s=0.1, wall_s=0.2)
    assert short.taken is None and "too short" in short.note


@pytest.mark.quick
def test_a_crowded_estimate_is_withheld_whatever_its_interval_and_says_what_took_the_cores():
    tight = Estimate(1.9, 1.85, 1.95, 3)
    assert not tight.useless and tight.why_not() is None
    words = Crowding(0.36, 0.36, 31.0, 2, 2).words()
    crowded = Estimate(1.9, 1.85, 1.95, 3, crowded=words)
    assert crowded.useless
    assert crowded.why_not().startswith("timing too noisy to show: the machine was busy (other programs took 36%")
    assert "a quieter machine would help" in crowded.why_not()
    assert not Estimate(1.0, 1.0, 1.0, 3, exact=True, crowded=words).useless  # base against itself: no reading


def _stat_line(user, system, idle, steal) -> str:
    return f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 ...\n"


@pytest.mark.quick
def test_a_vms_steal_is_the_hosts_share_said_apart_and_never_counted_as_other_programs(tmp_path):
    """/proc/stat's steal column is time the hypervisor gave this machine's cores to other machines: said as "the
    host was slow", not as other programs (it used to be counted with them, and withheld numbers for it)."""
    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(_stat_line(0, 0, 0, 0))
    w = CoreWatch(2, cores=2, path=str(stat))
    w.__enter__()
    # 10 s on 2 cores (20 core-seconds): this process ran 13 of them, the hypervisor took 6, 1 was idle
    stat.write_text(_stat_line(13 * hz, 0, 1 * hz, 6 * hz))
    w._t0 -= 10
    c = w.read(w.source.read(), w._mine + 13.0, w._t0 + 10)
    assert c.others == pytest.approx(0.0) and c.taken == pytest.approx(0.0) and not c.crowded
    assert c.host == pytest.approx(0.3) and c.source == "/proc/stat"
    assert c.words() == (
        "other programs took 0% of the cores its 2 threads needed over 10.0 s; the host was slow: its hypervisor "
        "gave 30% of the cores' time to other machines"
    )
    # another program's 7 core-seconds beside 2 of steal: its share alone is taken
    stat.write_text(_stat_line(20 * hz, 0, 0, 2 * hz))
    c = w.read(w.source.read(), w._mine + 13.0, w._t0 + 10)
    assert c.others == pytest.approx(7 / 22) and c.host == pytest.approx(2 / 22)


def _cgroup_v2(folder, usage_s: float, waited_s: float, quota: str = "200000 100000") -> None:
    folder.mkdir(exist_ok=True)
    (folder / "cpu.max").write_text(quota + "\n")
    (folder / "cpu.stat").write_text(f"usage_usec {int(usage_s * 1e6)}\nuser_usec 0\nsystem_usec 0\n")
    total = int(waited_s * 1e6)
    (folder / "cpu.pressure").write_text(
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )


@pytest.mark.quick
def test_inside_a_container_its_own_cgroup_is_read_not_the_hosts_counters(tmp_path):
    """In a container /proc/stat and the core count are the host's (other tenants' work in them): the container's
    cgroup is read instead, its CPU time over the cores its quota gives, and its tasks' waits for a CPU as the host's
    share. One whose counters cannot be read says so, and reads nothing."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    root = tmp_path / "fs"
    _cgroup_v2(root, 100.0, 5.0, quota="200000 100000")  # a quota of 2 cores
    clock = [1000.0]
    src = accounting(str(proc), str(root))
    assert isinstance(src, Cgroup) and src.name.startswith("cgroup v2") and src.cores == min(2, src.cores)
    src.clock = lambda: clock[0]
    src.cores = 2  # (the quota's, whatever this machine's CPUs are)
    w = CoreWatch(2, source=src)
    w.__enter__()
    # 10 s: the container ran 19 core-seconds, this process 13 of them (another program in the container: 6 of 20),
    # and its tasks waited 3 s for a CPU (the host's neighbours)
    clock[0] += 10
    _cgroup_v2(root, 119.0, 8.0)
    c = w.read(src.read(), w._mine + 13.0, w._t0 + 10)
    assert c.others == pytest.approx(0.3) and c.taken == pytest.approx(0.3) and c.crowded
    assert c.host == pytest.approx(0.3) and "this container's tasks waited for a CPU 30% of the time" in c.words()
    # v2 named from the host's root; no quota: the CPUs this process may run on
    proc.write_text("0::/kubepods/pod1\n")
    _cgroup_v2(root / "kubepods", 0, 0)
    (root / "cpu.max").unlink()
    _cgroup_v2(root / "kubepods" / "pod1", 0, 0, quota="max 100000")
    src = accounting(str(proc), str(root))
    assert isinstance(src, Cgroup) and src.folder.endswith("pod1") and src.cores == len(os.sched_getaffinity(0))
    # v1 without readable counters: blind, and said
    proc.write_text("3:cpu,cpuacct:/docker/abc\n2:memory:/docker/abc\n")
    blind = accounting(str(proc), str(tmp_path / "nothing"))
    with CoreWatch(1, source=blind) as w:
        pass
    assert w.result.taken is None and "its neighbours are not seen" in w.result.note
    # a machine's own: /proc/stat
    proc.write_text("1:cpu:/\n0::/\n")
    assert isinstance(accounting(str(proc), str(tmp_path / "nothing")), ProcStat)


def _hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def _stop(hogs) -> None:
    for h in hogs:
        h.kill()
        h.wait(timeout=30)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.timing
def test_the_kernel_sees_programs_that_hold_the_cores_and_this_process_alone_is_quiet(quiet):
    import os

    cores = os.cpu_count() or 1
    hogs = _hogs(cores + 1)  # more than the cores: every core is shared with this process's one spinning thread
    try:
        time.sleep(0.3)
        with CoreWatch(1) as w:
            _spin(2.0)
    finally:
        _stop(hogs)
    assert w.result.taken is not None and w.result.taken >= CROWDED, w.result
    hogs = _hogs(cores)  # the same programs working for the timing (a bench's plain workers): its own time
    try:
        with CoreWatch(1, helpers=lambda: [h.pid for h in hogs]) as helped:
            _spin(2.0)
    finally:
        _stop(hogs)
    assert helped.result.taken is not None and helped.result.taken < CROWDED, helped.result
    if not quiet:
        pytest.skip("the machine is busy: the quiet half needs a quiet machine")
    with CoreWatch(1) as alone:
        _spin(2.0)
    assert alone.result.taken < CROWDED, alone.result


@pytest.mark.timing
def test_the_compilers_a_timing_runs_are_its_own_work_and_any_other_child_is_another_program(quiet):
    """A cold torch.compile runs C++ compilers as children (or through a pool of compile workers): the timing's own
    work, which had withheld every row of a bench as "the machine was busy". Another child is another program."""
    import os

    if not quiet:
        pytest.skip("the machine is busy: what others took would not be this test's children alone")
    cores = os.cpu_count() or 1
    with CoreWatch(cores) as ran:  # a child run and waited for inside the span (as torch.compile runs g++)
        subprocess.run(
            [sys.executable, "-c", "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"]
        )
    assert ran.result.taken is not None and ran.result.taken < CROWDED / 2, ran.result

    def spun(*marker: str) -> Crowding:
        kids = [subprocess.Popen([sys.executable, "-c", HOG, *marker]) for _ in range(cores)]
        try:
            time.sleep(0.2)
            with CoreWatch(cores) as w:  # this process sleeps: only its children hold the cores
                time.sleep(1.5)
        finally:
            _stop(kids)
        return w.result

    # live compile workers (torch's pool: its command line names torch/_inductor/compile_worker): the timing's own
    worker = spun("/torch/_inductor/compile_worker/__main__.py")
    assert worker.taken is not None and worker.taken < CROWDED / 2, worker
    other = spun()  # the same spinning children, not compiling: another program's (the `busy` command's load)
    assert other.taken is not None and other.taken >= 0.75, other


@pytest.mark.timing
def test_the_card_withholds_its_number_while_programs_hold_the_cores_and_keeps_no_timing_of_then(runner, quiet):
    import os
    from dataclasses import replace

    from studio.engine.baseline import BaseStore, Kept, Pairing
    from studio.report.card import metrics_card
    from studio.spec import GenerationRequest

    runner.pairing = Pairing()  # the app's: 3 pairs while base is cheap
    r = GenerationRequest(prompt="a blue square", seed=5, steps=20, width=64, height=64, max_sequence_length=32)
    # the watch reads spans over MIN_SPAN_S: the steps are set so that one quiet pair's denoising alone (base and
    # stack) takes twice that here, and the first pair beside the programs is read on a fast machine too (a CI run
    # on one timed 3 pairs before the watch could read any). The probe also loads and warms up, which are not watched.
    probe = runner.generate(replace(r, prompt="a probe"), stack(runner, "cache", threshold=0.5)).metrics.timing
    pair_s = probe.denoise_s + probe.base_denoise_s
    r = replace(r, steps=max(r.steps, min(200, math.ceil(r.steps * 2 * MIN_SPAN_S / pair_s))))
    runner.keep(Kept(BaseStore(), BaseStore(), BaseStore()))  # nothing of the probe's is kept
    hogs = _hogs(os.cpu_count() or 1)
    try:
        m = runner.generate(r, stack(runner, "cache", threshold=0.5)).metrics  # the load and warm-up are not watched
    finally:
        _stop(hogs)
    assert m.timing.cores_taken is not None and m.timing.cores_taken >= CROWDED, m.timing.cores_taken
    assert m.timing.speedup is None and m.timing.speedup_lo is None
    assert m.timing.speedup_note.startswith("timing too noisy to show: the machine was busy (other programs took ")
    # the pairing stopped once the watch said so, before the 3 pairs a cheap base gets: more would show nothing
    assert m.timing.pairs_stop == "other programs hold the cores (more pairs would not show a number)", (
        m.timing.pairs_stop
    )
    assert m.timing.timed_pairs < 3, m.timing.timed_pairs
    assert "the machine was busy" in metrics_card(m)
    # its base picture is kept (PSNR above was against it); its timing divides nothing later: compare `auto` on
    # another prompt of the shape finds no shape timing and times base beside the run
    assert len(runner.bases) == 1 and len(runner.shapes) == 0
    later = runner.generate(
        replace(r, prompt="a blue square, again"), stack(runner, "cache", threshold=0.5), compare="auto"
    )
    assert (
        later.metrics.timing.timed_pairs >= 3
        and "base timed warm right before, in this call" in later.metrics.timing.how
    )

    # once the programs are gone the number comes back. A stall the watch cannot see (the VM's host) can widen one
    # call's interval, so a quiet machine gets 3 calls to show one: a studio that always withheld it still fails
    def withheld_while_quiet(t) -> bool:
        return t.speedup is None and quiet and t.cores_taken is not None and t.cores_taken < CROWDED

    calls = [later.metrics.timing]
    while withheld_while_quiet(calls[-1]):
        assert len(calls) < 3, f"no speed-up in 3 calls on a quiet machine: {[t.speedup_note for t in calls]}"
        prompt = f"a blue square, call {len(calls) + 1}"
        again = runner.generate(replace(r, prompt=prompt), stack(runner, "cache", threshold=0.5), compare="auto")
        calls.append(again.metrics.timing)
