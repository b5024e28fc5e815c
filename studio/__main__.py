"""Command line: python -m studio generate|bench|sweep|presets.

python -m studio generate --preset cache --prompt "a red circle in the center, blue background" --json
python -m studio bench --repeats 3 --out bench.md
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path


def _request(runner, args):
    return runner.request(
        args.prompt,
        model=args.model,
        seed=args.seed,
        steps=args.steps,
        width=args.width,
        height=args.height,
        guidance=args.guidance,
    )


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


def _cache_switch(v: str):
    from studio.config import ConfigError, parse_switch

    try:
        return parse_switch(v)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studio", description="DiT Speed Studio engine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="one measured generation, compared with base")
    _common(g)
    g.add_argument("--preset", default="base")
    g.add_argument("--cache", type=_cache_switch, default=None, help="per-request cache switch: true|false")
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
    sub.add_parser("presets", help="list presets and their stacks")
    args = ap.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from studio.config import ConfigError
    from studio.models.manager import ModelLoadError, ModelManager
    from studio.presets import PresetLibrary
    from studio.runner import Runner

    lib = PresetLibrary(user_dir=getattr(args, "presets_dir", None))
    if args.cmd == "presets":
        for name in lib.names():
            p = lib.get(name)
            print(f"{name:18s} {p.tag():55s} {p.description}")
        return 0
    runner = Runner(ModelManager(args.device), lib, model=args.model)
    if args.prompt is None:
        args.prompt = (
            runner.profile(args.model).example_prompts[0]
            if runner.profile(args.model).example_prompts
            else "a photo of a cat"
        )
    try:
        req = _request(runner, args)
        if args.cmd == "generate":
            res = runner.generate(
                req, args.preset, model=args.model, cache_enabled=args.cache, cache_threshold=args.threshold
            )
            if args.out:
                res.pil().save(args.out)
            m = res.metrics
            if args.json:
                print(json.dumps(m.as_dict()))
            else:
                psnr = "inf" if m.psnr_db is not None and math.isinf(m.psnr_db) else f"{m.psnr_db:.2f} dB"
                print(
                    f"{m.preset} [{m.tag}] denoise {m.denoise_s:.3f} s ({m.mean_step_ms:.1f} ms/step), "
                    f"{m.cached_steps} cached / {m.full_steps} full, {m.speedup:.2f}x vs base, PSNR {psnr}, "
                    f"SSIM {m.ssim:.4f} [{m.quality}]"
                )
                for line in m.engaged:
                    print("  " + line)
            return 0
        from studio.bench import plot_tradeoff, run_matrix, threshold_sweep

        if args.cmd == "bench":
            names = args.presets.split(",") if args.presets else None
            mat = run_matrix(
                runner,
                req,
                names,
                model=args.model,
                repeats=args.repeats,
                on_status=lambda s: print(s, file=sys.stderr),
            )
        else:
            ths = tuple(float(x) for x in args.thresholds.split(","))
            mat = threshold_sweep(runner, req, args.preset, ths, model=args.model, repeats=args.repeats)
        print(
            f"model {mat.model}, prompt {req.prompt!r}, seed {req.seed}, {req.steps} steps, "
            f"{req.width}x{req.height}, median of {mat.repeats} round-robin repeats after a warm-up, "
            f"device {runner.manager.device}"
        )
        print(mat.markdown())
        if getattr(args, "out", None):
            out = Path(args.out)
            out.write_text({".csv": mat.csv, ".json": mat.json}.get(out.suffix, mat.markdown)())
        if getattr(args, "plot", None):
            plot_tradeoff(mat.rows, args.plot)
        return 0
    except (ConfigError, ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
