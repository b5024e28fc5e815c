"""Train the embedded tiny model from scratch on procedurally drawn scenes and write the pipeline folder.

    python -m lab train [--out DIR] [--vae-steps N] [--steps N] [--threads 2]

Two stages: (1) the VAE learns to reconstruct drawn scenes; (2) its latents of a pool of jittered scenes train
the FLUX transformer together with both text encoders (FLUX gives text tokens no position, so word order has
to come from T5) by flow matching, with an EMA of the weights. Text goes through the pipeline's own
`encode_prompt`, latents through its own packing, so training sees exactly what inference feeds the model.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from lab.tiny.scenes import COLOURS, PLACES, SHAPES, parse_prompt, render, sample_scene
from studio.tiny.build import DEFAULT_DIR, TinyConfig, build_pipeline, write_profile

log = logging.getLogger("lab.tiny.train")


def _to_tensor(imgs) -> torch.Tensor:
    arr = np.stack([np.asarray(im, dtype=np.float32) for im in imgs]) / 127.5 - 1.0
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()


def _draw_batch(rng: random.Random, n: int, size: int, two_share: float, style: str | None = None, varied=False):
    scenes = [sample_scene(rng, two_objects=rng.random() < two_share) for _ in range(n)]
    return scenes, _to_tensor([render(s, size, rng, style=style, varied=varied) for s in scenes])


def train_vae(pipe, cfg: TinyConfig, steps: int, batch: int, rng: random.Random, bar, varied=False) -> list[float]:
    vae = pipe.vae
    vae.train()
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=max(steps, 2), pct_start=0.05)
    losses = []
    for _ in range(steps):
        _, x = _draw_batch(rng, batch, cfg.size, 0.4, varied=varied)
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
        kl = post.kl().mean() / (x[0].numel())
        loss = (rec - x).abs().mean() + 2.0 * (rec - x).pow(2).mean() + 1e-6 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(stage="vae", loss=f"{np.mean(losses[-50:]):.4f}", refresh=False)
        bar.update(1)
    vae.eval()
    return losses


@torch.no_grad()
def encode_pool(
    pipe,
    cfg: TinyConfig,
    n: int,
    rng: random.Random,
    chunk: int = 64,
    pair_share: float = 0.45,
    *,
    style: str | None = None,
    refit: bool = True,
    varied: bool = False,
):
    """Latents (posterior means) of a pool of jittered training scenes drawn in `style`, and their prompts.

    refit: set the VAE's shift and scale from this pool (the model's own training); False keeps the model's (a
    LoRA of a trained model)."""
    prompts, lats = [], []
    for i in range(0, n, chunk):
        scenes, x = _draw_batch(rng, min(chunk, n - i), cfg.size, pair_share, style, varied)
        prompts += [s.prompt for s in scenes]
        lats.append(pipe.vae.encode(x).latent_dist.mean)
    z = torch.cat(lats)
    if refit:
        shift = z.mean().item()
        scale = 1.0 / (z - shift).std().item()
        pipe.vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    shift, scale = pipe.vae.config.shift_factor, pipe.vae.config.scaling_factor
    return prompts, (z - shift) * scale


# ----------------------------------------------------------------------------------------------------------------
# Binding: every T5 token should say which object it describes. FLUX's text tokens carry no position, and the
# denoising loss alone taught a 3-layer T5 only a bag of words: a linear probe read the right colour of its
# object off a place word for 36% of two-object prompts (two colours, so a bag of words caps it near 50%), and
# two-object prompts came out with the colours swapped. A training-only linear head asks each token of an
# object's phrase for that object's colour, shape and place (background tokens: the background colour). It is
# trained first on the text alone, then alongside the denoiser; it is not part of the saved pipeline.

N_COLOURS, N_SHAPES, N_PLACES = len(COLOURS), len(SHAPES), len(PLACES)
IGNORE = -100


def binding_targets(prompts: list[str], tokenizer, text_len: int) -> torch.Tensor:
    """[n, text_len, 3] long: (colour, shape, place) of the object each T5 token belongs to; IGNORE for "and",
    ",", EOS and padding; background words get the background colour only."""
    colours, shapes, places = list(COLOURS), list(SHAPES), list(PLACES)
    out = torch.full((len(prompts), text_len, 3), IGNORE, dtype=torch.long)
    for n, prompt in enumerate(prompts):
        scene = parse_prompt(prompt)
        segment = 0
        for i, piece in enumerate(tokenizer.tokenize(prompt)[:text_len]):
            if piece == "\u2581and":
                segment = 1
            elif piece == ",":
                segment = 2
            elif segment < len(scene.objects):
                o = scene.objects[segment]
                out[n, i] = torch.tensor([colours.index(o.colour), shapes.index(o.shape), places.index(o.place)])
            else:
                out[n, i, 0] = colours.index(scene.background)
    return out


def binding_loss(head: torch.nn.Linear, emb: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(emb)
    ce = torch.nn.functional.cross_entropy
    heads = logits.split([N_COLOURS, N_SHAPES, N_PLACES], dim=-1)
    return sum(ce(h.flatten(0, 1), targets[..., k].flatten(), ignore_index=IGNORE) for k, h in enumerate(heads)) / 3


def pretrain_binding(pipe, cfg, prompts, targets, *, steps, batch, g, bar, lr=2e-3) -> tuple[torch.nn.Linear, list]:
    """Train T5 and the binding head on the text alone (cheap: no image), so the denoiser starts from tokens
    that already know their object."""
    head = torch.nn.Linear(cfg.t5_dim, N_COLOURS + N_SHAPES + N_PLACES)
    t5 = pipe.text_encoder_2
    t5.train()
    params = list(t5.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, len(prompts), (batch,), generator=g)
        emb = pipe._get_t5_prompt_embeds(
            prompt=[prompts[i] for i in idx.tolist()], max_sequence_length=cfg.text_len, device="cpu"
        )
        loss = binding_loss(head, emb, targets[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(stage="text", loss=f"{np.mean(losses[-50:]):.4f}", refresh=False)
        bar.update(1)
    return head, losses


def train_denoiser(
    pipe,
    cfg,
    prompts,
    latents,
    *,
    steps,
    batch,
    rng,
    bar,
    lr=6e-4,
    head=None,
    targets=None,
    aux_weight=0.0,
    compile_transformer=False,
    train=("transformer", "text_encoder", "text_encoder_2"),
) -> tuple[list[float], list[float]]:
    """Flow matching on the pool's latents: the pipeline modules named in `train` learn (a LoRA: the transformer
    alone, its adapters its only trainable weights); an EMA of what learns replaces them at the end."""
    modules = [getattr(pipe, name) for name in train]
    live = [p for m in modules for p in m.parameters() if p.requires_grad]  # what learns, and the EMA follows
    params = live + (list(head.parameters()) if head is not None else [])
    for m in modules:
        m.train()
    ema = [copy.deepcopy(m).eval().requires_grad_(False) for m in modules]
    # Inductor fuses the many small elementwise ops around the matmuls (RoPE, modulation, GELU): a whole training
    # step went from 1.5 to about 2.3 steps/s on 2 CPU cores, for about 40 s of compiling. The compiled wrapper
    # shares the parameters; the EMA copies and the saved pipeline are the plain modules.
    net = torch.compile(pipe.transformer) if compile_transformer else pipe.transformer
    shadow = [q for e, m in zip(ema, modules) for q, p in zip(e.parameters(), m.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    warm = min(200, steps // 10 + 1)

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    h = w = cfg.size // cfg.vae_scale
    img_ids = pipe._prepare_latent_image_ids(batch, h // 2, w // 2, "cpu", torch.float32)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    losses, aux_losses = [], []
    for step in range(steps):
        idx = torch.randint(0, len(prompts), (batch,), generator=g)
        x0 = pipe._pack_latents(latents[idx], batch, cfg.latent_channels, h, w)
        noise = torch.randn(x0.shape, generator=g)
        # Half logit-normal (where the detail is decided), half uniform (so the ends of the schedule are seen).
        sig = torch.where(
            torch.rand(batch, generator=g) < 0.5,
            torch.sigmoid(torch.randn(batch, generator=g)),
            torch.rand(batch, generator=g),
        ).clamp(1e-3, 1.0)
        xt = (1 - sig[:, None, None]) * x0 + sig[:, None, None] * noise
        emb, pooled, txt_ids = pipe.encode_prompt(
            prompt=[prompts[i] for i in idx.tolist()], prompt_2=None, device="cpu", max_sequence_length=cfg.text_len
        )
        pred = net(
            hidden_states=xt,
            timestep=sig,
            guidance=None,
            pooled_projections=pooled,
            encoder_hidden_states=emb,
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
        loss = (pred - (noise - x0)).pow(2).mean()
        losses.append(loss.item())
        if head is not None and aux_weight > 0:
            aux = binding_loss(head, emb, targets[idx])
            aux_losses.append(aux.item())
            loss = loss + aux_weight * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(shadow, live, 1 - decay)
        bar.set_postfix(stage="dit", loss=f"{np.mean(losses[-100:]):.4f}", refresh=False)
        bar.update(1)
    for name, e in zip(train, ema):
        setattr(pipe, name, e)
    return losses, aux_losses


def _curve(losses: list[float], every: int) -> list[float]:
    """Mean loss over each run of `every` steps (the last run may be shorter), rounded for the stats file."""
    return [round(float(np.mean(losses[i : i + every])), 5) for i in range(0, len(losses), every)]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--vae-steps", type=int, default=500)
    ap.add_argument("--steps", type=int, default=5800)
    ap.add_argument("--vae-batch", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--pool", type=int, default=24000)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--t5-layers", type=int, default=3)
    ap.add_argument("--text-steps", type=int, default=300, help="binding pre-training of T5 on the text alone")
    ap.add_argument("--text-batch", type=int, default=128)
    ap.add_argument("--aux-weight", type=float, default=0.1, help="weight of the binding loss in the denoiser stage")
    ap.add_argument("--pair-share", type=float, default=0.6, help="share of two-object scenes in the latent pool")
    ap.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=True, help="torch.compile the transformer"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--varied",
        action="store_true",
        help="draw what a prompt leaves open at random (lab.tiny.scenes): a model that needs its steps",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", type=Path, default=None, help="log file (default: <out>/train_log.txt)")
    return ap


def _save(pipe, cfg, args, t_vae: float, total: float, curves: dict) -> None:
    """The pipeline in bf16, its training stats and its studio profile, in args.out."""
    pipe.to(torch.bfloat16)
    pipe.save_pretrained(args.out, safe_serialization=True)
    knobs = ("seed", "threads", "vae_steps", "steps", "batch", "pool", "pair_share", "text_steps", "text_batch")
    stats = {"config": cfg.as_dict(), **{k: getattr(args, k) for k in knobs}}
    stats.update(aux_weight=args.aux_weight, compile=args.compile)
    stats.update(vae_seconds=round(t_vae, 1), total_seconds=round(total, 1), **curves)
    (args.out / "train_stats.json").write_text(json.dumps(stats, indent=1))
    write_profile(args.out, cfg)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.log or args.out / "train_log.txt"
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.FileHandler(log_path, mode="w"), logging.StreamHandler()],
    )
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    cfg = TinyConfig(heads=args.heads, t5_layers=args.t5_layers)
    pipe = build_pipeline(cfg, seed=args.seed)
    log.info(
        "config %s, threads %d, vae %d steps, denoiser %d steps x %d",
        cfg.as_dict(),
        args.threads,
        args.vae_steps,
        args.steps,
        args.batch,
    )
    t0 = time.perf_counter()
    with tqdm(total=args.vae_steps + args.text_steps + args.steps, desc="training tiny FLUX", mininterval=5) as bar:
        vae_losses = train_vae(pipe, cfg, args.vae_steps, args.vae_batch, rng, bar, varied=args.varied)
        t_vae = time.perf_counter() - t0
        log.info(
            "vae done in %.0fs, final loss %.4f", t_vae, np.mean(vae_losses[-50:]) if vae_losses else float("nan")
        )
        prompts, latents = encode_pool(pipe, cfg, args.pool, rng, pair_share=args.pair_share, varied=args.varied)
        log.info(
            "pool of %d latents; vae shift %.4f scale %.4f",
            len(prompts),
            pipe.vae.config.shift_factor,
            pipe.vae.config.scaling_factor,
        )
        targets = binding_targets(prompts, pipe.tokenizer_2, cfg.text_len)
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        head, text_losses = pretrain_binding(
            pipe, cfg, prompts, targets, steps=args.text_steps, batch=args.text_batch, g=g, bar=bar
        )
        log.info(
            "text binding pre-training done at %.0fs, final loss %.4f",
            time.perf_counter() - t0,
            np.mean(text_losses[-50:]) if text_losses else float("nan"),
        )
        dit_losses, aux_losses = train_denoiser(
            pipe,
            cfg,
            prompts,
            latents,
            steps=args.steps,
            batch=args.batch,
            rng=rng,
            bar=bar,
            head=head,
            targets=targets,
            aux_weight=args.aux_weight,
            compile_transformer=args.compile,
        )
    total = time.perf_counter() - t0
    log.info(
        "denoiser done; final loss %.4f; total %.0fs",
        np.mean(dit_losses[-100:]) if dit_losses else float("nan"),
        total,
    )
    curves = {
        "vae_loss_curve": _curve(vae_losses, 50),
        "text_loss_curve": _curve(text_losses, 50),
        "dit_loss_curve": _curve(dit_losses, 100),
        "binding_loss_curve": _curve(aux_losses, 100),
    }
    _save(pipe, cfg, args, t_vae, total, curves)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
