"""What the command line takes: every command's arguments (`parser`), read into the studio's records (the settings,
a request, `generate`'s Ask). studio.cli runs the commands."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from studio.spec.ask import Ask, Switches, read_prompts, resolve_stacks
from studio.spec.checks import ConfigError, parse_switch
from studio.spec.hosting import edge_environ
from studio.spec.request import image_inputs, parse_loras
from studio.spec.settings import Settings, install


def _switch(what: str):
    def parse(v: str):
        try:
            return parse_switch(v, what)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


# The per-request switches' help where a command reads them otherwise than generate and bench do: why each
# one is applied, or refused, there. No command here offers --threshold but generate: sweep varies it as a knob, and
# the tuner searches it.
SWITCH_HELP = {
    "sweep": (
        "true, or leave it out: every value of a cache knob runs with the cache on; false is refused (every value "
        "would run one uncached stack: bench --cache false times stacks without a cache)",
        "true|false: torch.compile on or off for every value's stack (base stays eager); default: the --preset's",
    ),
    "tune": (
        "true, or leave it out: the tuner searches the step cache (and base at fewer steps beside it); false is "
        "refused (nothing to search: bench --cache false times stacks without a cache)",
        "true|false: every non-cache option the tuner times compiled, or none (the result runs so); default: as "
        "shipped, the tuner picks",
    ),
}


def common_args(p: argparse.ArgumentParser, switches: str | None = None) -> None:
    """The request and stack arguments of every command that runs the model; `switches`: its key in SWITCH_HELP."""
    p.add_argument("--model", default=None, help="Hub id, local folder, or 'tiny' (the embedded model; default)")
    p.add_argument("--prompt", default=None, help="default: the model profile's first example prompt")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--steps", type=int, default=None, help="default: the model profile's")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--negative-prompt", default=None, help="the negative prompt (read with true CFG)")
    p.add_argument(
        "--true-cfg-scale",
        type=float,
        default=None,
        help="true CFG scale: 1 turns it off, above 1 two transformer calls per step (default: the model profile's)",
    )
    p.add_argument("--image", default=None, help="an input picture (PNG, JPEG): img2img; with --mask: inpaint")
    p.add_argument("--mask", default=None, help="the inpaint mask (white: repaint), resized to the picture")
    p.add_argument("--strength", type=float, default=None, help="with --image: how much of the schedule runs")
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="PATH[@SCALE]",
        help="a LoRA adapter (a .safetensors file, folder or Hub id, or the name of one the model ships: outline) at "
        "a scale (default 1); repeat for more",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=("bfloat16", "float16", "float32"),
        help="in place of what `dtype: auto` picks (as STUDIO_DTYPE)",
    )
    p.add_argument("--presets-dir", default=None, help="folder of user presets (also STUDIO_PRESETS_DIR)")
    plain = ("per-request cache switch: true|false", "per-request torch.compile switch: true|false")
    cache_help, compile_help = SWITCH_HELP.get(switches, plain)
    p.add_argument("--cache", type=_switch("cache switch"), default=None, help=cache_help)
    p.add_argument("--compile", type=_switch("compile switch"), default=None, help=compile_help)


def image_args(args, edits: bool = False) -> dict:
    """--image, --mask and --strength as the request takes them, converted as the UI's uploads are. An edit model's
    picture is a reference: strength 1 unless --strength says."""
    if not getattr(args, "image", None):
        if getattr(args, "mask", None) or getattr(args, "strength", None) is not None:
            raise ValueError("--mask and --strength are read with an input picture: give --image too")
        return {}
    import numpy as np
    from PIL import Image

    def read(path: str, mode: str):
        try:
            return Image.open(path).convert(mode)
        except OSError as e:  # a missing file, not a picture
            raise ValueError(f"{path}: cannot be read as a picture ({type(e).__name__}: {e})") from None

    mask = np.asarray(read(args.mask, "L")) if args.mask else None
    strength = args.strength if args.strength is not None else 1.0 if edits else 0.6
    return image_inputs(np.asarray(read(args.image, "RGB")), mask, strength)


def read_settings(args) -> Settings:
    """The CLI's edge: the environment read once into the settings, flags over it; installed for this process."""
    # cache-dit logs every hook to stdout (the --json output) unless told; children (the worker, Ray) inherit both
    os.environ.update(edge_environ(os.environ))
    s = Settings.from_env(os.environ)
    if getattr(args, "compare", "unset") is None:  # generate's --compare: the flag, STUDIO_COMPARE, or on
        args.compare = s.compare or "on"
    flags = {"dtype": getattr(args, "dtype", None), "presets_dir": getattr(args, "presets_dir", None)}
    return install(replace(s, **{k: v for k, v in flags.items() if v}))


def bench_args(sub) -> None:
    from studio.measure.quality import GOOD_DB  # (numpy only)

    b = sub.add_parser("bench", help="every preset (or --presets a,b) side by side on one request")
    common_args(b)
    b.add_argument("--presets", default=None, help="comma-separated preset names (default: all)")
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--extra-rounds", type=int, default=None, help="rounds beyond --repeats while a row is withheld")
    b.add_argument("--prompts", default=None, help="a file of prompts, one per line: one rotation per prompt")
    b.add_argument("--vs-raw", action="store_true", help="time each preset through plain diffusers too")
    b.add_argument("--json", action="store_true", help="print the rows and the run's settings as JSON")
    b.add_argument("--csv", action="store_true", help="print the rows as CSV")
    b.add_argument("--out", default=None, help="write the report: .md, .csv or .json by extension")
    b.add_argument("--seeds", default=None, help="comma-separated seeds: each prompt at each seed (default: --seed)")
    b.add_argument("--min-psnr", type=float, default=GOOD_DB, help="the PSNR a paired win needs (dB; default 30)")
    b.add_argument("--max-flip", type=float, default=None, help="the FLIP a paired win may not pass (default: none)")
    b.add_argument(
        "--fewer-steps",
        action="store_true",
        help="base at fewer steps beside the table: the fewest above --min-psnr, each cached row at its speed",
    )
    b.add_argument(
        "--plot",
        default=None,
        help="write the speed-up vs PSNR plot (PNG): one point per stack; over several prompts or seeds, one per "
        "prompt, one colour per stack",
    )
    b.add_argument(
        "--in-process", action="store_true", help="run here, not in the device worker (a native crash then ends it)"
    )


def tune_args(sub) -> None:
    t = sub.add_parser("tune", help="the fastest stack whose worst PSNR over the prompts stays above a floor")
    common_args(t, "tune")
    t.add_argument("--min-psnr", type=float, required=True, help="the floor, dB, for the worst prompt")
    t.add_argument(
        "--max-flip", type=float, default=None, help="and a ceiling on FLIP's mean error for the worst prompt (0-1)"
    )
    t.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: the profile's examples)")
    t.add_argument(
        "--search-prompts",
        default=None,
        help="search on these (a file, or 'examples': the profile's), then time the finalists on --prompts, which the "
        "search did not see (default: search and time on --prompts)",
    )
    t.add_argument("--name", default=None, help="the tuned preset's name (default tuned-<floor>db)")
    t.add_argument("--out", default=None, help="write the preset YAML here (default: into --presets-dir when given)")
    t.add_argument("--plot", default=None, help="write the search's threshold curve (PNG)")
    t.add_argument("--json", action="store_true")


def method_args(sub) -> None:
    """`python -m studio calibrate` and `python -m studio methods`: the step-cache methods (spec.methods)."""
    c = sub.add_parser("calibrate", help="MagCache's per-step ratios for this model, written into a preset")
    common_args(c)
    c.add_argument("--preset", default="magcache", help="a MagCache preset (default magcache; made when missing)")
    c.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: the profile's examples)")
    c.add_argument("--out", default=None, help="write the preset YAML here (default: into --presets-dir when given)")
    c.add_argument("--json", action="store_true")
    m = sub.add_parser("methods", help="every step-cache method at its best setting over a floor, side by side")
    common_args(m, "methods")
    m.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: the profile's examples)")
    m.add_argument("--min-psnr", type=float, default=None, help="the floor, dB, for the worst prompt (default 35)")
    m.add_argument("--max-flip", type=float, default=None, help="a ceiling on FLIP's mean error, worst prompt (0-1)")
    m.add_argument(
        "--search-prompts",
        default=None,
        help="a file of prompts the search runs over (default: --prompts'); 'examples': the profile's examples",
    )
    m.add_argument("--methods", default=None, help="comma-separated method names (default: every one)")
    m.add_argument("--repeats", type=int, default=3, help="timed rounds of the final bench")
    m.add_argument(
        "--also",
        default="cache",
        help="presets timed beside the methods for reference (default cache; e.g. a tuned one)",
    )
    m.add_argument("--json", action="store_true")
    m.add_argument(
        "--write",
        default=None,
        help="write each method's best as <method>-best.yaml into this folder (a presets folder: the Matrix's "
        "'all step caches' runs them on the model they were searched on)",
    )
    m.add_argument("--out", default=None, help="write the table (.md) or the record (.json)")
    m.add_argument("--plot", default=None, help="write speed-up against worst FLIP with the Pareto front (PNG)")


def seeds_of(text: str | None) -> list[int] | None:
    """--seeds "1,2,3" as ints; None without it."""
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: give whole numbers separated by commas, e.g. --seeds 1,2,3") from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m studio", description="DiT Speed Studio engine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="one measured generation, compared with base")
    common_args(g)
    g.add_argument("--preset", default="base")
    g.add_argument("--threshold", type=float, default=None, help="per-request residual diff threshold")
    g.add_argument(
        "--num-images-per-prompt",
        type=int,
        default=None,
        help="a batch of 1-4 pictures in one call (seeds seed .. seed+n-1; --out writes them top to bottom)",
    )
    g.add_argument("--out", default=None, help="write the image here (PNG)")
    g.add_argument("--json", action="store_true", help="print one JSON object with the metrics")
    g.add_argument("--ideal", action="store_true", help="also print how the ideal speed-up was worked out")
    g.add_argument(
        "--compare",
        default=None,
        choices=("on", "auto", "off"),
        help="on: base timed beside the run and PSNR against it (default, or STUDIO_COMPARE); auto: a kept base "
        "timing of the same shape (a fresh process has none: as on); off: the stack alone",
    )
    bench_args(sub)
    s = sub.add_parser("sweep", help="one cache knob over a prompt set: speed-up and worst PSNR, the cliff marked")
    common_args(s, "sweep")
    s.add_argument("--preset", default="cache")
    s.add_argument(
        "--knob",
        default="residual_diff_threshold",
        help="residual_diff_threshold, Fn_compute_blocks, "
        "Bn_compute_blocks, max_continuous_cached_steps, max_warmup_steps or steps_computation_mask",
    )
    s.add_argument("--values", default=None, help="comma-separated (default: a range for the knob)")
    s.add_argument("--thresholds", default=None, help="same as --knob residual_diff_threshold --values ...")
    s.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: the profile's examples)")
    s.add_argument("--repeats", type=int, default=1)
    s.add_argument("--json", action="store_true")
    s.add_argument("--out", default=None, help="write the table: .md or .json by extension")
    s.add_argument("--plot", default=None, help="write the curve (PNG)")
    tune_args(sub)
    method_args(sub)
    ps = sub.add_parser("presets", help="list presets and their stacks; export one for cache-dit")
    ps.add_argument("action", nargs="?", default="list", choices=("list", "export"))
    ps.add_argument("name", nargs="?", default=None)
    ps.add_argument("--format", default="cache-dit", choices=("cache-dit", "studio"))
    ps.add_argument("--steps", type=int, default=None, help="steps a step mask is sized to (default: the model's)")
    ps.add_argument("--out", default=None, help="write here (default: print)")
    ps.add_argument("--presets-dir", default=None, help="folder of user presets (also STUDIO_PRESETS_DIR)")
    d = sub.add_parser("doctor", help="every shipped preset on a tiny instance of every DiT family, on this machine")
    d.add_argument("--families", default=None, help="comma-separated (default: flux,qwen-image,sd3,z-image)")
    d.add_argument("--presets", default=None, help="comma-separated preset names (default: all shipped)")
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    pl = sub.add_parser("plan", help="what a preset would run on a device, part by part, and its memory plan")
    pl.add_argument("--device", default="here", help="here, or a named profile (spec.devices.PROFILES): h200, t4, ...")
    pl.add_argument("--model", default="tiny", help="tiny, a local folder, or a family with shipped configs")
    pl.add_argument("--preset", default="cache-int8-sage")
    pl.add_argument("--size", default=None, help="WxH (default: the model's)")
    pl.add_argument("--budget", type=float, default=None, help="device memory budget in GiB")
    pl.add_argument("--json", action="store_true", help="print one JSON object")
    pl.add_argument("--table", action="store_true", help="every named profile x every preset (docs/presets.md)")
    pl.add_argument("--presets-dir", default=None, help="folder of user presets (also STUDIO_PRESETS_DIR)")
    return ap


def request_of_args(args, profile):
    """The command's request, with the model `profile`'s defaults for what the arguments leave out."""
    return profile.request(
        args.prompt or profile.first_prompt,
        seed=args.seed,
        steps=args.steps,
        width=args.width,
        height=args.height,
        guidance=args.guidance,
        negative_prompt=args.negative_prompt,
        true_cfg_scale=args.true_cfg_scale,
        num_images_per_prompt=getattr(args, "num_images_per_prompt", None),
        loras=parse_loras("\n".join(args.lora)),
        **image_args(args, edits=profile.edits),
    )


def ask_of_args(runner, args) -> Ask:
    """A command's Ask, as the app builds one from its form: the request with the model profile's defaults, the
    switches, --prompts (else the profile's examples, for the commands that read a prompt set; bench: the request's
    own) and --seeds; `generate`'s --preset resolved once under the switches."""
    model = args.model or runner.model
    profile = runner.profile(model)
    switches = Switches.read(*(getattr(args, k, None) for k in ("cache", "threshold", "compile")))
    req = request_of_args(args, profile)
    if args.cmd == "generate":
        stacks, builtin = resolve_stacks("generate", [args.preset], runner.presets, switches)
        return Ask("generate", model, profile, req, stacks, builtin, switches, args.compare)
    prompts = read_prompts(args.prompts) or (list(profile.example_prompts) if args.cmd != "bench" else [])
    req = replace(req, prompt=prompts[0]) if prompts else req
    seeds = tuple(seeds_of(getattr(args, "seeds", None)) or ())
    repeats = getattr(args, "repeats", None) or 1
    return Ask(args.cmd, model, profile, req, switches=switches, prompts=tuple(prompts), seeds=seeds, repeats=repeats)
