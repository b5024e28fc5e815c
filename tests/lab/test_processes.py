"""`python -m lab processes` (lab.processes): each compiled stack timed in fresh device workers, how far apart
the processes read it, kept per machine (studio.measure.pace) and stated under every later bench with a compiled
row. No timing is asserted: the readings are compared with each other, as the report computes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from lab.processes import ProcessReading, readings
from studio.measure import pace
from studio.report.text import process_lines

KEY = "Some CPU|cpu|2 threads|tiny|bfloat16"


@pytest.mark.quick
def test_a_reading_is_apart_by_its_shown_points_only():
    r = ProcessReading("cache-compile", (2.40, 2.28, None), (2.2, 2.1, None), (2.6, 2.5, None), ("", "", "withheld"))
    assert r.apart == pytest.approx(2.40 / 2.28 - 1)
    assert ProcessReading("c", (2.4, None), (2.2, None), (2.6, None), ("", "busy")).apart is None
    assert json.loads(json.dumps(r.as_dict()))["apart"] == pytest.approx(0.0526, abs=1e-4)


def _row(preset, speedup, note=None):
    return SimpleNamespace(
        preset=preset,
        speedup=speedup,
        speedup_lo=None if speedup is None else speedup * 0.9,
        speedup_hi=None if speedup is None else speedup * 1.1,
        speedup_note=note,
    )


def _rep(rows, crashed=None):
    return SimpleNamespace(twins={"cache-compile": "cache"}, matrix=SimpleNamespace(rows=rows), crashed=crashed or {})


@pytest.mark.quick
def test_readings_follow_the_first_processes_compiled_rows_and_say_why_one_is_missing():
    first = _rep([_row("base", 1.0), _row("cache", 1.8), _row("cache-compile", 2.4)])
    withheld = _rep([_row("base", 1.0), _row("cache-compile", None, "timing too noisy to show")])
    crashed = _rep([_row("base", 1.0)], crashed={"cache-compile": "SIGSEGV"})
    (g,) = readings([first, withheld, crashed])
    assert g.preset == "cache-compile" and g.points == (2.4, None, None) and g.apart is None
    assert g.notes == ("", "timing too noisy to show", "crashed its process (SIGSEGV)")


@pytest.mark.quick
def test_the_machine_keeps_its_spread_and_states_the_largest_quiet_one(tmp_path):
    path = tmp_path / "pace.json"
    assert pace.spread_seen(path, KEY) is None
    assert pace.keep_spread(path, KEY, 0.031, True, "python -m studio bench --processes 2", "2026-12-05") == ""
    assert pace.keep_spread(path, KEY, 0.20, False, "python -m studio bench --processes 3", "2026-12-05") == ""
    assert (
        pace.keep_spread(path, KEY, 0.072, True, "python -m studio bench --processes 2 --repeats 5", "2026-12-06")
        == ""
    )
    seen = pace.spread_seen(path, KEY)  # the busy 20% is left out while a quiet one exists
    assert (seen.apart, seen.quiet, seen.measurements) == (0.072, True, 2)
    assert seen.command.endswith("--repeats 5") and seen.date == "2026-12-06"
    assert pace.spread_seen(path, KEY.replace("2 threads", "4 threads")) is None  # another machine: not its spread
    data = json.loads(path.read_text())
    data[KEY + pace.SPREAD_SUFFIX].append({"apart": "a lot"})  # a hand-edited entry: read past, never a crash
    path.write_text(json.dumps(data))
    assert pace.spread_seen(path, KEY).measurements == 2
    for _ in range(pace.SPREAD_KEPT + 5):
        pace.keep_spread(path, KEY, 0.01, True, "c", "d")
    assert len(json.loads(path.read_text())[KEY + pace.SPREAD_SUFFIX]) == pace.SPREAD_KEPT


@pytest.mark.quick
def test_a_bench_with_a_compiled_row_states_the_spread_or_the_command_that_measures_it():
    rep = _rep([])
    rep.processes, rep.process_spread = [], None
    (line,) = process_lines(rep)
    assert "this machine has not measured by how much" in line
    assert "`python -m lab processes --presets base,cache-compile` measures it" in line
    rep.process_spread = pace.SpreadSeen(0.072, True, 2, "python -m studio bench --processes 2", "2026-12-06")
    (line,) = process_lines(rep)
    assert "up to 7.2% apart (the largest of 2: `python -m studio bench --processes 2`, 2026-12-06)" in line
    rep.processes = [ProcessReading("cache-compile", (2.4, 2.28), (2.2, 2.1), (2.6, 2.5), ("", ""))]
    first, _ = process_lines(rep)
    assert first.startswith("compiled rows in 2 processes (a fresh worker each): cache-compile 2.40x")
    assert first.endswith("5.3% apart")
    rep.twins = {}
    assert process_lines(rep) == []  # no compiled row: nothing to say


def test_cli_bench_times_a_compiled_stack_in_two_processes(tmp_path):
    """The real stack: `compile` (eager twin base) in the CLI's device worker, then again in a fresh one; the
    spread is kept in this machine's record and stated under the table."""
    record = tmp_path / "pace.json"
    cmd = [sys.executable, "-m", "lab", "processes", "--presets", "compile", "--repeats", "1", "--extra-rounds", "0"]
    cmd += ["--steps", "6", "--processes", "2", "--json"]
    env = dict(os.environ, STUDIO_PACE_FILE=str(record))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    (g,) = d["processes"]
    assert g["preset"] == "compile" and len(g["points"]) == 2
    for point, note in zip(g["points"], g["notes"]):
        assert (point is None) == bool(note), (point, note)  # a reading, or why there is none
    first = next(r for r in d["rows"] if r["preset"] == "compile")
    assert g["points"][0] == first["speedup"]  # the first process is the bench's own table
    shown = [x for x in g["points"] if x is not None]
    if len(shown) == 2:
        assert g["apart"] == pytest.approx(max(shown) / min(shown) - 1)
        kept = json.loads(record.read_text())[d["machine"] + pace.SPREAD_SUFFIX]
        assert [e["apart"] for e in kept] == [g["apart"]] and "--processes 2" in kept[0]["command"]
        assert d["process_spread"]["apart"] == g["apart"]
    else:  # withheld in a process (a busy machine): nothing to keep, and the bench says it has measured none
        assert g["apart"] is None and d["process_spread"] is None


def test_processes_need_a_worker_per_process_and_the_studios_bench_has_no_such_option():
    p = subprocess.run(
        [sys.executable, "-m", "lab", "processes", "--presets", "compile", "--processes", "2", "--in-process"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0 and "each a fresh device worker (leave out --in-process)" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "lab", "processes", "--processes", "1"], capture_output=True, text=True, timeout=300
    )
    assert p.returncode != 0 and "--processes 1" in p.stderr and "two or more" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "studio", "bench", "--processes", "2"], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 2 and "unrecognized arguments: --processes 2" in p.stderr  # the lab's, not the product's
