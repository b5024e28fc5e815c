"""Evaluate the embedded model through the studio's own engine (ModelManager + Runner), judged from pixels.

    python -m lab eval [--seeds 3] [--out docs]

Reports, on held-out exact combinations (never seen in training): background colour, object colour at its
place, and shape for single-object prompts; both objects at their places for two-object prompts. Then the
`cache` preset at 28 steps: cached steps and PSNR against `base`. Writes a JSON report and a contact sheet.
A tool: the engine is imported inside main, which runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from lab.tiny.scenes import Scene, all_single_scenes, is_held_out, judge_background, judge_object, sample_scene

TARGETS = {"background": 0.95, "colour": 0.85, "shape": 0.80, "pair": 0.80, "cache_psnr_db": 30.0}
# A model that needs its steps: base at half the steps, against the full-step picture, worst over the held-out prompts
# (docs/prompts-heldout.txt) at most this (real DiTs change the picture at fewer steps; a straight flow would not).
HALF_STEPS_MAX_DB = 32.0
FEWER_STEPS = (20, 16, 14, 10, 8)  # of the profile's 28: the table in docs/tiny-model.md


def held_out_singles(n: int, seed: int = 0) -> list[Scene]:
    scenes = [s for s in all_single_scenes() if is_held_out(s)]
    random.Random(seed).shuffle(scenes)
    return scenes[:n]


def held_out_pairs(n: int, seed: int = 0) -> list[Scene]:
    rng = random.Random(seed)
    return [sample_scene(rng, two_objects=True, held_out=True) for _ in range(n)]


def score_single(img: np.ndarray, scene: Scene) -> dict:
    o = scene.objects[0]
    bg = judge_background(img)
    j = judge_object(img, o.place, scene.background, 1)
    return {
        "prompt": scene.prompt,
        "background": bg == scene.background,
        "colour": j.colour == o.colour,
        "shape": j.shape == o.shape,
        "judged": [bg, j.colour, j.shape, round(j.fill_ratio, 3)],
    }


def score_pair(img: np.ndarray, scene: Scene) -> dict:
    got = [judge_object(img, o.place, scene.background, 2) for o in scene.objects]
    ok = all(g.colour == o.colour for g, o in zip(got, scene.objects))
    return {"prompt": scene.prompt, "pair": ok, "judged": [g.colour for g in got]}


def contact_sheet(rows: list[tuple[str, list[np.ndarray]]], path: Path, scale: int = 2) -> None:
    """A PNG grid: one row per prompt (label on the left), one column per seed."""
    h, w = rows[0][1][0].shape[:2]
    cell_w, cell_h = w * scale, h * scale
    label_w = 420
    sheet = Image.new("RGB", (label_w + cell_w * len(rows[0][1]), cell_h * len(rows)), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for r, (prompt, imgs) in enumerate(rows):
        words, line, lines = prompt.split(), "", []
        for wd in words:
            if len(line) + len(wd) > 52:
                lines.append(line)
                line = ""
            line += wd + " "
        lines.append(line)
        for k, ln in enumerate(lines):
            draw.text((6, r * cell_h + 6 + 12 * k), ln.strip(), fill="black", font=font)
        for c, im in enumerate(imgs):
            sheet.paste(
                Image.fromarray(im).resize((cell_w, cell_h), Image.Resampling.NEAREST),
                (label_w + c * cell_w, r * cell_h),
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)


def _cache_runs(gen, n: int) -> list[dict]:
    """The `cache` preset at 28 steps on held-out prompts, against base."""
    runs = []
    for s in held_out_singles(n, seed=1):
        m = gen(s.prompt, 0, "cache", compare=True).metrics
        runs.append(
            {
                "prompt": s.prompt,
                "cached_steps": m.cache.cached_steps,
                "full_steps": m.cache.full_steps,
                "psnr_db": m.quality.psnr_db,
                "ssim": m.quality.ssim,
                "quality": str(m.quality.verdict),
            }
        )
    return runs


def fewer_steps_rows(runner, model: str, prompts: list[str], seed: int = 42) -> list[dict]:
    """Base at each of FEWER_STEPS against base's full-step picture over `prompts` (studio.bench.fewer)."""
    from studio.bench.fewer import FewerStepsJudge

    reqs = [runner.request(p, model=model, seed=seed) for p in prompts]
    judge = FewerStepsJudge(runner, reqs, model, floor_db=HALF_STEPS_MAX_DB)
    out = []
    for k in FEWER_STEPS:
        p = judge.point(min(k, reqs[0].steps - 1))
        out.append(
            {
                "steps": p.steps,
                "of": p.full,
                "speedup": p.speedup,
                "worst_psnr_db": p.worst_db,
                "mean_psnr_db": p.mean_db,
                "worst_flip": p.worst_flip,
            }
        )
    return out


def _rate(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def _report(args, singles: list, pairs: list, cache_runs: list, seconds: float, fewer: list) -> dict:
    psnrs = [r["psnr_db"] for r in cache_runs]
    return {
        "model": args.model,
        "seeds": args.seeds,
        "held_out_single": {
            "n": len(singles),
            "background": _rate(singles, "background"),
            "colour": _rate(singles, "colour"),
            "shape": _rate(singles, "shape"),
        },
        "held_out_pair": {"n": len(pairs), "both_objects_right": _rate(pairs, "pair")},
        "cache_28_steps": {
            "n": len(cache_runs),
            "mean_cached_steps": statistics.mean(r["cached_steps"] for r in cache_runs),
            "min_psnr_db": min(psnrs),
            "mean_psnr_db": statistics.mean(psnrs),
            "share_at_or_above_30db": sum(p >= 30 for p in psnrs) / len(psnrs),
        },
        "fewer_steps": {"prompts": args.fewer_prompts, "rows": fewer},
        "targets": {**TARGETS, "half_steps_max_db": HALF_STEPS_MAX_DB},
        "seconds": round(seconds, 1),
        "failures": {
            "single": [r for r in singles if not (r["background"] and r["colour"] and r["shape"])][:20],
            "pair": [r for r in pairs if not r["pair"]][:20],
        },
        "cache_runs": cache_runs,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--singles", type=int, default=40, help="held-out single-object combinations")
    ap.add_argument("--pairs", type=int, default=30, help="held-out two-object prompts")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cache-prompts", type=int, default=12)
    ap.add_argument("--out", type=Path, default=Path("docs"))
    ap.add_argument("--fewer-prompts", default="docs/prompts-heldout.txt", help="prompts of the fewer-steps table")
    args = ap.parse_args(argv)

    from studio.engine import ModelManager, Runner
    from studio.spec.settings import Settings

    runner = Runner(ModelManager("cpu", settings=Settings.from_env(os.environ)), model=args.model)  # (its edge)
    t0 = time.perf_counter()

    def gen(prompt: str, seed: int, preset: str = "base", compare: bool = False):
        req = runner.request(prompt, model=args.model, seed=seed)
        return runner.generate(req, preset, model=args.model, compare=compare)

    singles = [
        score_single(gen(s.prompt, seed).image, s)
        for s in held_out_singles(args.singles)
        for seed in range(args.seeds)
    ]
    pairs = [
        score_pair(gen(s.prompt, seed).image, s) for s in held_out_pairs(args.pairs) for seed in range(args.seeds)
    ]

    from studio.spec.ask import read_prompts

    fewer = fewer_steps_rows(runner, args.model, read_prompts(args.fewer_prompts))
    cache_runs = _cache_runs(gen, args.cache_prompts)
    report = _report(args, singles, pairs, cache_runs, time.perf_counter() - t0, fewer)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tiny-eval.json").write_text(json.dumps(report, indent=1))

    from studio.tiny.build import EXAMPLE_PROMPTS

    sheet_prompts = (
        list(EXAMPLE_PROMPTS)
        + [s.prompt for s in held_out_singles(4, seed=2)]
        + [s.prompt for s in held_out_pairs(3, seed=2)]
    )
    contact_sheet(
        [(p, [gen(p, seed).image for seed in range(4)]) for p in sheet_prompts], args.out / "tiny-contact-sheet.png"
    )
    return _summary(report, args.out)


def _summary(report: dict, out: Path) -> int:
    """Print the results against the targets; 0 when all are met."""
    s, p, c = report["held_out_single"], report["held_out_pair"], report["cache_28_steps"]
    print(
        f"held-out single ({s['n']} images): background {s['background']:.1%}, colour {s['colour']:.1%}, "
        f"shape {s['shape']:.1%}"
    )
    print(f"held-out two-object ({p['n']} images): both right {p['both_objects_right']:.1%}")
    print(
        f"cache preset, 28 steps ({c['n']} prompts): mean cached {c['mean_cached_steps']:.1f}, PSNR mean "
        f"{c['mean_psnr_db']:.1f} dB, min {c['min_psnr_db']:.1f} dB, >=30 dB {c['share_at_or_above_30db']:.0%}"
    )
    for r in report["fewer_steps"]["rows"]:
        print(
            f"base at {r['steps']} of {r['of']} steps ({r['speedup']:.2f}x): worst PSNR {r['worst_psnr_db']:.1f} dB, "
            f"mean {r['mean_psnr_db']:.1f} dB against the full-step picture"
        )
    print(f"wrote {out / 'tiny-eval.json'} and {out / 'tiny-contact-sheet.png'} in {report['seconds']:.0f}s")
    ok = (
        s["background"] >= TARGETS["background"]
        and s["colour"] >= TARGETS["colour"]
        and s["shape"] >= TARGETS["shape"]
        and p["both_objects_right"] >= TARGETS["pair"]
        and c["min_psnr_db"] >= TARGETS["cache_psnr_db"]
    )
    half = next((r for r in report["fewer_steps"]["rows"] if r["steps"] * 2 == r["of"]), None)
    if half is not None and half["worst_psnr_db"] > HALF_STEPS_MAX_DB:
        print(
            f"base at half the steps keeps {half['worst_psnr_db']:.1f} dB: over {HALF_STEPS_MAX_DB:g} dB, so the "
            "model does not need its steps"
        )
        ok = False
    print("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
