"""Regenerate docs/benchmarks.md: run every command it shows, on this machine, and paste their output under them.

    python docs/make_benchmarks.py            # about 15 minutes on 2 CPU cores; run it on an otherwise idle machine

The text between the commands is written here; every number in the document comes from the commands' output.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
PY = "python"  # as shown; run with this interpreter

SECTIONS = [
    (
        "## Which 8-bit form, and which stack, on this CPU",
        "The named 8-bit stacks (`int8`, `cache-int8-sage`) run `quant_type: auto`, compiled: the form the device "
        "runs fastest (engine/quantize.py). Here they are side by side with the other form, each compiled "
        "(`int8-dq`, `cache-int8dq-sage`: int8_per_row, from docs/bench/forms/), with eager weight-only (the memory "
        "option) and the compiled stacks without 8-bit. Median of 3 round-robin repeats.",
        "-m studio bench --presets-dir docs/bench/forms --presets base,compile,cache-compile,int8,int8-dq,"
        "int8-weight-only,cache-int8-sage,cache-int8dq-sage --repeats 3 --out docs/bench/forms.json",
    ),
    (
        "## Every shipped preset, one request",
        "All ten shipped presets on the embedded model (28 steps, 64x64), timed round-robin after each stack's "
        "warm-up, median of 5. `vs base` is the median of the rounds' ratios (each run priced by its median full and "
        "cached steps) with half their range. `of ideal` is a cached preset's speed-up over its non-cache twin (the "
        "same stack without the cache, timed in the same rounds: `cache` over `base`, `cache-compile` over "
        "`compile`) divided by the ideal its counts allow (next sections): what the cache's own decision and "
        "bookkeeping cost.",
        "-m studio bench --repeats 5 --out docs/bench/bench-all.json --plot docs/bench/bench-all.png",
    ),
    (
        "## The studio against plain diffusers (`--vs-raw`)",
        "Each preset run again through plain diffusers (and plain cache-dit / torchao calls), in a worker process, "
        "timed the same way (first transformer call to the last step's end), each pair's order alternating. "
        "`studio/raw` is the studio's median over the plain one's; the plain run's picture is compared with the "
        "studio's (inf: the same pixels). On a shared 2-core machine this ratio moves by several percent from one run "
        "of the command to the next (each run's spread is printed under its table): read one run's value against "
        "that, not alone.",
        "-m studio bench --presets base,cache,int8 --repeats 9 --vs-raw --out docs/bench/vs-raw.json",
    ),
    (
        "## What a cached step costs: the ideal, worked through",
        "A cached step of an F1B0 cache runs the first block and reuses the residual of the rest; everything else a "
        "full step pays stays: the first block (a FLUX double-stream block, heavier than a single one), the model's "
        "own per-call work outside the blocks (time and text embedders, RoPE, the output norm and projection) and "
        "the scheduler step. So the ideal prices a cached step at the full step less the skipped blocks, each "
        "block's time measured by hooks on it in this run's own full steps (medians; per transformer call, twice "
        "per step with true CFG): ideal = steps / (full + cached x share). A compiled stack's blocks cannot be "
        "hooked: its share comes from the eager base beside it, and it says so. One run of `cache`, its numbers "
        "worked through:",
        "-m studio generate --preset cache --seed 42 --ideal",
    ),
    (
        "## The ideal at 128x128",
        "`cache` at 4x the image tokens, base beside it: the blocks weigh more against the fixed per-call work, so a "
        "cached step's share falls and the ideal rises; `of ideal` stays what the cache's own machinery costs.",
        "-m studio bench --presets base,cache --repeats 7 --width 128 --height 128",
    ),
    (
        "## Threshold sweep over the example prompts",
        "The `cache` preset at each residual threshold over the profile's five example prompts: median speed-up, "
        "worst and mean PSNR; the cliff is where worst PSNR drops the most from the value before.",
        "-m studio sweep --values 0.04,0.08,0.12,0.16,0.24,0.32,0.5,1.0 --plot docs/bench/sweep-threshold.png",
    ),
    (
        "## Tuning at 35 dB",
        "The tuner on the profile's five example prompts (its default), written as a preset.",
        "-m studio tune --min-psnr 35 --out docs/bench/tuned-35db.yaml --plot docs/bench/tune-curve.png",
    ),
    (
        "## The tuned preset on prompts it was not tuned on",
        "`docs/prompts-heldout.txt`: five other scenes of the grammar. One rotation per prompt; `vs base` is the "
        "median over prompts and `worst PSNR` the worst prompt's.",
        "-m studio bench --presets-dir docs/bench --presets base,cache,cache-compile,tuned-35db "
        "--prompts docs/prompts-heldout.txt --repeats 3",
    ),
    (
        "## Parallel presets on 2 Ray CPU workers",
        "Float32 (`STUDIO_DTYPE=float32`), so the parallel picture can be compared with one process bitwise; see "
        "[parallel.md](parallel.md) for what runs where and why it is slower on 2 cores.",
        "STUDIO_DTYPE=float32 -m studio bench --presets base,cache,ulysses2,cache-ulysses2 --repeats 3",
    ),
]


def run(args: str) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    words = args.split()
    while words and "=" in words[0] and not words[0].startswith("-"):  # leading VAR=value, as the shell reads them
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    p = subprocess.run([sys.executable] + words, cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{args} failed:\n{p.stderr[-3000:]}")
    return p.stdout


def main() -> None:
    head = (ROOT / "docs" / "benchmarks-head.md").read_text()
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")), "?")
    out = [head.rstrip(), "", f"Generated {datetime.date.today()} by `python docs/make_benchmarks.py` on {cpu}, "
           f"{os.cpu_count()} cores, Python {platform.python_version()}.", ""]  # fmt: skip
    for title, text, args in SECTIONS:
        print(title, file=sys.stderr)
        body = run(args)
        shown = " ".join(w for w in args.split() if "=" in w and not w.startswith("-") and w.isascii())
        shown = (shown + " " if shown and args.startswith(shown) else "") + f"{PY} " + args[len(shown) :].strip()
        out += [title, "", text, "", "```bash", shown, "```", "", body.rstrip(), ""]
        if "--plot" in args:
            png = args.split("--plot ")[1].split()[0]
            out += [f"![{title[3:]}]({Path(png).relative_to('docs')})", ""]
    tail = ROOT / "docs" / "benchmarks-tail.md"
    if tail.exists():
        out += [tail.read_text().rstrip(), ""]
    DOC.write_text("\n".join(out))
    print(f"wrote {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
