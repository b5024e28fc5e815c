"""Command line: python -m studio generate|bench|sweep|tune|methods|calibrate|presets|doctor|plan (arguments:
studio.cli_args). Each command imports what it runs inside its own function, so that one command does not pay for
another's libraries (torch and diffusers take seconds on two cores)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from studio.cli_args import ask_of_args, parser, read_settings
from studio.spec.ask import Ask, read_prompts
from studio.worker.quiet import quiet_libraries


def device_worker(args, presets=None, quiet: bool = True):
    """The device worker a command's contained runs go through (bench, doctor), with no warm-up: each call loads."""
    from studio.worker import WorkerClient, WorkerConfig

    config = WorkerConfig(
        model=getattr(args, "model", None) or "tiny", device=args.device, presets=presets, quiet=quiet
    )
    return WorkerClient(config, warm=())


def progress_bar(desc: str):
    """A tqdm bar on stderr; returns (callback(done, total, label), close)."""
    from tqdm import tqdm

    bar = tqdm(total=1, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)

    def tick(done, total, label):
        bar.total = total
        bar.set_postfix_str(str(label)[:40])
        bar.update(done - bar.n)

    return tick, bar.close


def presets_command(lib, args, settings) -> int:
    """`python -m studio presets list|export`: each preset's asked stack, description and what it becomes here."""
    from studio.engine.device import profile_here
    from studio.engine.resolve import resolved
    from studio.report.fmt import on_this_machine

    device = profile_here(zerogpu=settings.zerogpu_slice)
    if args.action == "list":
        for name in lib.names():
            p = lib.get(name)
            here = on_this_machine(resolved(p, device, settings.dtype))
            print(f"{name:24s} {p.tag():55s} {p.description}\n{'':24s} {here}")
        return 0
    if not args.name:
        raise ValueError("presets export needs a preset NAME")
    p = lib.get(args.name)
    if args.format == "studio":
        from studio.spec.presets import preset_to_yaml

        text = preset_to_yaml(p)
    else:
        from studio.engine.quantize import exported_quant
        from studio.spec.export import cache_dit_yaml

        here = on_this_machine(resolved(p, device, settings.dtype))
        text = cache_dit_yaml(p, steps=args.steps, quant=exported_quant(p, device), here=here)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


def plan_command(lib, args, settings) -> int:
    """`python -m studio plan`: what a preset would run on a device (engine.plan), in words or as JSON."""
    from studio.engine.plan import make_plan, profile_of
    from studio.report.plan import plan_table, plan_text
    from studio.spec.devices import PROFILES

    size = None
    if args.size:
        w, _, h = args.size.lower().partition("x")
        if not (w.isdigit() and h.isdigit()):
            raise ValueError(f"--size {args.size!r} is not WxH, e.g. 1024x1024")
        size = (int(w), int(h))
    budget = args.budget if args.budget is not None else settings.device_memory_gb
    if args.table:  # the shipped stacks (a step-cache method's preset plans as `cache` does: presets/methods/)
        stacks = [p for p in lib.names() if p not in lib.method_names()]
        plans = {
            (d, p): make_plan(PROFILES[d], args.model, lib.get(p), size, budget) for d in PROFILES for p in stacks
        }
        print(plan_table(plans))
        return 0
    plan = make_plan(profile_of(args.device, settings), args.model, lib.get(args.preset), size, budget, settings.dtype)
    print(json.dumps(plan.as_dict(), indent=1) if args.json else plan_text(plan))
    return 0 if plan.fits else 1


def _doctor(args) -> int:

    from studio.bench import doctor
    from studio.engine.device import default_device
    from studio.report import text as report
    from studio.tiny.families import FAMILIES

    def say(msg):
        print(msg, file=sys.stderr)

    fams = args.families.split(",") if args.families else list(FAMILIES)
    names = args.presets.split(",") if args.presets else None
    # each family in the device worker: a native crash costs its own row (studio.worker.reruns), not the table
    from studio.worker import reruns

    with device_worker(args, quiet=False) as worker:
        rows = reruns.doctor(worker, fams, names, on_status=say)
    device = str(args.device or default_device())
    if args.json:
        print(doctor.as_json(rows, device))
        return 0 if doctor.healthy(rows) else 1
    print(report.doctor_header(device, doctor.CACHING_THRESHOLD["cache-dit"]))
    print(report.doctor_table(rows))
    ok = doctor.healthy(rows)
    print(report.doctor_verdict(ok))
    return 0 if ok else 1


def _generate(runner, ask: Ask, args) -> int:
    from studio.report import fmt

    res = runner.generate(ask.request, ask.stacks[0], model=ask.model, compare=ask.compare)
    if args.out:
        res.pil().save(args.out)
    m = res.metrics
    if args.json:
        print(json.dumps(m.as_dict()))
        return 0
    print(fmt.summary_line(m))
    for line in m.labels.engaged + m.labels.fallbacks:
        print("  " + line)
    print(f"  steps counted by {m.cache.count_source}" + (f"; {m.cache.count_check}" if m.cache.count_check else ""))
    print(f"  timing: {m.timing.how}")
    if (
        m.timing.timed_pairs and m.timing.base_denoise_s is not None
    ):  # the speed-up's pairs, as the card's vs base row says them
        print(f"  pairs: {fmt.pairs(m.timing.timed_pairs, m.timing.pairs_stop, m.timing.stalled_runs)}")
    if args.ideal:
        from studio.report.text import ideal_worked

        print(ideal_worked(m))
    return 0


def bench_kw(ask: Ask, args) -> dict:
    """The bench's keywords from its Ask and arguments (studio.bench.run_bench's; the lab's `processes` reads them
    too)."""
    return dict(
        model=ask.model,
        repeats=ask.repeats,
        cache_enabled=ask.switches.cache,
        compile_enabled=ask.switches.compile,
        vs_raw=args.vs_raw,
        extra_rounds=args.extra_rounds,
        floor_db=args.min_psnr,
        max_flip=args.max_flip,
        fewer_steps=args.fewer_steps,
    )


def _bench(runner, ask: Ask, args) -> int:
    from studio.worker.service import InProcess

    names = args.presets.split(",") if args.presets else None
    requests, kw = list(ask.requests), bench_kw(ask, args)
    # in the device worker, each stack's native crash costs its own row (studio.worker.reruns); --in-process: here
    rep = bench_in(InProcess(runner) if args.in_process else device_worker(args, runner.presets), requests, names, kw)
    spread_seen(runner, rep)
    return bench_out(rep, args)


def spread_seen(runner, rep) -> None:
    """With a compiled row: the process-to-process spread this machine has measured, stated under the table."""
    from studio.measure import pace

    if rep.twins:  # compiled rows (timed beside their eager twins: studio.bench.twins)
        rep.process_spread = pace.spread_seen(runner.manager.settings.pace_file, rep.meta["machine"])


def bench_out(rep, args) -> int:
    """A bench report as its arguments ask: JSON, CSV or the table; --out, --plot."""
    from studio.report.plots import plot_paired, plot_tradeoff
    from studio.report.text import bench_header, bench_markdown

    if args.json:
        print(json.dumps(rep.as_dict(), indent=1))
    elif args.csv:
        print(rep.matrix.csv(), end="")
    else:
        print(bench_header(rep))
        print(bench_markdown(rep))
    if args.out:
        out = Path(args.out)
        text = {".csv": rep.matrix.csv, ".json": lambda: json.dumps(rep.as_dict(), indent=1)}.get(out.suffix)
        out.write_text(text() if text else bench_header(rep) + "\n\n" + bench_markdown(rep) + "\n")
    if args.plot:  # over several requests, one point per request (studio.bench.paired); else one per stack
        plot_paired(rep.paired, args.plot) if rep.paired else plot_tradeoff(rep.matrix.rows, args.plot)
    return 0


def bench_in(device, requests: list, names, kw: dict, desc: str = "bench"):
    """One bench in `device` (a device worker, or InProcess), closed after it."""
    from studio.worker import reruns

    tick, close = progress_bar(desc)
    try:
        return reruns.bench(
            device, requests, names, on_status=lambda m: print(m, file=sys.stderr), progress=tick, **kw
        )
    finally:
        close()
        device.close()


def _sweep(runner, ask: Ask, args) -> int:
    from studio.bench.sweep import parse_values, run_sweep
    from studio.report.plots import plot_sweep
    from studio.report.text import sweep_markdown

    knob, text = (args.knob, args.values) if args.thresholds is None else ("residual_diff_threshold", args.thresholds)
    values = parse_values(knob, text)
    tick, close = progress_bar("sweep")
    try:
        res = run_sweep(
            runner,
            list(ask.requests),
            args.preset,
            knob,
            values,
            model=ask.model,
            repeats=ask.repeats,
            progress=tick,
            cache_enabled=ask.switches.cache,
            compile_enabled=ask.switches.compile,
        )
    finally:
        close()
    print(json.dumps(res.as_dict(), indent=1) if args.json else sweep_markdown(res))
    if args.out:
        Path(args.out).write_text(
            json.dumps(res.as_dict(), indent=1) if args.out.endswith(".json") else sweep_markdown(res)
        )
    if args.plot:
        rows = res.rows()
        plot_sweep(
            knob,
            values,
            [r.speedup for r in rows],
            [r.worst_psnr_db for r in rows],
            res.cliff[0] if res.cliff else None,
            args.plot,
        )
    return 0


def _tune(runner, ask: Ask, args) -> int:
    from studio.bench.tune import tune
    from studio.report.plots import plot_sweep
    from studio.report.text import tune_summary
    from studio.spec.presets import preset_to_yaml

    res = tune(
        runner,
        list(ask.requests),
        args.min_psnr,
        max_flip=args.max_flip,
        name=args.name,
        model=ask.model,
        progress=lambda m: print(m, file=sys.stderr),
        cache_enabled=ask.switches.cache,
        compile_enabled=ask.switches.compile,
        search_requests=_search_requests(ask, args),
    )
    text = preset_to_yaml(res.preset)
    out = args.out or (str(Path(args.presets_dir) / f"{res.preset.name}.yaml") if args.presets_dir else None)
    if out:
        Path(out).write_text(text)
    if args.json:
        print(json.dumps({**res.as_dict(), "written": out}, indent=1))
    else:
        print(text)
        print("\n".join("# " + line for line in tune_summary(res, written=out).splitlines()))
    if args.plot and res.curve:
        curve = list(zip(*res.curve))  # (thresholds, predicted speed-ups, worst dB)
        plot_sweep("residual_diff_threshold (search, no calibrator)", *curve, None, args.plot, floor_db=res.floor_db)
    return 0


# the step-cache methods (docs/methods.md) ----------------------------------------------------------------------------
def calibrate_command(runner, ask: Ask, args) -> int:
    """MagCache's ratios for this model (studio.engine.magcal), written into the preset."""
    from studio.engine.magcal import calibrate_magcache
    from studio.report.methods import calibration_description
    from studio.spec.preset import CacheSpec, Preset
    from studio.spec.presets import preset_to_yaml

    lib = runner.presets
    start = lib.get(args.preset) if args.preset in lib.names() else None
    start = start or Preset(name=args.preset, cache_config=CacheSpec(backend="magcache"))
    cal = calibrate_magcache(runner, list(ask.requests), start, ask.model)
    out_preset = cal.preset(start, calibration_description(cal, ask.profile.name))
    text = preset_to_yaml(out_preset)
    out = args.out or (str(Path(args.presets_dir) / f"{out_preset.name}.yaml") if args.presets_dir else None)
    if out:
        Path(out).write_text(text)
    print(json.dumps({**cal.as_dict(), "written": out}, indent=1) if args.json else text)
    return 0


def methods_command(runner, ask: Ask, args) -> int:
    from studio.bench.methods import run_methods
    from studio.report.methods import methods_markdown, plot_methods

    if ask.switches.cache is False:
        raise ValueError("methods: every method is a step cache; --cache false leaves nothing to compare")
    res = run_methods(
        runner,
        list(ask.requests),
        floor_db=args.min_psnr,
        max_flip=args.max_flip,
        names=[n.strip() for n in args.methods.split(",")] if args.methods else None,
        model=ask.model,
        repeats=ask.repeats,
        progress=lambda m: print(m, file=sys.stderr),
        compile_enabled=ask.switches.compile,
        also=tuple(n.strip() for n in args.also.split(",") if n.strip()),
        search_requests=_search_requests(ask, args),
    )
    text = methods_markdown(res)
    if args.write:
        _write_searched(runner, res, args)
    if args.out:
        Path(args.out).write_text(json.dumps(res.as_dict(), indent=1) if args.out.endswith(".json") else text)
    if args.plot and res.rows:
        plot_methods(res, args.plot)
    print(json.dumps(res.as_dict(), indent=1) if args.json else text)
    return 0


def _write_searched(runner, res, args) -> None:
    """`methods --write DIR`: each method's best as a preset file there (the Matrix's "all step caches" picks them)."""
    from studio.bench.methods import searched_on, searched_presets
    from studio.report.methods import searched_description
    from studio.spec.presets import preset_to_yaml

    name = runner.profile(args.model).name
    out = Path(args.write)
    out.mkdir(parents=True, exist_ok=True)
    for p in searched_presets(res, searched_on(runner, args.model), lambda s: searched_description(s, res, name)):
        (out / f"{p.name}.yaml").write_text(preset_to_yaml(p))
        print(f"wrote {out / p.name}.yaml", file=sys.stderr)


def _search_requests(ask: Ask, args) -> list | None:
    """`methods` and `tune --search-prompts`: a file, or 'examples' (the model profile's example prompts); None:
    --prompts'."""
    if args.search_prompts is None:
        return None
    prompts = ask.profile.example_prompts if args.search_prompts == "examples" else read_prompts(args.search_prompts)
    return [replace(ask.request, prompt=p) for p in prompts]


def runner_of(args, settings, lib=None):
    """The engine a command's arguments ask for: a model manager on --device with `settings`, and the presets."""
    from studio.engine import ModelManager, Runner
    from studio.spec import PresetLibrary

    lib = lib or PresetLibrary(user_dir=settings.presets_dir)
    return Runner(ModelManager(args.device, settings=settings), lib, model=args.model)


def _make_parents(args) -> None:
    for name in ("out", "plot"):
        path = getattr(args, name, None)
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = read_settings(args)  # the edge: nothing below reads the environment
    except ValueError as e:  # (ConfigError) a bad STUDIO_* value: its name, its value, what it takes
        print(f"error: {e}", file=sys.stderr)
        return 2
    _make_parents(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.cmd in ("bench", "sweep", "tune", "methods", "calibrate"):
        quiet_libraries()
    from studio.engine import ModelLoadError, RunError
    from studio.spec import ConfigError, PresetLibrary

    if args.cmd == "doctor":
        return _doctor(args)
    lib = PresetLibrary(user_dir=settings.presets_dir)  # (read_settings put --presets-dir in it)
    if args.cmd in ("presets", "plan"):
        try:
            return (presets_command if args.cmd == "presets" else plan_command)(lib, args, settings)
        except (ConfigError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    runner = runner_of(args, settings, lib)
    try:
        commands = {"generate": _generate, "bench": _bench, "sweep": _sweep, "tune": _tune}
        commands |= {"methods": methods_command, "calibrate": calibrate_command}
        return commands[args.cmd](runner, ask_of_args(runner, args), args)
    except (ConfigError, ModelLoadError, RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        runner.manager.unload()  # parallel workers, and a Ray runtime started for them, end with the command
