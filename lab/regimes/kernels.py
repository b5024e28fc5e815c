"""The non-cache kernels timed on a transformer of real size (GPU only), `python -m lab kernels`: each stack's ms per
transformer call against plain SDPA on a random-weight FLUX.1-dev transformer (random weights do not cache, but their
kernels time like trained ones). The regimes table builds its transformers from the same config."""

from __future__ import annotations

from dataclasses import dataclass

from studio.engine.attention import apply_attention
from studio.engine.compile import apply_compile
from studio.engine.device import profile_here
from studio.engine.quantize import apply_quant
from studio.measure.clock import time_calls
from studio.report import fmt
from studio.spec.preset import CompileSpec, QuantSpec

KERNEL_COLUMNS = ("stack", "ms per transformer call", "vs sdpa", "engaged")


# The non-cache techniques on a transformer of real size (GPU only): random weights do not cache, but their kernels
# time like trained ones. FLUX.1-dev's transformer config; 1024x1024 is 4096 image tokens.
FLUX_DEV = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
KERNEL_STACKS = ("sdpa", "sage", "int8", "compile")


@dataclass
class KernelRow:
    stack: str
    ms: float | None  # median ms per transformer call, None when it could not run here
    speedup: float | None
    note: str


def _flux_inputs(cfg: dict, tokens: int, text: int, device, dtype):
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    side = int(tokens**0.5)
    img_ids = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
    img_ids = torch.cat([torch.zeros(tokens, 1), img_ids.float()], 1).to(device)
    return dict(
        hidden_states=rnd(1, tokens, cfg["in_channels"]),
        encoder_hidden_states=rnd(1, text, cfg["joint_attention_dim"]),
        pooled_projections=rnd(1, cfg["pooled_projection_dim"]),
        timestep=torch.tensor([0.5], device=device, dtype=dtype),
        img_ids=img_ids,
        txt_ids=torch.zeros(text, 3, device=device),
        guidance=torch.tensor([3.5], device=device, dtype=dtype) if cfg.get("guidance_embeds") else None,
        return_dict=False,
    )


def _time_calls(tr, inputs: dict, repeats: int, device) -> float:
    """Median ms of `repeats` calls (studio.measure.clock), after one untimed call (compile happens there)."""
    import statistics

    import torch

    with torch.inference_mode():
        tr(**inputs)
        return statistics.median(time_calls(tr, repeats, device, **inputs))


def time_kernels(
    cfg: dict = FLUX_DEV, tokens: int = 4096, text: int = 512, device=None, repeats: int = 5, stacks=KERNEL_STACKS
):
    """Median ms per transformer call for each non-cache stack on a random-weight FluxTransformer2DModel built with
    `cfg` directly on `device` (bf16 on CUDA, float32 elsewhere), each against plain SDPA."""
    import torch
    from diffusers import FluxTransformer2DModel

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    inputs = _flux_inputs(cfg, tokens, text, device, dtype)
    rows, base = [], None
    for stack in ("sdpa",) + tuple(s for s in stacks if s != "sdpa"):
        with torch.device(device):
            tr = FluxTransformer2DModel(**cfg).to(dtype).eval()
        holder = type("Pipe", (), {"transformer": tr})()
        if stack == "sage":
            e = apply_attention(holder, "sage", device)
        elif stack == "int8":
            e = apply_quant(holder, QuantSpec(quant_type="int8_weight_only"), profile_here(device), device)
        elif stack == "compile":
            e = apply_compile(holder, CompileSpec(enabled=True), cache_engaged=False)
        else:
            e = apply_attention(holder, "sdpa", device)
        ms = _time_calls(tr, inputs, repeats, device) if e.engaged or stack == "sdpa" else None
        base = ms if stack == "sdpa" else base
        rows.append(KernelRow(stack, ms, (base / ms) if ms and base else None, e.detail))
        del tr, holder
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def kernel_table(kernels) -> str:
    """The doctor's KernelRows: ms per transformer call of each non-cache stack, against plain SDPA."""
    cells = [[k.stack, "n/a" if k.ms is None else f"{k.ms:.1f}", fmt.speedup(k.speedup), k.note] for k in kernels]
    head = ["| " + " | ".join(KERNEL_COLUMNS) + " |", "|" + "---|" * len(KERNEL_COLUMNS)]
    return "\n".join(head + ["| " + " | ".join(c) + " |" for c in cells])


def main(argv=None) -> int:
    """`python -m lab kernels`: the table on this machine's GPU (on a CPU: said, and nothing timed)."""
    import argparse
    import json
    import sys
    from dataclasses import asdict

    import torch

    ap = argparse.ArgumentParser(prog="python -m lab kernels", description=main.__doc__)
    ap.add_argument("--stacks", default=None, help=f"comma-separated subset of {','.join(KERNEL_STACKS)}")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (slow: a FLUX-sized model)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None:
        print("kernels: no CUDA device here; pass --device cpu to time a FLUX-sized model on the CPU", file=sys.stderr)
        return 2
    stacks = tuple(args.stacks.split(",")) if args.stacks else KERNEL_STACKS
    rows = time_kernels(device=device, stacks=stacks)
    print(json.dumps([asdict(r) for r in rows], indent=1) if args.json else kernel_table(rows))
    return 0
