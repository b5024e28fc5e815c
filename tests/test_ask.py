"""The Ask (spec.ask): one event's request read once, the same from a form and from the command line, and read by
every part of the event (the limits, the GPU time, the handler) as the one record built where the event came in."""

from __future__ import annotations

import pytest

from studio.app.admit import ASK, Admission, Asks
from studio.app.gpu_time import Durations
from studio.app.handlers import Studio
from studio.app.limits import PublicGuard, PublicLimits
from studio.app.zerogpu import device_event
from studio.spec import ConfigError, PresetLibrary
from studio.spec.ask import Ask, Switches, fan_out, prompt_lines, resolve_stacks
from studio.spec.presets import BASE
from studio.spec.settings import current
from studio.worker.protocol import Device

pytestmark = pytest.mark.quick

FORM = dict(prompt="a red cube", model="tiny", seed=7, steps=12, width=64, height=64, guidance=3.5)


def _studio(public: bool = False) -> Studio:
    lib = PresetLibrary()
    guard = PublicGuard(PublicLimits()) if public else None
    return Studio(Device("tiny", lib), ["tiny"], lib, public=public, guard=guard)


def test_the_ask_of_a_form_equals_the_ask_of_the_same_cli_arguments():
    from studio.cli_args import ask_of_args, parser
    from studio.engine import ModelManager, Runner

    form = dict(
        FORM, preset="cache", cache="unset", threshold=0.3, compile="false", compare="auto", loras="outline@0.5"
    )
    ui = Asks(_studio()).generate(None, None, **form)
    args = parser().parse_args(
        "generate --model tiny --prompt".split()
        + ["a red cube"]
        + "--seed 7 --steps 12 --width 64 --height 64 --guidance 3.5 --preset cache --threshold 0.3".split()
        + "--compile false --compare auto --lora outline@0.5".split()
    )
    cli = ask_of_args(Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model="tiny"), args)
    assert ui == cli
    # what it holds: the stack resolved and switched once (threshold 0.3, compile off), the request with the profile's
    # defaults, the LoRA parsed by the one rule
    (stack,) = ui.stacks
    assert stack.name == "cache.override" and stack.cache_config.residual_diff_threshold == 0.3
    assert not stack.compile.enabled and ui.builtin == (True,) and ui.compare == "auto"
    assert ui.request.steps == 12 and ui.request.loras[0].path == "outline" and ui.request.loras[0].scale == 0.5
    assert ui.prompts == ("a red cube",) and ui.requests == (ui.request,)


def test_every_cli_command_reads_its_request_prompts_seeds_and_switches_into_one_ask(tmp_path):
    """bench, sweep, tune, methods and calibrate build an Ask as generate does: the request with the profile's
    defaults, the prompts of --prompts (else the profile's examples; bench: the request's own), each at every seed."""
    from studio.cli_args import ask_of_args, parser
    from studio.engine import ModelManager, Runner

    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model="tiny")
    (tmp_path / "p.txt").write_text("a blue disc\n# a comment\na red cube\n")
    bench = ask_of_args(
        runner,
        parser().parse_args(
            [
                "bench",
                "--prompts",
                str(tmp_path / "p.txt"),
                "--seeds",
                "3,4",
                "--compile",
                "false",
                "--steps",
                "12",
                "--repeats",
                "5",
            ]
        ),
    )
    assert bench.event == "bench" and bench.switches == Switches(None, None, False) and bench.repeats == 5
    pairs = [(r.prompt, r.seed, r.steps) for r in bench.requests]
    assert pairs == [("a blue disc", 3, 12), ("a blue disc", 4, 12), ("a red cube", 3, 12), ("a red cube", 4, 12)]
    assert bench.request.prompt == "a blue disc" and bench.stacks == ()
    plain = ask_of_args(runner, parser().parse_args(["bench", "--prompt", "a green cube"]))
    assert [r.prompt for r in plain.requests] == ["a green cube"]  # bench: the request's own prompt
    tune = ask_of_args(runner, parser().parse_args(["tune", "--min-psnr", "35"]))
    assert tune.prompts == tuple(tune.profile.example_prompts) and len(tune.requests) == len(tune.prompts) > 1
    with pytest.raises(ValueError, match="--seeds 'x'"):
        ask_of_args(runner, parser().parse_args(["bench", "--seeds", "x"]))


def test_switches_one_rule_threshold_only_where_the_cache_runs_and_matrix_base_first_unswitched():
    lib = PresetLibrary()
    sw = Switches.read("unset", "0.4", "unset")
    assert sw == Switches(None, 0.4, None) and Switches.read(None, 0, None) == Switches()  # 0: follow the preset
    assert sw.apply(lib.get("int8")) is lib.get("int8")  # no cache there: the threshold changes nothing, no rename
    assert sw.apply(lib.get("cache")).cache_config.residual_diff_threshold == 0.4
    with pytest.raises(ConfigError, match="cache switch 'maybe' is not valid"):
        Switches.read("maybe")
    stacks, builtin = resolve_stacks("matrix", ["cache", "sage"], lib, Switches(False, None, True))
    assert [p.name for p in stacks] == [BASE, "cache.override", "sage.override"] and builtin == (True,) * 3
    assert stacks[0] == lib.get(BASE)  # the reference row: never switched
    assert not stacks[1].cache_config.enabled and all(p.compile.enabled for p in stacks[1:])
    with pytest.raises(ConfigError, match="not found"):
        resolve_stacks("generate", ["no-such-preset"], lib, Switches())


def test_prompts_are_fanned_out_by_one_rule():
    assert prompt_lines(" a \n\n# a comment\nb\na\n") == ["a", "b"]  # stripped, blank/comment/repeat dropped
    assert fan_out("a", ["b", "a", "c"]) == ("a", "b", "c")  # the matrix: the request's prompt first
    assert fan_out("a", ["b", "c", "d"], cap=3) == ("a", "b", "c")  # a public studio's cap, in all
    assert fan_out("a", ["b", "c"], replace_first=True) == ("b", "c") and fan_out("a", [], replace_first=True) == (
        "a",
    )
    asks = Asks(_studio(public=True))
    m = asks.matrix(None, None, **FORM, presets=["cache"], prompts_text="x\ny\nz\nw", repeats=2)
    assert m.prompts == ("a red cube", "x", "y") and m.repeats == 2 and len(m.requests) == 3
    t = asks.tune(None, None, **FORM, floor=30, prompts_text="x\ny\nz\nw")
    assert t.prompts == ("x", "y", "z") and t.stacks == ()


def test_a_preset_file_is_parsed_once_per_change(tmp_path):
    lib = PresetLibrary(user_dir=tmp_path)
    lib.add("mine", "cache_config: {backend: cache-dit, residual_diff_threshold: 0.2}\n")
    first = lib.get("mine")
    assert lib.get("mine") is first  # no second parse while the file is as it was
    lib.add("mine", "cache_config: {backend: cache-dit, residual_diff_threshold: 0.35}\n")
    again = lib.get("mine")
    assert again is not first and again.cache_config.residual_diff_threshold == 0.35


def test_one_event_builds_one_ask_that_the_limits_the_gpu_time_and_the_handler_read():
    """The event wrapper (app.zerogpu.device_event) builds the Ask once; admission and the handler get that object;
    the duration callable, called with the handler's own arguments as ZeroGPU calls it, reads it too."""
    studio = _studio(public=True)
    built, seen = [], {}
    asks, durations = Asks(studio), Durations(studio)

    def ask(*a, **k):
        built.append(asks.generate(*a, **k))
        return built[-1]

    def admit(a: Ask, request):
        seen["admit"] = a
        Admission(studio)(a, request)

    def handler(request=None, progress=None, *, history=None, image=None, mask_image=None, **values):
        seen["handler"] = values[ASK]
        seen["seconds"] = durations.generate(request, progress, image=image, mask_image=mask_image, **values)
        return "done"

    event = device_event(handler, None, admit, ask)
    assert event(None, None, **FORM, preset="cache", compare="off") == "done"
    assert len(built) == 1 and seen["admit"] is built[0] and seen["handler"] is built[0]
    assert seen["seconds"] == durations.generate(None, None, **FORM, preset="cache", compare="off")
    # a form that cannot be read is refused where the event comes in: no admission, no handler
    seen.clear()
    with pytest.raises(Exception, match="preset 'nope' not found"):
        event(None, None, **FORM, preset="nope")
    assert seen == {}
