"""Was the machine quiet? The bench's record of the fastest base this machine has run (studio.measure.pace): what it
keeps, what it says, and what it says when it cannot read or write its file."""

from __future__ import annotations

import json
import os

import pytest

from studio.measure.pace import QUIET_SLACK, Pace, cpu_name, pace_key, record
from studio.report.text import pace_line

pytestmark = pytest.mark.quick

KEY = "cpu|cpu|2 threads|tiny|float32|shape (64, 64, 1, None)|28 steps|1 calls a step|0 LoRAs"


def test_the_record_keeps_the_fastest_and_compares_each_bench_with_the_ones_before(tmp_path):
    f = tmp_path / "pace.json"
    first = record(f, KEY, 14.0)
    assert (first.best_ms, first.seen, first.over, first.quiet) == (None, 0, None, None)
    slow = record(f, KEY, 17.5)  # a busy host: 25% over the fastest seen
    assert (slow.best_ms, slow.seen) == (14.0, 1) and slow.over == pytest.approx(0.25) and slow.quiet is False
    near = record(f, KEY, 14.0 * (1 + QUIET_SLACK) - 1e-9)  # just inside the slack: quiet
    assert near.quiet is True and near.best_ms == 14.0
    faster = record(f, KEY, 13.3)
    assert faster.over == pytest.approx(13.3 / 14.0 - 1) and faster.quiet is True
    assert record(f, KEY, 14.0).best_ms == 13.3  # the faster one was kept
    other = record(f, KEY.replace("28 steps", "14 steps"), 20.0)  # another request shape: its own record
    assert other.best_ms is None
    kept = json.loads(f.read_text())
    assert kept[KEY] == {"best_ms": 13.3, "benches": 5} and len(kept) == 2
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".pace-")]  # no staging file left


def test_an_unreadable_record_is_said_and_replaced_and_an_unwritable_one_is_said(tmp_path):
    f = tmp_path / "pace.json"
    f.write_text("{not json")
    p = record(f, KEY, 14.0)
    assert p.best_ms is None and "could not be read (JSONDecodeError" in p.note and "a new one was started" in p.note
    assert json.loads(f.read_text())[KEY]["best_ms"] == 14.0
    f.write_text("[1, 2]")
    assert "held no record (a list)" in record(f, KEY, 14.0).note
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    p = record(blocked / "pace.json", KEY, 14.0)  # its folder is a file: nothing can be written there
    assert p.best_ms is None and "was not kept" in p.note and "STUDIO_PACE_FILE" in p.note


def test_the_key_names_the_machine_and_the_work_of_a_step():
    key = pace_key(device="cpu", threads=2, model="tiny", dtype="float32", work="shape (64, 64, 1, None)|28 steps")
    assert key.startswith(cpu_name() + "|cpu|2 threads|tiny|float32|")
    assert pace_key(device="cpu", threads=1, model="tiny", dtype="float32", work="x") != pace_key(
        device="cpu", threads=2, model="tiny", dtype="float32", work="x"
    )


def test_the_report_says_quiet_busy_or_first():
    first = pace_line(Pace(KEY, 14.0, None, 0, "/p.json"))
    assert "base's floor 14.00 ms a step; the first bench of this request on this machine, no record" in first
    assert "quiet" not in first and "BUSY" not in first
    quiet = pace_line(Pace(KEY, 14.28, 14.0, 3, "/p.json"))
    assert "+2% against the fastest this machine has run it (14.00 ms, over 3 earlier benches): a quiet machine" in (
        quiet
    )
    busy = pace_line(Pace(KEY, 17.5, 14.0, 1, "/p.json", note="n"))
    said = "+25% against the fastest this machine has run it (14.00 ms, over 1 earlier bench): the machine was BUSY"
    assert said in busy
    assert "run again when it is quiet" in busy and busy.endswith("(record: /p.json); n")
    assert "the machine was BUSY (base 25% over its fastest here, quiet within 8%)" in busy
    # base against its own second run: wider than +-3% is a noisy bench, with a record or without one
    shaky = Pace(KEY, 14.0, 14.0, 2, "/p.json", agree=0.051)
    assert shaky.quiet is False and shaky.why_busy() == ["base against its own second run ±5.1%, quiet within ±3%"]
    assert "+0% against the fastest" in pace_line(shaky) and "the machine was BUSY (base against its own" in (
        pace_line(shaky)
    )
    assert Pace(KEY, 14.0, None, 0, "/p.json", agree=0.08).quiet is False
    assert Pace(KEY, 14.0, None, 0, "/p.json", agree=0.01).quiet is None  # agreed, but no record to compare with
    both = Pace(KEY, 16.0, 14.0, 2, "/p.json", agree=0.04)
    assert len(both.why_busy()) == 2 and both.as_dict()["why_busy"] == both.why_busy()
    assert Pace(KEY, 14.5, 14.0, 2, "/p.json", agree=0.02).quiet is True


def test_the_card_says_a_slow_host_in_words_past_the_slack_only():
    from studio.report.fmt import host_slow

    assert host_slow(None) == "" and host_slow(0.20) == ""
    said = host_slow(0.27)
    assert said.startswith("host slow: base ran 27% over its fastest here (quiet within 20%); ")
    assert said.endswith("a speed-up may read off while it is")
