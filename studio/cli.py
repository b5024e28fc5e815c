"""Command line: python -m studio generate|bench|sweep|presets.

python -m studio generate --preset cache --prompt "a red circle in the center, blue background" --json
python -m studio generate --preset cache --compile true --json
python -m studio bench --presets base,cache,cache-compile --repeats 3 --out bench.md
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def _switch(what: str):
    def parse(v: str):
        from studio.spec.checks import ConfigError, parse_switch

        try:
            return parse_switch(v, what)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="Hub id, local folder, or 'tiny' (the embedded model; default)")
    p.add_argument("--prompt", default=None, help="default: the model profile's first example prompt")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--steps", type=int, default=None, help="default: the model profile's")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--presets-dir", default=None, help="folder of user presets (also STUDIO_PRESETS_DIR)")
    p.add_argument("--cache", type=_switch("cache switch"), default=None, help="per-request cache switch: true|false")
    p.add_argument(
        "--compile", type=_switch("compile switch"), default=None, help="per-request torch.compile switch: true|false"
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m studio", description="DiT Speed Studio engine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="one measured generation, compared with base")
    _common(g)
    g.add_argument("--preset", default="base")
    g.add_argument("--threshold", type=float, default=None, help="per-request residual diff threshold")
    g.add_argument("--out", default=None, help="write the image here (PNG)")
    g.add_argument("--json", action="store_true", help="print one JSON object with the metrics")
    b = sub.add_parser("bench", help="every preset (or --presets a,b) side by side on one request")
    _common(b)
    b.add_argument("--presets", default=None, help="comma-separated preset names (default: all)")
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--out", default=None, help="write the table: .md, .csv or .json by extension")
    b.add_argument("--plot", default=None, help="write the speed-up vs PSNR plot (PNG)")
    s = sub.add_parser("sweep", help="the cache preset at several thresholds, side by side with base")
    _common(s)
    s.add_argument("--preset", default="cache")
    s.add_argument("--thresholds", default="0.08,0.12,0.16,0.24,0.32,0.5")
    s.add_argument("--repeats", type=int, default=1)
    s.add_argument("--out", default=None, help="write the table: .md, .csv or .json by extension")
    sub.add_parser("presets", help="list presets and their stacks")
    d = sub.add_parser("doctor", help="every shipped preset on a tiny instance of every DiT family, on this machine")
    d.add_argument("--families", default=None, help="comma-separated (default: flux,qwen-image,sd3,z-image)")
    d.add_argument("--presets", default=None, help="comma-separated preset names (default: all shipped)")
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.add_argument("--no-kernels", action="store_true", help="on a GPU, skip timing a FLUX-sized random transformer")
    return ap


def _doctor(args) -> int:
    from dataclasses import asdict

    from studio.bench import doctor
    from studio.engine.device import default_device
    from studio.report import fmt
    from studio.tiny.families import FAMILIES

    def say(msg):
        print(msg, file=sys.stderr)

    fams = args.families.split(",") if args.families else list(FAMILIES)
    names = args.presets.split(",") if args.presets else None
    rows = doctor.run_doctor(fams, names, args.device, on_status=say)
    device = str(args.device or default_device())
    kernels = []
    if device.startswith("cuda") and not args.no_kernels:
        say("timing the non-cache stacks on a random-weight FLUX.1-dev-sized transformer at 1024x1024")
        kernels = doctor.time_kernels(device=device)
    if args.json:
        out = json.loads(doctor.as_json(rows, device))
        out["kernels"] = [asdict(k) for k in kernels]
        print(json.dumps(out, indent=1))
        return 0 if doctor.healthy(rows) else 1
    print(
        f"device {device}; tiny random-weight instances, 64x64; cached presets at R="
        f"{doctor.CACHING_THRESHOLD['cache-dit']} (random weights do not cache at 0.24)"
    )
    print(doctor.markdown(rows))
    if kernels:
        print("\n| stack | ms per transformer call | vs sdpa | engaged |\n|---|---|---|---|")
        for k in kernels:
            print(f"| {k.stack} | {'n/a' if k.ms is None else f'{k.ms:.1f}'} | {fmt.speedup(k.speedup)} | {k.note} |")
    ok = doctor.healthy(rows)
    print(
        "healthy: counts agree with the cache's own lists, nothing broken" if ok else "NOT healthy: see DISAGREE rows"
    )
    return 0 if ok else 1


def _generate(runner, req, args) -> int:
    from studio.report import fmt

    res = runner.generate(
        req,
        args.preset,
        model=args.model,
        cache_enabled=args.cache,
        cache_threshold=args.threshold,
        compile_enabled=args.compile,
    )
    if args.out:
        res.pil().save(args.out)
    m = res.metrics
    if args.json:
        print(json.dumps(m.as_dict()))
        return 0
    print(fmt.summary_line(m))
    for line in m.engaged + m.fallbacks:
        print("  " + line)
    print(f"  steps counted by {m.count_source}" + (f"; {m.count_check}" if m.count_check else ""))
    print(f"  timing: {m.timing}")
    return 0


def _bench(runner, req, args) -> int:
    from studio.bench import run_matrix, threshold_sweep
    from studio.report.plots import plot_tradeoff

    if args.cmd == "bench":
        names = args.presets.split(",") if args.presets else None
        mat = run_matrix(
            runner,
            req,
            names,
            model=args.model,
            repeats=args.repeats,
            on_status=lambda s: print(s, file=sys.stderr),
            cache_enabled=args.cache,
            compile_enabled=args.compile,
        )
    else:
        ths = tuple(float(x) for x in args.thresholds.split(","))
        mat = threshold_sweep(runner, req, args.preset, ths, model=args.model, repeats=args.repeats)
    print(
        f"model {mat.model}, prompt {req.prompt!r}, seed {req.seed}, {req.steps} steps, "
        f"{req.width}x{req.height}, median of {mat.repeats} round-robin repeats after each stack's warm-up, "
        f"device {runner.manager.device}"
    )
    print(mat.markdown())
    if args.out:
        out = Path(args.out)
        out.write_text({".csv": mat.csv, ".json": mat.json}.get(out.suffix, mat.markdown)())
    if getattr(args, "plot", None):
        plot_tradeoff(mat.rows, args.plot)
    return 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from studio.engine import ModelLoadError, ModelManager, RunError, Runner
    from studio.spec import ConfigError, PresetLibrary

    if args.cmd == "doctor":
        return _doctor(args)
    lib = PresetLibrary(user_dir=getattr(args, "presets_dir", None))
    if args.cmd == "presets":
        for name in lib.names():
            p = lib.get(name)
            print(f"{name:24s} {p.tag():55s} {p.description}")
        return 0
    runner = Runner(ModelManager(args.device), lib, model=args.model)
    try:
        prof = runner.profile(args.model)
        prompt = args.prompt or prof.first_prompt
        req = runner.request(
            prompt,
            model=args.model,
            seed=args.seed,
            steps=args.steps,
            width=args.width,
            height=args.height,
            guidance=args.guidance,
        )
        return _generate(runner, req, args) if args.cmd == "generate" else _bench(runner, req, args)
    except (ConfigError, ModelLoadError, RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
