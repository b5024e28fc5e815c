"""`python -m lab regimes` at the small config on the CPU: every row there, counts equal to the mask, cached steps
cheaper than full ones, peak memory read, PSNR left out with its reason, the Markdown headed by its command."""

from __future__ import annotations

import json

import pytest

from lab.regimes import table as rg
from lab.regimes.report import PSNR_NOTE, cells, markdown

# Timing tests run alone, after the others (the README's test command: pytest -m timing)
pytestmark = pytest.mark.timing

STEPS = 10  # the mask's rule at 10 steps: W4 computed, then 3 cached and 1 computed: 1111 000 1 00
CACHED_AT = [4, 5, 6, 8, 9]
STACKS = (
    "base",
    "sage",
    "int8_weight_only",
    "int8_per_row",
    "float8_per_row",
    "cache",
    "cache+int8",
    "cache+int8+sage",
)
REGIMES = ("resident", "layerwise_offload", "group_offload")
# What may not run on a CPU, by the words its row must give (sage and float8 need CUDA; cache-dit's layerwise offload
# pins host memory, which a CPU-only torch cannot).
MAY_FALL_BACK = {"sage": "sage", "float8_per_row": "float8", "layerwise_offload": "layerwise_offload"}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    d = tmp_path_factory.mktemp("regimes")
    argv = [
        "--config",
        "small",
        "--steps",
        str(STEPS),
        "--device",
        "cpu",
        "--stacks",
        ",".join(STACKS),
        "--regimes",
        ",".join(REGIMES),
        "--out",
        str(d / "r.json"),
        "--md",
        str(d / "r.md"),
    ]
    code = rg.main(argv)
    return code, json.loads((d / "r.json").read_text()), (d / "r.md").read_text()


def _rows(table) -> dict:
    return {(r["stack"], r["regime"]): r for r in table[1]["rows"]}


def test_every_row_has_a_number_or_a_stated_fallback(table):
    code, rep, _ = table
    rows = _rows(table)
    assert code == 0 and list(rows) == [(s, g) for g in REGIMES for s in STACKS]
    for (stack, regime), r in rows.items():
        assert r["error"] is None, (stack, regime, r["error"])
        if r["fell_back"]:
            assert r["ms_per_step"] is None and r["total_s"] is None
            words = [w for k, w in MAY_FALL_BACK.items() if k in stack.split("+") or k == regime]
            assert any(w in r["fell_back"] for w in words), (stack, regime, r["fell_back"])
        else:
            assert r["ms_per_step"] > 0 and r["total_s"] > 0 and len(r["step_ms"]) == STEPS
    for stack in ("base", "int8_weight_only", "int8_per_row", "cache", "cache+int8"):
        assert rows[(stack, "resident")]["ms_per_step"] is not None, stack  # what a CPU runs
    assert rows[("base", "resident")]["speedup"] == 1.0
    assert rep["bench"]["image_tokens"] == 16 and rep["bench"]["cpu_threads"] == 1


def test_counts_are_cache_dits_and_equal_the_mask(table):
    rep = table[1]
    assert "".join(map(str, rep["mask"])) == "1111000100"
    for (stack, _), r in _rows(table).items():
        if r["ms_per_step"] is None:
            continue
        cached = CACHED_AT if "cache" in stack.split("+") else []
        assert r["cached_at"] == cached and r["cached_steps"] == len(cached)
        assert r["full_steps"] == STEPS - len(cached)


def test_a_cached_step_is_cheaper_than_a_full_one(table):
    """Measured in the same run: a cached step runs 1 of 4 blocks. Totals are not compared: on a model this small
    cache-dit's own work on a full call (a few ms on a CPU) eats most of the saving."""
    rows = _rows(table)
    base = rows[("base", "resident")]
    for (stack, regime), r in rows.items():
        if "cache" in stack.split("+") and r["ms_per_step"] is not None:
            assert r["cached_step_ms"] < r["full_step_ms"], (stack, regime)
            # shown with its interval, or withheld with the one rule's sentence (studio.measure.estimate.shown)
            shown = r["speedup"] is not None and r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"]
            assert shown or (r["speedup"] is None and "timing too noisy to show" in r["speedup_note"]), r
    assert rows[("cache", "resident")]["cached_step_ms"] < base["full_step_ms"]


def test_peak_memory_and_bytes_moved(table):
    for (_, regime), r in _rows(table).items():
        if r["ms_per_step"] is None:
            continue
        assert r["peak_memory"]["kind"] == "cpu peak RSS" and r["peak_memory"]["peak_bytes"] > 0
        if regime == "group_offload":
            assert r["h2d"]["h2d_bytes_per_full_step"] > 0 and r["h2d"]["moved"] is False
        elif regime == "resident":
            assert r["h2d"] is None


def test_markdown_starts_with_the_command_and_leaves_psnr_out(table):
    _, rep, md = table
    assert md.startswith("# `python -m lab regimes --config small --steps 10 ")
    assert rep["command"] in md.splitlines()[0]
    assert all(r["psnr"] == "-" for r in rep["rows"]) and PSNR_NOTE in md and "| PSNR ¹ |" in md
    body = [line for line in md.splitlines() if line.startswith("| ") and "stack" not in line]
    assert len(body) == len(STACKS) * len(REGIMES)
    assert any("| fell back |" in line and "fell back: sage:" in line for line in body)


def test_a_count_off_the_mask_is_an_error_row(monkeypatch):
    from studio.engine import cache
    from studio.spec import cachedit

    monkeypatch.setattr(cache, "read_summary", lambda tr: cachedit.CacheDitRecord(cached_steps=[4, 5]))
    row = rg.measure_row(rg.make_bench("small", STEPS, None, "cpu"), rg.parse_stack("cache"), "resident")
    assert row.ms_per_step is None and "not a number" in row.error
    assert cells(row)[2] == "error" and cells(row)[14].startswith("error, lost:")


def test_a_failing_row_costs_that_row_only(monkeypatch):
    from studio.engine.state import stack_state

    bench, loop = rg.make_bench("small", STEPS, None, "cpu"), rg._loop

    def loop_or_oom(tr, inputs, steps, device, dtype):
        if stack_state(tr).step_cache.backend == "cache-dit":
            raise RuntimeError("CUDA out of memory (planted)")
        return loop(tr, inputs, steps, device, dtype)

    monkeypatch.setattr(rg, "_loop", loop_or_oom)
    rep = rg.run_table(bench, rg.plan("base,cache,int8", "resident"), "python -m lab regimes")
    assert [r.stack for r in rep.rows] == ["base", "cache", "int8"]
    assert rep.rows[1].error == "RuntimeError: CUDA out of memory (planted)" and rep.rows[1].ms_per_step is None
    assert rep.rows[0].timed and rep.rows[2].timed  # int8's number is shown, or withheld by the one rule with its why
    assert rep.rows[2].speedup is not None or "timing too noisy to show" in rep.rows[2].speedup_note
    assert markdown(rep).count("| error |") == 1


def test_stacks_parse_and_the_reference_mask():
    s = rg.parse_stack("cache+int8+sage+compile")
    assert (s.quant, s.sage, s.cache, s.compile) == ("auto", True, True, True)
    assert rg.parse_stack("float8_per_row").quant == "float8_per_row" and rg.parse_stack("base").quant is None
    for bad in ("int8+float8_per_row", "base+cache", "fp9", ""):
        with pytest.raises(ValueError, match="--stacks"):
            rg.parse_stack(bad)
    assert [s.name for s, _ in rg.plan("cache,base", "resident")] == ["base", "cache"]
    assert len(rg.plan(None, "resident,layerwise_offload")) == len(rg.RESIDENT_STACKS) + len(rg.OFFLOAD_STACKS)
    with pytest.raises(ValueError, match="--regimes"):
        rg.plan(None, "swap")
    from studio.spec.cachedit import step_mask

    mask = step_mask(rg.cache_spec(40), 40)  # the reference's 13 full / 27 cached, never more than 3 in a row
    assert (sum(mask), len(mask) - sum(mask)) == (13, 27) and "0000" not in "".join(map(str, mask))
    with pytest.raises(ValueError, match="--steps"):
        rg.cache_spec(4)
