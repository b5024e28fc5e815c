"""bench, sweep, tune and export on the embedded model: the structure of what each command reports, with numbers a
reader can check (base against itself is 1.00 and identical; the ideal speed-up follows from the counts; a tuned
preset meets its floor; exported YAML loads in cache-dit with the same values). No timing is asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from studio.bench.bench import AGAIN, run_bench
from studio.bench.rotation import CROWDED_STOP
from studio.bench.sweep import cliff, run_sweep
from studio.bench.tune import tune
from studio.measure.estimate import price_ms, speedup_over
from studio.measure.quality import psnr
from studio.report.text import bench_markdown, sweep_markdown, tune_summary
from studio.spec.export import cache_dit_dict, cache_dit_yaml
from studio.spec.presets import load_preset, preset_to_yaml
from tests.narrowed import narrow

PROMPTS = ["a red circle in the center, blue background", "an orange triangle on the left, black background"]
ROW_KEYS = {"preset", "denoise_s", "step_ms", "speedup", "psnr_db", "ssim", "full_steps", "cached_steps", "of_ideal"}


@pytest.mark.timing  # the noise floor and the ideal read this run's timings: alone (README)
def test_bench_rows_noise_floor_and_compile_cost(tiny_runner, quiet):
    req = tiny_runner.request(PROMPTS[0], seed=42)
    rep = run_bench(tiny_runner, [req], ["cache", "compile", "cache-compile"], repeats=1)
    rows = {r.preset: r for r in rep.matrix.rows}
    assert list(rows) == ["base", "cache", "compile", "cache-compile"]
    assert rows["base"].speedup == 1.0 and rows["base"].speedup_lo is None and math.isinf(rows["base"].psnr_db)
    c = rows["cache"]
    assert c.cached_steps > 0 and c.cached_steps + c.full_steps == req.steps
    # one round asked for; more only while a speed-up would be withheld, up to 4 (studio.bench.rotation)
    rot = rep.rotations[0]
    assert 1 <= rot.rounds <= 5 and rep.meta["rounds"] == [rot.rounds] and len(rot.times["cache"]) == rot.rounds
    shown = all(r.speedup is not None for r in rows.values())
    done = "every speed-up's interval is within ±10% and base agrees with itself after"
    # (or the watch said other programs hold the cores: more rounds would show nothing)
    stops = (done, CROWDED_STOP) if rot.rounds < 5 else (done, CROWDED_STOP, "at most 4 extra rounds; still")
    assert rot.stop.startswith(stops), rot.stop
    notes = {r.preset: r.speedup_note for r in rows.values()}
    # withheld: by a useless interval after every extra round, or by other programs on the cores (the watch), which
    # then withholds every row alike, whatever the rounds said
    taken = "the machine was busy (other programs took "
    crowded = all(taken in (n or "") for p, n in notes.items() if p != "base")
    assert shown or crowded or rot.stop.startswith(("at most 4 extra rounds; still withheld: ", CROWDED_STOP)), (
        rot.stop,
        notes,
    )
    # on a quiet machine every row shows its speed-up (a bench that always withheld must fail here), unless the watch
    # saw other programs take the cores during it (the machine stopped being quiet: withheld, with that reason). A
    # stall the watch cannot see (the VM's host) can leave one row's interval wide after every extra round, so a row
    # withheld on a quiet machine gets 2 more benches of its own to show its number
    if quiet and not crowded:
        latest = dict(rows)  # (each row's latest bench; the checks below read the first bench's rows)
        for _ in range(2):
            left = [p for p, row in latest.items() if row.speedup is None]
            if not left:
                break
            again = run_bench(tiny_runner, [req], left, repeats=1).matrix.rows
            latest.update({r.preset: r for r in again if r.preset in left})
        assert all(r.speedup is not None for r in latest.values()), {p: r.speedup_note for p, r in latest.items()}
    # the ideal: the counts' speed-up with a cached step priced by this run's block times (studio.measure.blocks)
    m = rep.rotations[0].last["cache"].metrics
    assert m.ideal.ideal_source == "from this run's block times" and 0 < m.ideal.cached_share < 1
    assert m.ideal.ideal_speedup == pytest.approx(req.steps / (c.full_steps + c.cached_steps * m.ideal.cached_share))
    # cache's non-cache twin is base, cache-compile's is compile: each `of ideal` against its twin's time
    assert rep.meta["cache_twins"] == {"cache": "base", "cache-compile": "compile"}
    assert c.of_ideal_against == "base" and rows["cache-compile"].of_ideal_against == "compile"
    for name, ref in (("cache", "base"), ("cache-compile", "compile")):
        r, vs = rows[name], rep.rotations[0].ratio(ref, name)
        if not vs.useless and vs.point <= 1.05 * r.ideal_speedup:
            assert r.of_ideal == pytest.approx(vs.point / r.ideal_speedup)
            assert (r.of_ideal_lo, r.of_ideal_hi) == pytest.approx((vs.lo / r.ideal_speedup, vs.hi / r.ideal_speedup))
        else:  # a busy machine, or a reading over the ideal: no number, and the row says why
            assert r.of_ideal is None
    assert rows["base"].of_ideal is None and rows["compile"].of_ideal is None
    # compile's eager twin is base itself; its PSNR against it is the noise floor of compile
    assert rep.twins == {"compile": "base", "cache-compile": "cache"}
    assert rep.noise.compile_vs_eager_db["compile"] > 30
    assert set(rep.noise.spread) == {"base", "cache", "compile", "cache-compile", AGAIN}
    assert rep.noise.base_vs_itself > 0
    cost = rep.cost[0]
    assert [c.preset for c in rep.cost] == ["compile", "cache-compile"]
    assert cost.preset == "compile" and cost.compile_s > 0 and cost.graphs >= 1
    d = json.loads(json.dumps(rep.as_dict()))  # reloads
    assert ROW_KEYS <= set(d["rows"][0]) and d["device"] == "cpu" and d["dtype"] in ("bfloat16", "float32")
    assert d["presets"]["cache"]["cache_config"]["residual_diff_threshold"] == 0.24
    assert {"torch", "diffusers", "cache-dit", "torchao"} <= set(d["versions"])
    # was the machine quiet: base's floor per step (its runs and its second run's) against this machine's record
    (pace,) = rep.pace
    base_runs = rot.runs["base"] + rot.runs[AGAIN]
    assert pace.floor_ms == pytest.approx(price_ms(base_runs) / req.steps)
    assert pace.floor_ms == pytest.approx(min(t for r in base_runs for t in r.step_ms))  # base: every step full
    assert f"|{req.steps} steps|1 calls a step|0 LoRAs" in pace.key and d["pace"][0]["floor_ms"] == pace.floor_ms
    md = bench_markdown(rep)
    assert "Noise floor" in md and "pays off after" in md and f"- pace: base's floor {pace.floor_ms:.2f} ms" in md
    assert f"| compile | {cost.compile_s:.1f} s | {cost.graphs} | {cost.recompiles} |" in md


def test_vs_raw_gives_the_plain_diffusers_picture(tiny_runner):
    """The studio's base and cache runs draw the same pixels as plain diffusers / plain cache-dit calls."""
    req = tiny_runner.request(PROMPTS[0], seed=42, steps=14)
    rep = run_bench(tiny_runner, [req], ["cache"], repeats=1, vs_raw=True)
    for r in rep.matrix.rows:
        assert math.isinf(r.raw_psnr_db), r.preset
        assert r.studio_over_raw_lo <= r.studio_over_raw <= r.studio_over_raw_hi and r.raw_denoise_s > 0
    assert "studio/raw" in rep.matrix.markdown()
    # the plain runs are read step by step, as the studio's are: every step clocked by the pipeline's callback, and
    # the cached steps cache-dit's own list, the same as the studio's count of the same request
    rot = rep.rotations[0]
    for name in ("base", "cache"):
        plain, studio = rot.raw_runs[name], rot.runs[name]
        assert len(plain) == len(studio) == rot.rounds and all(len(r.step_ms) == 14 for r in plain)
        assert [r.cached for r in plain] == [r.cached for r in studio]
        assert sum(plain[0].step_ms) / 1e3 == pytest.approx(rot.raw_times[name][0], rel=1e-9)
    assert rot.raw_runs["cache"][0].cached  # the cache served steps, so the kinds were told apart
    # base's second run has a plain process of its own: plain base against it is studio/raw's noise floor
    assert len(rot.raw_runs[AGAIN]) == rot.rounds and math.isinf(psnr(rot.raw_images[AGAIN], rot.raw_images["base"]))
    n = rep.noise
    assert n.plain_vs_plain == pytest.approx(speedup_over([(rot.raw_runs["base"], rot.raw_runs[AGAIN])]).point)
    assert n.plain_vs_plain_lo <= n.plain_vs_plain <= n.plain_vs_plain_hi
    assert "- plain base against a second plain process of it (same recipe, same rounds): " in bench_markdown(rep)
    assert json.loads(json.dumps(rep.as_dict()))["noise_floor"]["plain_vs_plain"] == n.plain_vs_plain


def test_cli_bench_over_prompts_json_and_csv(tmp_path):
    """The CLI's bench, in the device worker: `sage` kills it (a real SIGSEGV from the worker's test-only hook), so
    the bench runs again without it and every other row is there, the crash said in the report."""
    from worker_hooks import hook

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two scenes\n" + "\n".join(PROMPTS) + "\n\n")
    csv_path = tmp_path / "bench.csv"
    cmd = [
        sys.executable,
        "-m",
        "studio",
        "bench",
        "--presets",
        "base,cache,sage",
        "--repeats",
        "1",
        "--extra-rounds",  # the crash and the outputs are this test's; the extra rounds are test_honest's
        "0",
        "--prompts",
        str(prompts),
        "--steps",
        "12",
        "--json",
        "--out",
        str(csv_path),
    ]
    env = dict(os.environ, STUDIO_WORKER_HOOK=hook("crash_on", preset="sage"))  # (its worker's instrumentation)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    assert d["prompts"] == PROMPTS
    assert d["crashed"] == {"sage": "SIGSEGV"} and [r["preset"] for r in d["rows"]] == ["base", "cache"]
    assert "sage crashed the device worker (SIGSEGV); the bench runs again without it" in p.stderr
    cache = next(r for r in d["rows"] if r["preset"] == "cache")
    assert cache["prompts"] == 2 and len(cache["cached_by_prompt"]) == 2
    assert cache["worst_psnr_db"] <= cache["mean_psnr_db"] and cache["worst_flip"] >= cache["flip"] > 0
    (paired,) = d["paired"]  # cache, request by request against each prompt's own base
    assert paired["preset"] == "cache" and paired["of"] == 2 and [p["label"] for p in paired["prompts"]] == PROMPTS
    assert paired["wins"] == sum(p["win"] for p in paired["prompts"]) and paired["worst"] in PROMPTS
    assert csv_path.read_text().startswith("preset,tag,denoise_s,step_ms,speedup")
    (pace,) = d["pace"]  # both prompts are one request shape: one record of this machine's pace
    assert pace["floor_ms"] > 0 and "|12 steps|" in pace["key"] and pace["where"] == os.environ["STUDIO_PACE_FILE"]
    assert "Loading pipeline components" not in p.stderr  # the progress bar alone on stderr


def test_cliff_is_the_steepest_drop():
    assert cliff([0.1, 0.2, 0.3], [math.inf, 45.0, 30.0]) == (0.2, 55.0)  # identical counts as 100 dB
    assert cliff([1, 2, 3], [40.0, 39.0, 20.0]) == (3, 19.0)
    assert cliff([1, 2], [30.0, 31.0]) is None


@pytest.mark.timing
def test_sweep_over_the_run_length_cap(tiny_runner):
    req = tiny_runner.request(PROMPTS[0], seed=42)
    res = run_sweep(tiny_runner, [req], "cache", "max_continuous_cached_steps", [1, 3])
    one, three = res.rows()
    assert one.preset == "cache.MC1" and three.preset == "cache.MC3"
    assert 0 < one.cached_steps <= three.cached_steps
    assert "| max_continuous_cached_steps |" in sweep_markdown(res)


def test_tuned_preset_meets_its_floor_and_loads(tiny_runner, tmp_path):
    reqs = [tiny_runner.request(p, seed=42) for p in PROMPTS]
    # the cache's search alone (fewer steps as a finalist: tests/test_fewer.py; every method: tests/test_methods.py)
    space = narrow(fewer_steps=False)
    res = tune(tiny_runner, reqs, 35.0, space=space, max_flip=0.2)
    assert res.worst_db >= 35.0 and res.screened > 0 and res.runs == res.screened + res.timed
    assert res.worst_flip <= 0.2 and all(c.worst_flip <= 0.2 for c in res.candidates)
    # chosen on the worst case of its paired figures, printed with it: one line per prompt after the sentence
    assert res.paired["of"] == 2 and [p["label"] for p in res.paired["prompts"]] == PROMPTS
    lines = tune_summary(res).splitlines()
    (pace,) = res.pace  # the finalists' bench: was the machine quiet? A BUSY one is said after the paired lines
    assert pace.floor_ms > 0 and res.as_dict()["pace"][0]["floor_ms"] == pace.floor_ms
    assert len(lines) == 5 + (pace.quiet is False) and ("the machine was BUSY" in lines[-2]) == (pace.quiet is False)
    # the last line: the tuned stack against base at the step count of its speed-up, on the same prompts
    assert lines[-1].startswith("against base at fewer steps: ") and res.fewer.prompts == 2
    if res.speedup is not None and res.speedup > 1.0:
        assert res.vs_fewer.at.steps == res.fewer.steps_at(res.speedup)
        assert res.vs_fewer.margin_db == pytest.approx(res.worst_db - res.vs_fewer.at.worst_db)
    assert ", worst FLIP " in lines[0] and "(ceiling 0.2)" in lines[0]
    assert lines[1].startswith("paired over 2 prompts, each against its own base: ")
    assert "--max-flip 0.2` on 2 prompts" in res.preset.description
    assert res.preset.cache_config.enabled and res.preset.name == "tuned-35db"
    assert res.prompts == PROMPTS and " over 2 prompts (floor 35), " in tune_summary(res)
    path = tmp_path / "tuned-35db.yaml"
    path.write_text(preset_to_yaml(res.preset))
    loaded = load_preset(path)
    assert loaded.stack == res.preset.stack
    for req in reqs:  # on its own prompts, run again as any preset runs
        assert tiny_runner.generate(req, loaded).metrics.quality.psnr_db >= 35.0


def test_export_loads_in_cache_dit_with_the_same_values(tmp_path):
    import cache_dit

    from studio.spec import PresetLibrary

    lib = PresetLibrary()
    full = lib.get("cache-int8wo-sage-compile")
    ts = replace(
        lib.get("cache"),
        name="ts-mask",
        cache_config=replace(
            lib.get("cache").cache_config, enable_taylorseer=True, taylorseer_order=2, steps_computation_mask="fast"
        ),
    )
    for p in (lib.get("cache"), full, ts):
        path = tmp_path / f"{p.name}.yaml"
        path.write_text(cache_dit_yaml(p, steps=28))
        got = cache_dit.load_configs(str(path))
        cc, want = got["cache_config"], p.cache_config
        for k in ("Fn_compute_blocks", "Bn_compute_blocks", "max_warmup_steps", "max_continuous_cached_steps"):
            assert getattr(cc, k) == getattr(want, k), (p.name, k)
        assert cc.residual_diff_threshold == want.residual_diff_threshold
    got = cache_dit.load_configs(str(tmp_path / "cache-int8wo-sage-compile.yaml"))
    assert got["quantize_config"].quant_type == "int8_weight_only" and got["attention_backend"] == "sage"
    got = cache_dit.load_configs(str(tmp_path / "ts-mask.yaml"))
    assert type(got["calibrator_config"]).__name__ == "TaylorSeerCalibratorConfig"
    assert got["calibrator_config"].taylorseer_order == 2
    assert len(got["cache_config"].steps_computation_mask) == 28
    assert cache_dit_dict(lib.get("base")) == {}


def _rotation_with(cache_steps: list[float], rounds: int):
    """A Rotation of hand-made runs: base's 10 steps at ~100 ms, cache's odd steps cached at `cache_steps` (ms)."""
    from studio.bench.rotation import Rotation
    from studio.measure.estimate import Run

    rot = Rotation(request=None)
    for name in ("base", AGAIN):
        rot.runs[name] = [Run.of([100.0 + i * 0.2 for i in range(10)], []) for _ in range(rounds)]
    cached = [i for i in range(10) if i % 2]
    rot.runs["cache"] = [Run.of([100.0 if i % 2 == 0 else s for i, s in enumerate(cache_steps)], cached)] * rounds
    rot.rounds = rounds
    return rot


@pytest.mark.quick
def test_extra_rounds_run_only_while_a_speed_up_would_be_withheld():
    from studio.bench.rotation import why_stop, withheld

    # cached steps from 90 to 120 ms: the floor says 1.05x, the bootstrap's interval holds 1.00: withheld
    noisy = [0, 95, 0, 120, 0, 90, 0, 118, 0, 112]
    rot = _rotation_with(noisy, rounds=1)
    assert withheld(rot) == ["cache"]
    assert why_stop(rot, repeats=2, extra=4) is None  # the repeats asked for come first
    assert why_stop(rot, repeats=1, extra=4) is None  # then extra rounds while it is withheld...
    rot.rounds = 5
    assert why_stop(rot, repeats=1, extra=4) == "at most 4 extra rounds; still withheld: cache"  # ...up to the cap
    assert why_stop(rot, repeats=1, extra=0) == "at most 0 extra rounds; still withheld: cache"
    # other programs hold the cores: every row is withheld whatever more rounds add, so none is timed
    rot.rounds = 1
    crowded = "other programs hold the cores (more rounds would not show a number)"
    assert why_stop(rot, repeats=1, extra=4, crowded=True) == crowded
    assert why_stop(rot, repeats=2, extra=4, crowded=True) is None  # the rounds asked for still come first
    # cached steps all at 10 ms: 1000 / (5 * 100 + 5 * 10) = 1.82x, a usable interval: no extra round
    fast = _rotation_with([10.0] * 10, rounds=1)
    assert withheld(fast) == []
    done = "every speed-up's interval is within ±10% and base agrees with itself after"
    assert why_stop(fast, repeats=1, extra=4) == f"{done} 1 round (the 1 asked for)"
    fast.rounds = 3
    assert why_stop(fast, repeats=1, extra=4) == f"{done} 3 rounds (2 more than asked)"


@pytest.mark.quick
def test_extra_rounds_run_while_base_disagrees_with_its_second_run():
    """Noisy rounds: every speed-up usable, but base's second slot reads like its first in one round and 15% slower
    in the other (a slow moment): base against itself is 0.87-1.00x, the bench times more rounds, up to the cap,
    and says why it stopped."""
    from studio.bench.rotation import base_disagrees, why_stop
    from studio.measure.estimate import Run
    from studio.measure.pace import AGREE

    rot = _rotation_with([10.0] * 10, rounds=2)
    assert base_disagrees(rot) is None  # identical slots: quiet rounds
    rot.runs[AGAIN][1] = Run.of([115.0 + i * 0.2 for i in range(10)], [])
    shaky = base_disagrees(rot)
    assert shaky == pytest.approx((1 - 100 / 115) / 2, rel=0.05) and shaky > AGREE
    assert why_stop(rot, repeats=2, extra=4) is None
    # the Matrix tab does not tighten: a usable interval ends its rounds (each one is a visitor's wait)
    assert why_stop(rot, repeats=2, extra=4, tighten=False) == (
        "every speed-up's interval is usable after 2 rounds (the 2 asked for)"
    )
    rot.rounds = 6
    assert (
        why_stop(rot, repeats=2, extra=4) == f"at most 4 extra rounds; still base against itself ±{shaky * 100:.1f}%"
    )


@pytest.mark.quick
def test_extra_rounds_run_while_a_shown_speed_up_is_wider_than_ten_percent():
    """cache's cached steps at 10 ms in one round and 40 ms in the other: 1.82x shown, but a draw of the slow round
    alone reads 1000 / (500 + 5 x 40) = 1.43x, so the interval is 1.43-1.82x (±11%): more rounds, up to the cap."""
    from studio.bench.rotation import LOOSE, loose, why_stop, withheld
    from studio.measure.estimate import Run

    rot = _rotation_with([10.0] * 10, rounds=2)
    assert loose(rot) == []
    rot.runs["cache"] = [
        rot.runs["cache"][0],
        Run.of([100.0 if i % 2 == 0 else 40.0 for i in range(10)], [1, 3, 5, 7, 9]),
    ]
    e = rot.ratio("base", "cache")
    assert e.point == pytest.approx(1000 / 550, rel=1e-3) and e.lo == pytest.approx(1000 / 700, rel=1e-3)
    assert withheld(rot) == [] and e.half_width > LOOSE and loose(rot) == ["cache"]
    assert why_stop(rot, repeats=2, extra=4) is None
    assert why_stop(rot, repeats=2, extra=4, tighten=False).startswith("every speed-up's interval is usable after 2")
    rot.rounds = 6
    assert why_stop(rot, repeats=2, extra=4) == "at most 4 extra rounds; still wider than ±10%: cache"


@pytest.mark.quick
def test_vs_raw_is_read_against_two_plain_processes_noise_row_by_row():
    """--vs-raw, accepted as measured (issue 46's decision, option a): each row's studio/raw is said within the noise
    floor of two plain processes measured in the same run, or by how much its interval sits outside it."""
    from studio.bench.bench import NoiseFloor
    from studio.report.table import MatrixRow
    from studio.report.text import raw_verdict

    def row(name, v, lo, hi):
        r = MatrixRow(name, "-", 1.0, 10.0, None, None, None, 0, 28, "good")
        r.studio_over_raw, r.studio_over_raw_lo, r.studio_over_raw_hi = v, lo, hi
        return r

    noise = NoiseFloor(1.0, plain_vs_plain=1.01, plain_vs_plain_lo=0.98, plain_vs_plain_hi=1.02)  # 1.00 +-2%
    rows = [row("base", 1.012, 0.995, 1.03), row("cache", 1.06, 1.045, 1.08), row("int8", None, None, None)]
    assert raw_verdict(rows, noise) == (
        "studio/raw against two plain processes' noise (1.00 ±2.0%): base 1.012 within the noise; "
        "cache 1.060 2.5% outside it"
    )
    assert raw_verdict(rows, NoiseFloor(1.0)) is None  # no --vs-raw
