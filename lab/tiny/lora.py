"""Example LoRAs of the embedded model: its own scenes drawn in a style, learned by a small adapter in minutes.

    python -m lab lora train --style outline --out studio/models/tiny/loras/outline
    python -m lab lora sheet --lora outline --out docs/img/lora-outline.png
    python -m lab lora numbers --lora outline --presets cache,cache-int8,cache-compile

`train`: the embedded model's weights stay frozen; peft adapters on the attention projections of every block
learn, by train.py's own flow-matching loop (`train_denoiser`, the transformer alone), from a pool of training
scenes drawn in the style (`scenes.render(style=...)`) and encoded by the model's own VAE with its own shift and
scale (`encode_pool(refit=False)`). Written with diffusers' `save_lora_weights` and the adapter's config, so it
loads as trained, plus `lora.json` (the command, seed, steps, loss) and a README. The studio offers a folder of
studio/models/tiny/loras by its name (`--lora outline@0.8`; studio.spec.profiles.shipped_loras).

`sheet`: base and the LoRA side by side on three prompts, through the studio's own engine (Runner, `base`).
`numbers`: each preset with the LoRA, measured as `python -m studio generate --lora ...` measures it (against `base`
with the same LoRA), plus its PSNR against the plain base (no LoRA); a quantized preset gets the LoRA as its own
`loras` (fused before quantization: a request's LoRA on quantized weights is refused).
A tool with its own commands: each imports what it runs (the engine, the trainer) inside its function.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from studio.spec.hosting import edge_environ
from studio.spec.settings import Settings, current, install

SHEET_PROMPTS = (
    "a red circle in the center, white background",
    "a blue square on the left and a yellow triangle on the right, green background",
    "a purple triangle at the top, orange background",
)
TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # every block's attention projections (single blocks: no to_out)
LOOKS = {"outline": "every object ringed in the palette's black"}  # each of scenes.STYLES, in words


def _parser() -> argparse.ArgumentParser:
    from lab.tiny.scenes import STYLES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a LoRA of the embedded model on its scenes drawn in a style")
    t.add_argument("--style", choices=STYLES, required=True)
    t.add_argument("--out", type=Path, required=True, help="the LoRA's folder (e.g. studio/models/tiny/loras/NAME)")
    t.add_argument("--steps", type=int, default=800)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--pool", type=int, default=4096, help="styled training scenes, encoded once")
    t.add_argument("--pair-share", type=float, default=0.5, help="share of two-object scenes in the pool")
    t.add_argument("--rank", type=int, default=8)
    t.add_argument("--alpha", type=float, default=8.0)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False, help="torch.compile it")
    t.add_argument("--threads", type=int, default=1, help="torch threads (1 leaves a core to the machine's others)")
    t.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("sheet", help="base and a LoRA side by side on three prompts (PNG)")
    s.add_argument("--lora", default="outline", help="a shipped name or a path, as --lora takes it (NAME[@SCALE])")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--seed", type=int, default=0)
    n = sub.add_parser("numbers", help="presets with a LoRA: PSNR against base with it and without it, speed-up")
    n.add_argument("--lora", default="outline", help="a shipped name or a path (NAME[@SCALE])")
    n.add_argument("--presets", default="cache,cache-int8,cache-compile")
    n.add_argument("--prompt", default=None, help="default: the model profile's first example prompt")
    n.add_argument("--seed", type=int, default=42)
    n.add_argument("--json", action="store_true", help="print the rows as JSON")
    return ap


def train(args) -> dict:
    """Train the LoRA of args.style and write it into args.out; returns what lora.json records."""
    import torch
    from diffusers import FluxPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from tqdm import tqdm

    from lab.tiny.train import _curve, encode_pool, train_denoiser
    from studio.spec.profiles import EMBEDDED_DIR
    from studio.tiny.build import TinyConfig

    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)  # the adapters' initial lora_A
    stats = json.loads((EMBEDDED_DIR / "train_stats.json").read_text())
    cfg = TinyConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in stats["config"].items()})
    pipe = FluxPipeline.from_pretrained(EMBEDDED_DIR, dtype=torch.float32)
    for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        m.eval().requires_grad_(False)
    lcfg = LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=list(TARGETS), init_lora_weights=True)
    pipe.transformer.add_adapter(lcfg)  # the adapters are the only weights that require grad
    n_lora = sum(p.numel() for p in pipe.transformer.parameters() if p.requires_grad)
    t0 = time.perf_counter()
    prompts, latents = encode_pool(
        pipe, cfg, args.pool, rng, pair_share=args.pair_share, style=args.style, refit=False
    )
    t_pool = time.perf_counter() - t0
    with tqdm(total=args.steps, desc=f"LoRA {args.style}", mininterval=5) as bar:
        losses, _ = train_denoiser(
            pipe,
            cfg,
            prompts,
            latents,
            steps=args.steps,
            batch=args.batch,
            rng=rng,
            bar=bar,
            lr=args.lr,
            compile_transformer=args.compile,
            train=("transformer",),
        )
    seconds = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    FluxPipeline.save_lora_weights(
        args.out,
        transformer_lora_layers=get_peft_model_state_dict(pipe.transformer),
        transformer_lora_adapter_metadata=lcfg.to_dict(),
    )
    knobs = ("style", "steps", "batch", "pool", "pair_share", "rank", "alpha", "lr", "compile", "threads", "seed")
    record = {
        "command": "python -m lab lora " + shlex.join(sys.argv[1:] if args.argv is None else args.argv),
        **{k: getattr(args, k) for k in knobs},
        "targets": list(TARGETS),
        "lora_parameters": n_lora,
        "pool_seconds": round(t_pool, 1),
        "total_seconds": round(seconds, 1),
        "first_loss": round(float(np.mean(losses[:20])), 5),
        "final_loss": round(float(np.mean(losses[-50:])), 5),
        "loss_curve": _curve(losses, 25),
        "file_bytes": (args.out / "pytorch_lora_weights.safetensors").stat().st_size,
    }
    (args.out / "lora.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "README.md").write_text(_readme(record))
    return record


def _readme(r: dict) -> str:
    return f"""# {r["style"]}: an example LoRA of the embedded model

The embedded model's scenes drawn in the `{r["style"]}` style (lab/tiny/scenes.py): {LOOKS[r["style"]]}.
Rank {r["rank"]}, alpha {r["alpha"]:g}, on {", ".join(r["targets"])} of every block:
{r["lora_parameters"]:,} parameters, {r["file_bytes"]:,} bytes. Made by

    {r["command"]}

in {r["total_seconds"]:.0f} s on {r["threads"]} CPU thread(s): {r["steps"]} steps of batch {r["batch"]}, a pool of
{r["pool"]} styled training scenes, seed {r["seed"]}. Flow-matching loss {r["first_loss"]} over the first 20 steps,
{r["final_loss"]} over the last 50 (`lora.json` has the curve). Use it by name: `--lora {r["style"]}@0.8`
(docs/lora.md).
"""


def sheet(args) -> None:
    """Base, the LoRA at half its scale and at its scale on SHEET_PROMPTS through the studio's engine, one row per
    prompt; the ring's luminance (scenes.ring_luminance, 0-255) printed for each."""
    from lab.tiny.eval import contact_sheet
    from lab.tiny.scenes import parse_prompt, ring_luminance
    from studio.engine import ModelManager, Runner
    from studio.spec.lora import parse_loras

    runner = Runner(ModelManager("cpu", settings=current()), model="tiny")  # (main installed them: its edge)
    (lora,) = parse_loras(args.lora)
    columns = [(), (replace(lora, scale=lora.scale / 2),), (lora,)]
    names = ["base"] + [c[0].label() for c in columns[1:]]
    rows = []
    try:
        for prompt in SHEET_PROMPTS:
            req = runner.request(prompt, model="tiny", seed=args.seed)
            images = [runner.generate(replace(req, loras=c), "base", compare="off").image for c in columns]
            lum = [ring_luminance(im, parse_prompt(prompt)) for im in images]
            print(f"{prompt}: ring luminance " + ", ".join(f"{n} {v:.0f}" for n, v in zip(names, lum)))
            rows.append((f"{prompt} (columns: {', '.join(names)})", images))
    finally:
        runner.manager.unload()
    contact_sheet(rows, args.out, scale=3)


def numbers(args) -> list[dict]:
    """One row per preset: the LoRA's run against `base` with the LoRA (the studio's own pairing, timing and counts)
    and against the plain base picture."""
    from studio.engine import ModelManager, Runner
    from studio.measure.quality import psnr
    from studio.spec.lora import parse_loras

    runner = Runner(ModelManager("cpu", settings=current()), model="tiny")  # (main installed them: its edge)
    loras = parse_loras(args.lora)
    req = runner.request(args.prompt or runner.profile("tiny").first_prompt, model="tiny", seed=args.seed)
    rows = []
    try:
        plain = runner.generate(req, "base", compare="off").image
        for name in args.presets.split(","):
            preset = runner.resolve_preset(name.strip())
            if preset.quantize_config.enabled:  # the LoRA in the preset's own loras: fused, then quantized
                own = loras[0].path if loras[0].is_name else "lora"
                preset = replace(preset, name=f"{preset.name}-{own}", loras=loras)
                res = runner.generate(req, preset)
            else:
                res = runner.generate(replace(req, loras=loras), preset)
            m = res.metrics
            rows.append(
                {
                    "preset": preset.name,
                    "lora": loras[0].label(),
                    "psnr_vs_base_with_lora_db": m.quality.psnr_db,
                    "psnr_vs_plain_base_db": psnr(res.image, plain),
                    "cached_steps": m.cache.cached_steps,
                    "full_steps": m.cache.full_steps,
                    "speedup": m.timing.speedup,
                    "speedup_lo": m.timing.speedup_lo,
                    "speedup_hi": m.timing.speedup_hi,
                    "speedup_note": m.timing.speedup_note,
                    "compile_s": m.timing.compile_s,
                    "dtype": m.labels.dtype,
                }
            )
    finally:
        runner.manager.unload()
    return rows


def _numbers_text(rows: list[dict]) -> str:
    from studio.report.fmt import speedup_ci

    out = [
        "| preset + LoRA | PSNR vs base with the LoRA | PSNR vs plain base | cached / full | speed-up |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        sp = speedup_ci(r["speedup"], r["speedup_lo"], r["speedup_hi"]) if r["speedup"] else None
        sp = sp or f"withheld: {r['speedup_note']}"
        out.append(
            f"| {r['preset']} ({r['lora']}, {r['dtype']}) | {r['psnr_vs_base_with_lora_db']:.2f} dB | "
            f"{r['psnr_vs_plain_base_db']:.2f} dB | {r['cached_steps']} / {r['full_steps']} | {sp} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    args.argv = argv
    # an entry point, so an edge: the environment read once, as app.py and the CLI do (spec.settings, spec.hosting)
    os.environ.update(edge_environ(os.environ))
    install(Settings.from_env(os.environ))
    if args.cmd == "train":
        r = train(args)
        print(
            f"wrote {args.out}: {r['file_bytes']:,} bytes, loss {r['first_loss']} -> {r['final_loss']}, "
            f"{r['total_seconds']:.0f} s"
        )
    elif args.cmd == "sheet":
        sheet(args)
    else:
        rows = numbers(args)
        print(json.dumps(rows, indent=1) if args.json else _numbers_text(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
