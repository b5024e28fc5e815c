"""The per-request switches (cache on/off, threshold, compile) do what they say wherever they are offered:
each entry point's run on the embedded model shows the switch in what ran: the cached steps, the tag and engaged
lines, the threshold cache-dit read back, the graphs torch.compile built. A switch a command cannot honour is refused
with a sentence, not ignored."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import plain_ui

from studio.cli import main
from tests.narrowed import narrow

PROMPT = "a red circle in the center, blue background"
STEPS = 8
SMALL = ["--prompt", PROMPT, "--steps", str(STEPS)]


def _graphs() -> int:
    """Graphs torch.compile has built in this process so far (dynamo's own count)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _cli_json(capsys, *argv: str) -> dict:
    assert main([*argv, *SMALL, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _refused(capsys, *argv: str) -> str:
    assert main([*argv, *SMALL]) == 2
    return capsys.readouterr().err


# bench ------------------------------------------------------------------------------------------------------------
def test_bench_cache_off_runs_no_cache(capsys):
    """The CLI's bench as it runs by default (its stacks in a process of their own). No extra rounds: an uncached
    `cache` times as base, a speed-up the rounds would withhold however many (what they do: tests/test_honest.py)."""
    d = _cli_json(capsys, "bench", "--presets", "cache", "--cache", "false", "--repeats", "1", "--extra-rounds", "0")
    rows = {r["preset"]: r for r in d["rows"]}
    assert list(rows) == ["base", "cache.override"]
    off = rows["cache.override"]
    assert off["cached_steps"] == 0 and off["full_steps"] == STEPS and "DBCache" not in off["tag"]
    assert d["presets"]["cache.override"]["cache_config"]["backend"] == "none"


# sweep ------------------------------------------------------------------------------------------------------------
def _one_prompt(tmp_path) -> list[str]:
    """--prompts with one prompt (a sweep's default is every example prompt of the model's profile)."""
    path = tmp_path / "prompts.txt"
    path.write_text(PROMPT + "\n")
    return ["--prompts", str(path)]


def test_sweep_compile_off_runs_every_value_eager_and_cache_off_is_refused(capsys, tmp_path):
    g0 = _graphs()
    argv = ["sweep", "--preset", "cache-compile", "--compile", "false", "--values", "0.24,0.5", *_one_prompt(tmp_path)]
    d = _cli_json(capsys, *argv)
    assert _graphs() == g0  # nothing compiled
    values = [r for r in d["rows"] if r["preset"] != "base"]
    assert [r["preset"] for r in values] == ["cache-compile.override.R0.24", "cache-compile.override.R0.5"]
    for r, t in zip(values, ("R0.24", "R0.5")):
        assert "compile" not in r["tag"] and t in r["tag"] and r["compile_s"] is None
    assert not any(p["compile"]["enabled"] for p in d["presets"].values())
    assert sum(r["cached_steps"] for r in values) > 0  # the cache stayed on
    err = _refused(capsys, "sweep", "--cache", "false", "--values", "0.24")
    assert "sweep.cache=False is not valid: a sweep varies a step-cache knob" in err


@pytest.mark.slow  # torch.compile on a CPU: the one compiled run of this file
def test_sweep_compile_on_compiles_every_value(capsys, tmp_path):
    g0 = _graphs()
    argv = ["sweep", "--preset", "cache", "--compile", "true", "--values", "0.24", *_one_prompt(tmp_path)]
    d = _cli_json(capsys, *argv)
    assert _graphs() > g0
    rows = {r["preset"]: r for r in d["rows"]}
    r = rows["cache.override.R0.24"]
    assert r["tag"].endswith("+compile") and "R0.24" in r["tag"] and r["compile_s"] > 0
    assert d["eager_twins"] == {"cache.override.R0.24": "cache.override.R0.24-eager"}  # timed beside it, as in bench


# tune -------------------------------------------------------------------------------------------------------------
def test_tune_compile_off_keeps_every_option_eager_and_cache_off_is_refused(tiny_runner, capsys):
    from studio.bench.tune import tune
    from studio.spec import ConfigError

    reqs = [tiny_runner.request(PROMPT, seed=42, steps=STEPS)]
    space = narrow(thresholds=(0.24, 0.5), warmups=(2,), non_cache=("base", "compile"), fewer_steps=False)
    said = []
    g0 = _graphs()
    res = tune(tiny_runner, reqs, 25.0, space=space, compile_enabled=False, progress=said.append)
    assert _graphs() == g0  # `compile` switched off is `base` (timed once, as base), and the result runs eagerly
    assert said[0] == "timing the non-cache options: base"
    assert res.non_cache == "base" and not res.preset.compile.enabled and "compile" not in res.preset.tag()
    assert res.preset.cache_config.enabled and res.worst_db >= 25.0
    with pytest.raises(ConfigError, match=r"tune.cache=False is not valid: the tuner searches the step cache"):
        tune(tiny_runner, reqs, 25.0, space=space, cache_enabled=False)
    assert "tune.cache=False is not valid" in _refused(capsys, "tune", "--min-psnr", "30", "--cache", "false")


# the Matrix (the app's handler, on the device the app uses on ZeroGPU: the engine in this process) ----------------
def _matrix(tiny_runner, **switches) -> dict:
    from studio.app.handlers import Handlers, Studio
    from studio.worker.service import InProcess

    h = Handlers(Studio(InProcess(tiny_runner), [tiny_runner.model], tiny_runner.presets), plain_ui())
    request = dict(prompt=PROMPT, model=None, seed=42, steps=STEPS, width=64, height=64, guidance=None)
    out = h.matrix(
        progress=lambda *a, **k: 0, history=None, **request, presets=["base", "cache", "sage"], repeats=1, **switches
    )
    return {r["preset"]: r for r in out["mx.json"]} | {"runs": out["mx.runs"]}


def test_matrix_on_zerogpu_times_only_the_rounds_its_gpu_time_was_reserved_for(tiny_runner):
    # app.gpu_time.matrix_s reserves (presets + 1) x repeats runs: no extra rounds. The engine reads the setting it
    # was handed (the model manager's record), so the ZeroGPU record is handed to it here; the process's record
    # (`using`) alone does not reach it, and the rounds would then follow how noisy this machine is.
    settings = tiny_runner.manager.settings
    tiny_runner.manager.settings = replace(settings, zerogpu=True)
    try:
        rows = _matrix(tiny_runner, cache="unset", threshold=None, compile="false")
    finally:
        tiny_runner.manager.settings = settings
    assert {n: r["timed_pairs"] for n, r in rows.items() if n not in ("runs", "base")} == {
        "cache": 1,
        "sage": 1,
        "base (again)": 1,
    }


def test_matrix_threshold_reaches_cache_dit_and_cache_off_caches_nothing(tiny_runner):
    on = _matrix(tiny_runner, cache="unset", threshold=0.5, compile="false")
    assert on["runs"]["cache.override"]["cache_threshold"] == 0.5  # what cache-dit read back, not what was asked
    assert "R0.5" in on["cache.override"]["tag"] and on["cache.override"]["cached_steps"] > 0
    assert "sage" in on and on["runs"]["sage"]["cache_threshold"] is None  # no cache: the threshold changes nothing
    assert [n for n in on if n != "runs"] == ["base", "cache.override", "sage", "base (again)"]
    off = _matrix(tiny_runner, cache="false", threshold=0.5, compile="unset")
    row = off["cache.override"]
    assert row["cached_steps"] == 0 and row["full_steps"] == STEPS and "DBCache" not in row["tag"]
    assert off["runs"]["cache.override"]["cache_threshold"] is None


@pytest.mark.quick
def test_the_tuner_times_each_non_cache_option_once_as_it_runs_here():
    """`sage` where SageAttention cannot run (a CPU) runs base's stack: the tuner times it once, as shipped first."""
    from studio.bench.tune import _switched, runs_here
    from studio.engine import ModelManager
    from studio.spec import PresetLibrary
    from studio.spec.settings import current

    lib, manager = PresetLibrary(), ModelManager("cpu", settings=current())
    options = _switched(lib, ["base", "sage", "int8", "sage-int8"], None, runs_here(manager))
    assert list(options) == ["base", "int8"]  # sage and sage-int8 run SDPA here: the same stacks
    assert list(_switched(lib, ["base", "sage"], None)) == ["base", "sage"]  # as asked, they differ
