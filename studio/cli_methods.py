"""The step-cache methods' commands (docs/methods.md): `python -m studio calibrate` (MagCache's ratios for this
model, written into a preset) and `python -m studio methods` (every method at its best setting over a floor, side
by side; `--write` keeps each best as a preset)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from studio.cli_args import prompt_requests
from studio.spec.ask import read_prompts


def calibrate_command(runner, req, args) -> int:
    """MagCache's ratios for this model (studio.engine.magcal), written into the preset."""
    from studio.engine.magcal import calibrate_magcache
    from studio.report.methods import calibration_description
    from studio.spec.preset import CacheSpec, Preset
    from studio.spec.presets import preset_to_yaml

    lib = runner.presets
    start = lib.get(args.preset) if args.preset in lib.names() else None
    start = start or Preset(name=args.preset, cache_config=CacheSpec(backend="magcache"))
    cal = calibrate_magcache(runner, prompt_requests(runner, req, args), start, args.model)
    out_preset = cal.preset(start, calibration_description(cal, runner.profile(args.model).name))
    text = preset_to_yaml(out_preset)
    out = args.out or (str(Path(args.presets_dir) / f"{out_preset.name}.yaml") if args.presets_dir else None)
    if out:
        Path(out).write_text(text)
    print(json.dumps({**cal.as_dict(), "written": out}, indent=1) if args.json else text)
    return 0


def methods_command(runner, req, args) -> int:
    from studio.bench.methods import run_methods
    from studio.report.methods import methods_markdown, plot_methods

    if args.cache is False:
        raise ValueError("methods: every method is a step cache; --cache false leaves nothing to compare")
    res = run_methods(
        runner,
        prompt_requests(runner, req, args),
        floor_db=args.min_psnr,
        max_flip=args.max_flip,
        names=[n.strip() for n in args.methods.split(",")] if args.methods else None,
        model=args.model,
        repeats=args.repeats,
        progress=lambda m: print(m, file=sys.stderr),
        compile_enabled=args.compile,
        also=tuple(n.strip() for n in args.also.split(",") if n.strip()),
        search_requests=_search_requests(runner, req, args),
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
    """`methods --write DIR`: each method's best as a preset file there, marked with the transformer it was searched
    on (the Matrix's "all step caches" picks them; on another transformer the card says their floor is unknown)."""
    from studio.bench.methods import searched_on, searched_presets
    from studio.report.methods import searched_description
    from studio.spec.presets import preset_to_yaml

    name = runner.profile(args.model).name
    out = Path(args.write)
    out.mkdir(parents=True, exist_ok=True)
    for p in searched_presets(res, searched_on(runner, args.model), lambda s: searched_description(s, res, name)):
        (out / f"{p.name}.yaml").write_text(preset_to_yaml(p))
        print(f"wrote {out / p.name}.yaml", file=sys.stderr)


def _search_requests(runner, req, args) -> list | None:
    """`methods --search-prompts`: a file, or 'examples' (the model profile's example prompts); None: --prompts'."""
    if args.search_prompts is None:
        return None
    if args.search_prompts == "examples":
        return [replace(req, prompt=p) for p in runner.profile(args.model).example_prompts]
    return [replace(req, prompt=p) for p in read_prompts(args.search_prompts)]
