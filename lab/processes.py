"""`python -m lab processes [bench options] --processes N`: each compiled stack timed in N processes, and how far
apart the processes read it.

A compiled stack's speed is a property of the process that compiled it (Inductor's choices, where the code and the
allocator's blocks landed): on the project's 2-core AMD EPYC, processes back to back read the same compiled stack up
to 10% apart under every estimator (docs/measuring.md, "Process to process"), which no pairing inside one process
removes. So a compiled row is not promised one number across processes: the bench measures how far apart they read
and states it under its table (the decision on issue 46; eager rows keep the 10% target).

The first process is the bench itself (its device worker); each further one is a fresh device worker that times base
and the compiled stacks (with their eager twins, as every bench does) over the same requests and repeats. For each
compiled row: its speed-up in each process, shown or withheld by the one rule (studio.measure.estimate.shown, already
applied to the rows), and how far the shown points lie apart (largest / smallest - 1). The largest of those is kept
in this machine's record (studio.measure.pace.keep_spread) with the command that measured it, and every later bench
with a compiled row states it (studio.report.text.process_lines). The bench's options are the studio's
(`python -m studio bench --help`); its table is printed with the readings under it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from studio.measure import pace


@dataclass(frozen=True)
class ProcessReading:
    """One compiled row in each process: its shown speed-up and interval, or why there is none."""

    preset: str
    points: tuple  # per process: the speed-up shown (None: withheld, or the stack crashed that process)
    los: tuple
    his: tuple
    notes: tuple  # per process: why there is no point ('' where there is one)

    @property
    def apart(self) -> float | None:
        """How far apart the shown points lie (0.05 = 5%); None with fewer than two shown."""
        got = [p for p in self.points if p is not None]
        return max(got) / min(got) - 1.0 if len(got) >= 2 else None

    def as_dict(self) -> dict:
        return {**asdict(self), "apart": self.apart}


def compiled_rows(rep) -> list[str]:
    """The bench's compiled stacks: those timed beside an eager twin (studio.bench.twins)."""
    return list(rep.twins)


def readings(reports: list) -> list[ProcessReading]:
    """Each compiled row of the first report, in every report (process) given."""
    out = []
    for name in compiled_rows(reports[0]):
        points, los, his, notes = [], [], [], []
        for rep in reports:
            r = next((r for r in rep.matrix.rows if r.preset == name), None)
            if r is None:
                crashed = rep.crashed.get(name, "no row")
                points.append(None), los.append(None), his.append(None)
                notes.append(f"crashed its process ({crashed})" if name in rep.crashed else crashed)
                continue
            points.append(r.speedup), los.append(r.speedup_lo), his.append(r.speedup_hi)
            notes.append("" if r.speedup is not None else (r.speedup_note or "withheld"))
        out.append(ProcessReading(name, tuple(points), tuple(los), tuple(his), tuple(notes)))
    return out


def quiet(reports: list) -> bool:
    """Whether no process's bench called the machine busy (studio.measure.pace: its pace, agreement, crowding)."""
    return all(p.quiet is not False for rep in reports for p in rep.pace)


def keep(path, reports: list, got: list[ProcessReading], command: str, date: str) -> str:
    """Keep the largest spread of `got` in this machine's record (nothing when no row was shown in two processes);
    what was lost, '' when nothing."""
    spreads = [g.apart for g in got if g.apart is not None]
    if not spreads:
        return ""
    return pace.keep_spread(path, reports[0].meta["machine"], max(spreads), quiet(reports), command, date)


def main(argv=None) -> int:
    """The bench once in a device worker, then each compiled row in N-1 fresh ones; the readings under its table."""
    import argparse
    import datetime
    import shlex
    import sys

    from studio.cli import bench_in, bench_kw, bench_out, device_worker, runner_of
    from studio.cli_args import ask_of_args, parser, read_settings
    from studio.spec import ConfigError

    argv = list(sys.argv[1:] if argv is None else argv)
    own = argparse.ArgumentParser(prog="python -m lab processes", add_help=False)
    own.add_argument("--processes", type=int, default=2, help="processes in all, the bench's own among them")
    known, rest = own.parse_known_args(argv)
    args = parser().parse_args(["bench", *rest])
    if known.processes < 2 or args.in_process:
        raise SystemExit(
            f"error: processes: --processes {known.processes} and --in-process {args.in_process}: two or more "
            "processes, each a fresh device worker (leave out --in-process)"
        )
    settings = read_settings(args)
    runner = runner_of(args, settings)
    try:
        ask = ask_of_args(runner, args)
        requests, kw = list(ask.requests), bench_kw(ask, args)
        names = args.presets.split(",") if args.presets else None
        rep = bench_in(device_worker(args, runner.presets), requests, names, kw)
        compiled = compiled_rows(rep)
        if not compiled:
            print("processes: no compiled stack in this bench, so nothing was timed again", file=sys.stderr)
        else:
            reports = [rep]
            for i in range(2, known.processes + 1):
                again = {**kw, "vs_raw": False}  # the plain-diffusers side is the first process's
                device = device_worker(args, runner.presets)
                reports.append(bench_in(device, requests, compiled, again, desc=f"process {i} of {known.processes}"))
            rep.processes = readings(reports)
            command = "python -m lab processes " + " ".join(shlex.quote(a) for a in argv)
            lost = keep(settings.pace_file, reports, rep.processes, command, str(datetime.date.today()))
            if lost:
                print(f"processes: {lost}", file=sys.stderr)
            rep.process_spread = pace.spread_seen(settings.pace_file, rep.meta["machine"])
        return bench_out(rep, args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        runner.manager.unload()
