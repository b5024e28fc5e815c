"""docs/benchmarks.md, whole, from this generator: its text is written here, every number is a command's output.

    python docs/make_benchmarks.py                      # run every section this machine can run, then write the doc
    python docs/make_benchmarks.py --sections forms,ideal   # only these (the others keep their stored output)
    python docs/make_benchmarks.py --assemble           # no runs: write the doc from the stored outputs
    python docs/make_benchmarks.py --check              # seconds, no runs: does the committed doc still hold?
    python docs/make_benchmarks.py --list               # the sections, where each was last measured

Running a section stores its verbatim output with the machine, date and commit in docs/bench/runs/<section>.json;
the doc is assembled from those records only, so a section measured elsewhere (a CPU with AMX-INT8) stays as it was
measured, under a heading that says where and when. `.ci/gpu-check` writes the GPU section's records
(docs/bench/gpu/gpu-check-<date>.md). The whole run takes about 15 minutes on 2 CPU cores: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
RUNS = ROOT / "docs" / "bench" / "runs"
GPU_DIR = ROOT / "docs" / "bench" / "gpu"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: the studio is imported from this checkout
ME = "python docs/make_benchmarks.py"
# What the presets run and what the bench measures, as a count: a record made under an older one is stale. Bump it
# (and say why below) when a change makes every stored output describe something the presets no longer are.
EPOCH = 2
EPOCH_WHY = {
    1: "measured before the 8-bit forms (float8 and int8 picked per device, compiled), memory offload and Sage 1 "
    "(commit 0d42907): the named 8-bit presets then ran INT8 weight-only eagerly"
}
MEASURING = ("studio/measure", "studio/bench")  # the code a number is measured with: a record names its hash
NOT_MEASURING = ("lab/soak/plan.py", "lab/soak/visitors.py")  # the soak times no speed-up
TRACKED = ("studio", "presets", "docs/make_benchmarks.py", "docs/bench/forms", "docs/prompts-heldout.txt")
FLAGS = (("amx_int8", "AMX-INT8"), ("avx512_bf16", "avx512_bf16"), ("avx512_vnni", "AVX512-VNNI"))
DERIVED = ("-eager", "-nocache")  # the twins a bench adds under a preset's name (studio/bench/twins.py)
AGAIN = " (again)"
FORM_RE = re.compile(r"\b(?:u?int|float|fp)\d+_[a-z0-9_]+\b")
TAG_RE = re.compile(r"\b(?:fp32|bf16|fp16|auto)((?:\+[A-Za-z0-9_.]+)+)")
QUANT_PART_RE = re.compile(r"^(?:q\d+|u?int\d+[a-z]*|fp\d+[a-z]*|float\d+[a-z]*)$")
PRESET_MARK = re.compile(r"\{p:([a-z0-9-]+)\}")  # how the texts below name a preset: checked against the library


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    text: str  # presets named as {p:name}
    command: str  # as run with this interpreter; shown after "python "
    needs: str = ""  # a CPU flag the measuring machine must have
    fenced: bool = False  # plain-text output, shown in a code block (tables are shown as they are)

    @property
    def plot(self) -> str | None:
        words = self.command.split()
        return words[words.index("--plot") + 1] if "--plot" in words else None


FORMS_PRESETS = "base,compile,cache-compile,int8,int8-dq,int8-weight-only,cache-int8-sage,cache-int8dq-sage"
SECTIONS = [
    Section(
        "auto-forms",
        "What `quant_type: auto` picks on the measuring CPU",
        "The engine's resolver (studio/engine/quantize.py) asked, for every shipped preset with an 8-bit transformer, "
        "which form runs on the CPU that ran the command, and why: the pick depends on the CPU's flags and on "
        "whether the stack compiles, so no model runs. Then the same resolver's rule for other CPU kinds (their "
        "flags given to it: a rule, not a measurement) and the dtype `auto` picks here.",
        "docs/make_benchmarks.py --auto-forms",
    ),
    Section(
        "interval",
        "What the speed-up's interval holds",
        "Every speed-up is shown with {interval}. How often each interval shape held the 10-pair quiet point over "
        "windows of k consecutive pairs of runs recorded quiet and beside a CPU hog (tests/data/step_timings.json, "
        "no model runs), and the studio's shape's coverage, which the "
        "label above is made from (studio/measure/estimate.py: COVERAGE; a test recomputes it).",
        "tests/data/compare_estimators.py --intervals",
    ),
    Section(
        "forms",
        "The 8-bit forms side by side",
        "The named 8-bit stacks ({p:int8}, {p:cache-int8-sage}) run `quant_type: auto`, compiled: the form the "
        "section above names. Here they are beside the other forms, each compiled ({p:int8-dq} and "
        "{p:cache-int8dq-sage}: int8_per_row, from docs/bench/forms/), eager weight-only ({p:int8-weight-only}, the "
        "memory option) and the compiled stacks without 8-bit. The bench adds each compiled stack's eager twin "
        "(rows named -eager) and each cached stack's twin without the cache (-nocache).",
        "-m studio bench --presets-dir docs/bench/forms --presets " + FORMS_PRESETS + " --repeats 3 "
        "--out docs/bench/forms.json",
    ),
    Section(
        "forms-amx",
        "The 8-bit forms on a CPU with AMX-INT8",
        "The same stacks on a CPU with AMX-INT8 (the `amx_int8` flag: Intel Xeon, Sapphire Rapids or later), where "
        "the resolver picks int8_per_row for a compiled stack: the measurement that choice rests on. Only such a "
        "machine runs this section; everywhere else the generator keeps its stored output as it was measured.",
        "-m studio bench --presets-dir docs/bench/forms --presets " + FORMS_PRESETS + " --repeats 3 "
        "--out docs/bench/forms-amx.json",
        needs="amx_int8",
    ),
    Section(
        "processes",
        "Compiled rows from process to process (`--processes 2`)",
        "A compiled stack's speed is a property of the process that compiled it, which no pairing inside one process "
        "removes. `--processes 2` times each compiled stack (with base and its twins) again in a fresh device "
        "worker and says how far apart the two processes read it; the largest spread is kept in this machine's "
        "record and every later bench with a compiled row states it under its table (the `compiled rows` line): two "
        "benches' compiled rows within that agree as well as two processes can. Eager rows are held to 10%.",
        "-m lab processes --presets base,compile,cache-compile,cache-int8-sage --repeats 5 --processes 2",
    ),
    Section(
        "bench-all",
        "Every shipped one-process preset, one request",
        "Every shipped preset that runs in one process (`python -m studio presets` lists them all; the parallel ones "
        "are in their own section below) on the embedded model, timed round-robin after each stack's warm-up, median "
        "of the command's repeats. `vs base` is {estimator}. `of ideal` is a cached preset's speed-up over its "
        "non-cache twin "
        "(the same stack without the cache, timed in the same rounds: {p:cache} over {p:base}, {p:cache-compile} "
        "over {p:compile}) divided by the ideal its counts allow (the ideal's sections below): what the cache's own "
        "decision and bookkeeping cost.",
        "-m studio bench --repeats 5 --out docs/bench/bench-all.json --plot docs/bench/bench-all.png",
    ),
    Section(
        "vs-raw",
        "The studio against plain diffusers (`--vs-raw`)",
        "Each preset run again through plain diffusers (and plain cache-dit / torchao calls), in a worker process, "
        "timed the same way (first transformer call to the last step's end), each pair's order alternating. "
        "`studio/raw` is the studio's runs over the plain ones beside them, step by step, by the one estimator "
        "(each kind of step's fastest, times its count; a bootstrap over the pairs for the interval), so a stall "
        "in one run of either side does not move it; the plain run's picture is compared with the studio's (inf: "
        "the same pixels). The `pace` line under the table says whether the machine was quiet. Two processes of "
        "one recipe differ by a few percent even on a quiet machine (each floor is one step's fastest of a few "
        "hundred), which no pairing removes: base's second run has a plain process of its own, and the noise "
        "floor's `plain base against a second plain process` line is how far studio/raw can sit from 1.00 by that "
        "alone, and the line after it reads each row against it: within that noise, or by how much outside it.",
        "-m studio bench --presets base,cache,int8 --repeats 9 --vs-raw --out docs/bench/vs-raw.json",
    ),
    Section(
        "ideal",
        "What a cached step costs: the ideal, worked through",
        "A cached step of an F1B0 cache runs the first block and reuses the residual of the rest; everything else a "
        "full step pays stays: the first block (a FLUX double-stream block, heavier than a single one), the model's "
        "own per-call work outside the blocks (time and text embedders, RoPE, the output norm and projection) and "
        "the scheduler step. So the ideal prices a cached step at the full step less the skipped blocks, each "
        "block's time measured by a clock around it in this run's own full steps (medians; per transformer call, "
        "twice per step with true CFG): ideal = steps / (full + cached x share). A compiled stack's blocks cannot "
        "be clocked: its share comes from the eager base beside it, and it says so. One run of {p:cache}, its numbers "
        "worked through:",
        "-m studio generate --preset cache --seed 42 --ideal",
        fenced=True,
    ),
    Section(
        "ideal-large",
        "The ideal on a larger image",
        "{p:cache} at the command's larger size (more image tokens), {p:base} beside it: the blocks weigh more "
        "against the fixed per-call work, so a cached step's share falls and the ideal rises; `of ideal` stays what "
        "the cache's own machinery costs.",
        "-m studio bench --presets base,cache --repeats 7 --width 128 --height 128",
    ),
    Section(
        "sweep",
        "Threshold sweep over the example prompts",
        "The {p:cache} preset at each residual threshold over the profile's example prompts: median speed-up, worst "
        "and mean PSNR; the cliff is where worst PSNR drops the most from the value before.",
        "-m studio sweep --values 0.04,0.08,0.12,0.16,0.24,0.32,0.5,1.0 --plot docs/bench/sweep-threshold.png",
    ),
    Section(
        "tune",
        "Tuning to a PSNR floor",
        "The tuner at the floor the command names, searching on the profile's example prompts and timing its "
        "finalists on `docs/prompts-heldout.txt`, which the search did not see; written as a preset "
        "(docs/bench/tuned-35db.yaml: the next section runs it again beside the shipped stacks). One search over "
        "stacks: the non-cache options with a margin (the arms), DBCache's knobs screened on the fastest, every "
        "other step-cache method's knob searched on each arm (`-on-<arm>` where it is not the fastest), base (and "
        "the fastest option) at the fewest steps that keep the floor; the finalists timed side by side (listed after "
        "the paired lines: the frontier the winner was picked from).",
        "-m studio tune --min-psnr 35 --search-prompts examples --prompts docs/prompts-heldout.txt "
        "--out docs/bench/tuned-35db.yaml --plot docs/bench/tune-curve.png",
        fenced=True,
    ),
    Section(
        "heldout",
        "The tuned preset on prompts it was not tuned on",
        "`docs/prompts-heldout.txt`: other scenes of the grammar. One rotation per prompt; `vs base` is the median "
        "over prompts and `worst PSNR` the worst prompt's.",
        "-m studio bench --presets-dir docs/bench --presets base,cache,cache-compile,tuned-35db "
        "--prompts docs/prompts-heldout.txt --repeats 3",
    ),
    Section(
        "methods",
        "Every step cache side by side",
        "`python -m studio methods` (docs/methods.md): each step-cache method's fastest setting that keeps the "
        "profile's example prompts above 35 dB (its own search, screened eagerly, on the prompts `tune` tunes on), "
        "then all of them in one interleaved bench on `docs/prompts-heldout.txt`, which neither saw, each prompt "
        "against its own base, with the shipped {p:cache} beside them, and each read against base at fewer steps of "
        "its speed on the same prompts; each best kept as a preset in docs/bench/methods/ (`--write`). For scale: "
        "on FLUX.1-dev (cache-dit's own bench, 50 steps, 200 DrawBench prompts, mean PSNR against the uncached "
        "picture) caching gives about 1.53x at 36.7 dB, 2.14x at 33.9 dB and 2.75x at 30.5 dB; the embedded model "
        "keeps far more at each speed (its flow is nearly straight), so these rows rank the methods on this model, "
        "not FLUX's (docs/methods.md, \"What carries over\").",
        "-m studio methods --presets-dir docs/bench --also cache --search-prompts examples "
        "--prompts docs/prompts-heldout.txt --min-psnr 35 --plot docs/bench/methods.png --write docs/bench/methods",
    ),
    Section(
        "parallel",
        "Parallel presets on Ray CPU workers",
        "Float32 (`STUDIO_DTYPE=float32`), so the parallel picture can be compared with one process bitwise; see "
        "[parallel.md](parallel.md) for what runs where and what it costs on a CPU.",
        "STUDIO_DTYPE=float32 -m studio bench --presets base,cache,ulysses2,cache-ulysses2 --repeats 3",
    ),
]
GPU_TITLE = "On a GPU"
GPU_TEXT = (
    "Only the records `.ci/gpu-check` writes (docs/bench/gpu/gpu-check-<date>.md: the commit measured, the GPU, the "
    "versions, the presets' stacks, then each step's command and output): the doctor on tiny instances of the DiT "
    "families, the bench on the embedded model, and the memory regimes on a random-weight FLUX.1-dev-sized "
    "transformer."
)
GPU_MISSING = "not yet measured on a GPU for today's presets: run .ci/gpu-check"

INTRO = """# Benchmarks

What each speed-up buys and costs on the embedded model (`tiny`, a small FLUX-architecture DiT the project trained),
measured by the studio's own commands. This file is written whole by `python docs/make_benchmarks.py`: the text is
the generator's, and every number is the verbatim output of the command shown above it, stored with the machine,
date and commit it ran on (docs/bench/runs/; docs/bench/gpu/ for `.ci/gpu-check`'s records). A section measured on
another machine than the newest CPU record says so in its heading; one whose stored output no longer describes
today's presets (its command changed, a preset it ran now runs another stack, or it predates a change to what the
presets run) says "stale" in its heading and why under it. `python docs/make_benchmarks.py --check` says whether
this file still matches the presets and the generator.

How to read it:

- **denoise / per-step**: the denoising loop only (first transformer call to the end of the last step), median of the
  round-robin repeats after each stack's untimed warm-up. **vs base**: the one estimator's (docs/measuring.md): base's
  floor over the row's (each kind of step's fastest over the repeats, times its count), each round a pair, with its
  interval, `1.74x (1.68-1.80)`: {interval}.
- **Noise floor**: `base` timed a second time in every rotation: base against itself tells how far from 1.00x a
  speed-up must be to mean anything on the machine that ran it. Compile vs eager PSNR is the picture's noise floor
  under torch.compile (rounding in fused kernels; never bitwise).
- **pace** (first line under a table measured since it was added): base's floor per step against the fastest this
  machine has run the same request, and base against itself; **a quiet machine** when the floor is within 8% and
  base agrees with itself within ±3%, else **BUSY** and why: a busy host lowers speed-ups (docs/measuring.md, "Was
  the machine quiet?"), so read a BUSY table's rows as low by up to ~15%.
- **of ideal**: measured speed-up / the speed-up the cached/full counts would give if a cached step cost only its
  computed blocks. Below 1.0 is what a cached step still costs besides those blocks: the embedders, the final
  norm and projection, the scheduler step, cache-dit's residual comparison, and Python overhead, which on a small
  model is a large share of a step.
- **Compile cost**: the cold warm-up that compiled, graphs compiled, recompiles seen during the timed runs, and how
  many images it takes before compile pays for itself at the measured per-image saving over its eager twin. The
  compiled blocks are kept per process and shared by every stack that compiles them the same way, so a compiled
  stack timed after another shows 0 graphs and a short "cold" run: its compile was paid by the first.
- **timing too noisy to show** (in a row's notes): the interval is useless (it holds 1.00 while the point says
  otherwise, or is wider than ±25%); the bench withholds the number and says what would help.
- **studio/raw** (`--vs-raw`): the studio's runs over the plain-diffusers runs beside them, by the same estimator,
  step by step, with its interval; read it against the noise floor's plain-against-plain line (two plain processes
  of one recipe, the same rounds).

What the CPU choices rest on:

- **8-bit eagerly**: torchao's INT8 weight-only dequantizes the weights inside each matmul and the dynamic-activation
  forms quantize each call's activations in separate kernels; a small model on a CPU is bound by per-op overhead,
  so eagerly neither is expected to beat base, and {p:int8-weight-only} stays as the memory option. Compiled,
  Inductor fuses that work: the named 8-bit stacks ({p:int8}, {p:sage-int8}, {p:cache-int8}, {p:cache-int8-sage})
  compile and run `quant_type: auto`, the form the engine's resolver picks for the device; the first section says
  which on the measuring CPU and why, the next two measure the forms side by side.
- **SageAttention** is CUDA-only: on a CPU {p:sage} runs SDPA and says so in its row's notes, so its row is base's
  within the noise floor.
- **torch.compile** pays per image but costs a cold compile first; the cost panel says after how many images."""


# --- the library: which presets exist, what each runs ----------------------------------------------------------------


def _library(presets_dir: str | None = None):
    from studio.spec.presets import PresetLibrary  # torch-free

    return PresetLibrary().with_user_dir(ROOT / presets_dir if presets_dir else None)


def _opt(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words and words.index(flag) + 1 < len(words) else None


def _words(command: str) -> list[str]:
    """A command's words without leading VAR=value and `python`."""
    words = command.split()
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    return words[1:] if words and words[0] in ("python", "python3") else words


def command_presets(command: str) -> tuple[list[str], str | None]:
    """(the presets a command runs, its --presets-dir), as the studio's CLI picks them."""
    words = _words(command)
    pdir = _opt(words, "--presets-dir")
    if "--auto-forms" in words:
        return _library().names(), None
    sub = words[2] if words[:2] == ["-m", "studio"] and len(words) > 2 else ""
    named = _opt(words, "--presets") or _opt(words, "--preset")
    if named:
        names = named.split(",")
    elif sub == "bench":
        names = _library(pdir).one_process_names()
    else:
        names = {"sweep": ["cache"], "tune": ["cache"], "generate": ["base"]}.get(sub, [])  # their defaults
    if sub in ("bench", "generate", "sweep", "tune") and "base" not in names:
        names = ["base"] + names  # the reference every run is compared with
    return names, pdir


def preset_tags(command: str) -> dict[str, str | None]:
    """{preset: the stack it runs (its tag)} for what `command` runs; None for a preset that does not exist."""
    names, pdir = command_presets(command)
    lib = _library(pdir)
    have = set(lib.names())
    return {n: (lib.get(n).tag() if n in have else None) for n in names}


def known_presets(presets_dirs: list[str]) -> set[str]:
    out = set(_library().names())
    for d in presets_dirs:
        out |= set(_library(d).names())
    return out


def text_of(section_text: str) -> str:
    """A section's text with its preset marks written out (--check says when a mark names no preset), and the
    estimator's method and interval in the words of the code that measures them (studio.measure.estimate)."""
    from studio.measure.estimate import interval_words, method_words

    said = section_text.replace("{estimator}", method_words()).replace("{interval}", interval_words())
    return PRESET_MARK.sub(lambda m: f"`{m.group(1)}`", said)


def text_presets(section_text: str) -> list[str]:
    return PRESET_MARK.findall(section_text)


# --- the machine, the commit -----------------------------------------------------------------------------------------


def machine() -> dict:
    cpu, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "flags": {f: f in flags for f, _ in FLAGS},
        "python": platform.python_version(),
    }


def machine_text(m: dict) -> str:
    flags = ", ".join(f"{label}: {'yes' if m['flags'].get(f) else 'no'}" for f, label in FLAGS)
    return f"{m['cpu']} ({flags}), {m['cores']} cores"


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *TRACKED)
    return head + ("+uncommitted" if dirty else "")


# --- running sections ------------------------------------------------------------------------------------------------


class CommandFailed(RuntimeError):
    """A section's command exited with an error: its stored output, if any, stays as it was."""


def run(args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "STUDIO_PRESETS_DIR"}  # the command names its presets
    env["HF_HUB_OFFLINE"] = "1"
    words = args.split()
    while words and "=" in words[0] and not words[0].startswith("-"):  # leading VAR=value, as the shell reads them
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    p = subprocess.run([sys.executable] + words, cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise CommandFailed(f"{args} failed (exit status {p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def measuring_hash() -> str:
    """A hash of the measuring code (MEASURING's Python files, by path and content): a stored output made with other
    code is stale (`stale_reasons`)."""
    import hashlib

    h = hashlib.sha256()
    for folder in MEASURING:
        for f in sorted((ROOT / folder).rglob("*.py")):
            if str(f.relative_to(ROOT)) in NOT_MEASURING:
                continue
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def run_section(s: Section) -> dict:
    """Run one section's command here and store its output with the machine, date and commit."""
    m = machine()
    if s.needs and not m["flags"].get(s.needs, False):
        raise SystemExit(f"section {s.name} needs a CPU with {s.needs}; this one ({m['cpu']}) has none")
    print(f"{s.name}: running `{_shown_command(s.command)}`", file=sys.stderr)
    rec = {
        "section": s.name,
        "command": s.command,
        "epoch": EPOCH,
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "machine": m,
        "presets": preset_tags(s.command),
        "measuring": measuring_hash(),
    }
    rec["output"] = run(s.command).rstrip()
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / f"{s.name}.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    return rec


def load_record(name: str) -> dict | None:
    f = RUNS / f"{name}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def auto_forms() -> str:
    """The `--auto-forms` command: what the engine's resolver picks on this CPU (no model runs)."""
    from studio.engine.compile import compiles
    from studio.engine.device import profile_here, resolve_dtype
    from studio.spec.devices import DeviceProfile, quant_form
    from studio.spec.preset import QuantSpec

    cpu, lib = profile_here("cpu"), _library()
    out = [
        f"CPU: {machine_text(machine())}",
        "",
        "| preset | quant_type asked | compiled | runs | why |",
        "|---|---|---|---|---|",
    ]
    for name in lib.names():
        p = lib.get(name)
        if p.quant.enabled:
            compiled = compiles(p, cpu)
            form, why = quant_form(p.quant, cpu, compiled)
            out.append(f"| {name} | {p.quant.quant_type} | {'yes' if compiled else 'no'} | {form} | {why} |")
    out += [
        "",
        "The rule for `auto` on other CPUs (flags given to the resolver):",
        "",
        "| CPU flags | compiled | runs |",
        "|---|---|---|",
    ]
    for flags in (("amx_int8", "avx512_vnni"), ("avx512_vnni",), ("avx_vnni",), ()):
        for compiled in (True, False):
            other = DeviceProfile("other", "cpu", "a CPU", flags=frozenset(flags))
            form, _ = quant_form(QuantSpec(quant_type="auto"), other, compiled)
            out.append(f"| {' '.join(flags) or '(no VNNI, no AMX)'} | {'yes' if compiled else 'no'} | {form} |")
    d = resolve_dtype("auto", cpu)
    out += ["", f"dtype `auto` here: {d.name} ({d.note})"]
    return "\n".join(out)


# --- what a stored output says, and whether it still holds -----------------------------------------------------------


def table_presets(text: str) -> list[str]:
    """The names in the `preset` column of every Markdown table in `text`."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if "preset" not in cells:
                continue
            col = cells.index("preset")
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                row_cells = [c.strip() for c in row.strip("|").split("|")]
                if col < len(row_cells) and row_cells[col]:
                    out.append(row_cells[col])
    return out


def base_name(name: str) -> str:
    """A row's preset name without what the bench adds to it (`-eager`, `-nocache`, ` (again)`)."""
    name = name.removesuffix(AGAIN)
    while name.endswith(DERIVED):
        name = next(name.removesuffix(d) for d in DERIVED if name.endswith(d))
    return name


def bad_forms(text: str) -> list[str]:
    """Quant forms `text` names that the engine does not know (cache-dit's names, and their short tags)."""
    from studio.spec.preset import QUANT_SHORT, QUANT_TYPES

    bad = {f for f in FORM_RE.findall(text) if f not in QUANT_TYPES}
    for m in TAG_RE.finditer(text):
        parts = m.group(1).strip("+").split("+")
        bad |= {p for p in parts if QUANT_PART_RE.match(p) and p not in QUANT_SHORT.values()}
    return sorted(bad)


def gone_names(output: str, presets_dirs: list[str]) -> list[str]:
    """Presets and forms a stored output names that no longer exist: such an output is not shown."""
    known = known_presets(presets_dirs)
    gone = sorted({base_name(n) for n in table_presets(output)} - known)
    return [f"preset {n}" for n in gone] + [f"quant form {f}" for f in bad_forms(output)]


def stale_reasons(rec: dict, command: str | None) -> list[str]:
    """Why a stored output no longer describes today's presets (empty: it does)."""
    why = []
    if command is not None and rec["command"] != command:
        why.append(f"its command was `python {rec['command']}`; the section's is now another")
    if rec.get("epoch", 0) < EPOCH:
        why.append(EPOCH_WHY.get(rec.get("epoch", 0), "measured under an older epoch of the generator"))
    if "measuring" not in rec:
        why.append("made before the measuring code's hash was recorded (studio/measure, studio/bench)")
    elif rec["measuring"] != measuring_hash():
        why.append(f"the measuring code (studio/measure, studio/bench) changed since it ran ({rec['commit']})")
    then = rec.get("presets")
    if then is None:
        why.append("the stacks its presets ran were not recorded")
        return why
    now = preset_tags(command) if command is not None else {n: _tag_now(n) for n in then}
    changed = [f"`{n}` ran {then[n]}, now {now[n]}" for n in then if n in now and now[n] and then[n] != now[n]]
    if changed:
        why.append("presets changed since: " + "; ".join(changed))
    new = [n for n in now if n not in then]
    if new:
        why.append("presets added since: " + ", ".join(f"`{n}`" for n in new))
    return why


def _tag_now(name: str) -> str | None:
    lib = _library()
    return lib.get(name).tag() if name in lib.names() else None


# --- assembling the document -----------------------------------------------------------------------------------------


def reference_machine(records: dict[str, dict]) -> str | None:
    """The doc's own machine, whose sections are not marked: the CPU that made the most records (then the newest)."""
    cpus = [r["machine"]["cpu"] for r in records.values()]
    newest = {c: max(r["date"] for r in records.values() if r["machine"]["cpu"] == c) for c in cpus}
    return max(newest, key=lambda c: (cpus.count(c), newest[c])) if cpus else None


def _shown_command(command: str) -> str:
    words = command.split()
    env = []
    while words and "=" in words[0] and not words[0].startswith("-"):
        env.append(words.pop(0))
    return " ".join(env + ["python"] + words)


def _output_block(s: Section, output: str) -> list[str]:
    body = ["```text", output, "```"] if s.fenced else [output]
    if s.plot:
        body += ["", f"![{s.title}]({Path(s.plot).relative_to('docs')})"]
    return body


def section_state(s: Section, rec: dict, home: str | None) -> tuple[list[str], list[str], bool]:
    """(why its stored output is stale, what it names that no longer exists, whether another machine made it)."""
    pdir = _opt(_words(rec["command"]), "--presets-dir")
    gone = gone_names(rec["output"], [pdir] if pdir else [])
    stale = stale_reasons(rec, s.command) + ([f"it names what no longer exists: {', '.join(gone)}"] if gone else [])
    return stale, gone, rec["machine"]["cpu"] != home


def render_section(s: Section, rec: dict | None, home: str | None) -> list[str]:
    """A section: heading (with where, when and whether stale), text, command, machine line, output."""
    if rec is None:
        where = f" on a CPU with {s.needs}" if s.needs else ""
        return [
            f"## {s.title} — not yet measured: run `{ME} --sections {s.name}`{where}",
            "",
            text_of(s.text),
            "",
            "```bash",
            _shown_command(s.command),
            "```",
            "",
        ]
    stale, gone, other = section_state(s, rec, home)
    marks = (["stale"] if stale else []) + (["not shown"] if gone else [])
    marks += [f"measured {rec['date']} on another machine ({rec['machine']['cpu']})"] if other else []
    heading = f"## {s.title}" + (" — " + ", ".join(marks) if marks else "")
    out = [heading, "", text_of(s.text), "", "```bash", _shown_command(rec["command"]), "```", ""]
    out += [
        f"Measured {rec['date']} on {machine_text(rec['machine'])}, Python {rec['machine']['python']}, "
        f"commit {rec['commit']}." + (f" {rec['source']}" if rec.get("source") else ""),
        "",
    ]
    if stale:
        out += [
            f"Stale: {'; '.join(stale)}. Regenerate: `{ME} --sections {s.name}`"
            + (f" on a CPU with {s.needs}." if s.needs else "."),
            "",
        ]
    if gone:
        return out
    return out + _output_block(s, rec["output"]) + [""]


def overview(records: dict[str, dict], home: str | None) -> list[str]:
    out = [
        "Where each section was measured:",
        "",
        "| section | measured | machine | commit | state |",
        "|---|---|---|---|---|",
    ]
    for s in SECTIONS:
        rec = records.get(s.name)
        if rec is None:
            out.append(f"| {s.name} | - | - | - | not yet measured |")
            continue
        stale, gone, other = section_state(s, rec, home)
        state = ("stale" if stale else "current") + (", not shown" if gone else "") + (", another machine" * other)
        out.append(f"| {s.name} | {rec['date']} | {rec['machine']['cpu']} | {rec['commit']} | {state} |")
    return out


METHODS_DOC = ROOT / "docs" / "methods.md"
METHODS_MARK = ("<!-- methods: written by docs/make_benchmarks.py -->", "<!-- /methods -->")


def methods_block() -> str:
    """docs/methods.md's table: the `methods` section as benchmarks.md renders it, less its heading."""
    s = next(x for x in SECTIONS if x.name == "methods")
    records = {x.name: r for x in SECTIONS if (r := load_record(x.name)) is not None}
    lines = render_section(s, records.get("methods"), reference_machine(records))[2:]
    text = "\n".join(lines).strip()
    return f"{METHODS_MARK[0]}\n{text}\n{METHODS_MARK[1]}"


def methods_doc() -> str:
    """docs/methods.md with its table block written from the stored run."""
    text = METHODS_DOC.read_text()
    start, end = text.index(METHODS_MARK[0]), text.index(METHODS_MARK[1]) + len(METHODS_MARK[1])
    return text[:start] + methods_block() + text[end:]


def assemble() -> str:
    records = {s.name: r for s in SECTIONS if (r := load_record(s.name)) is not None}
    home = reference_machine(records)
    out = [text_of(INTRO), ""] + overview(records, home) + [""]
    for s in SECTIONS:
        out += render_section(s, records.get(s.name), home)
    out += render_gpu()
    return "\n".join(out).rstrip() + "\n"


# --- the GPU section: .ci/gpu-check's records ------------------------------------------------------------------------


def gpu_records() -> list[tuple[dict, str]]:
    """Every stored gpu-check record as (its header fields, its body), newest first."""
    out = []
    for f in sorted(GPU_DIR.glob("gpu-check-*.md"), reverse=True):
        head, _, body = f.read_text().partition("\n\n")
        fields = dict(line.split(": ", 1) for line in head.splitlines()[1:] if ": " in line)
        fields["file"] = str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)
        out.append((fields, body.strip()))
    return out


def gpu_stale(fields: dict) -> list[str]:
    rec = {"command": "", "epoch": int(fields.get("epoch", "0") or 0), "presets": None, "commit": fields.get("commit")}
    if fields.get("measuring", "").strip():
        rec["measuring"] = fields["measuring"].strip()
    if fields.get("presets", "").strip() and "=" in fields["presets"]:
        rec["presets"] = dict(p.split("=", 1) for p in fields["presets"].split())
    why = stale_reasons(rec, None)
    return ([fields["stale"]] if fields.get("stale") else []) + why


def _gpu_lines(fields: dict, body: str, stale: list[str], level: str) -> list[str]:
    out = [
        f"Measured {fields.get('date', '?')} on {fields.get('gpu', '?')}, commit {fields.get('commit', '?')}; "
        f"{fields.get('versions', 'versions not recorded')}. Stored in {fields['file']}."
    ]
    if fields.get("source"):
        out[0] += f" {fields['source']}"
    if stale:
        out += ["", f"Stale: {'; '.join(stale)}. Run .ci/gpu-check on a CUDA machine."]
    gone = gone_names(body, [])
    if gone:
        return out + ["", f"Its output is not shown: it names what no longer exists: {', '.join(gone)}.", ""]
    body = re.sub(r"^### ", level + " ", body, flags=re.M)
    return out + ["", body, ""]


def render_gpu() -> list[str]:
    records = [(f, b, gpu_stale(f)) for f, b in gpu_records()]
    current = next(((f, b, s) for f, b, s in records if not s), None)
    if current:
        f, b, s = current
        return [f"## {GPU_TITLE} — measured {f.get('date', '?')}", "", GPU_TEXT, ""] + _gpu_lines(f, b, s, "###")
    out = [f"## {GPU_TITLE} — {GPU_MISSING}", "", GPU_TEXT, ""]
    if records:
        f, b, s = records[0]
        out += [f"### The last gpu-check record ({f.get('date', '?')}) — stale", ""] + _gpu_lines(f, b, s, "####")
    return out


# --- the check -------------------------------------------------------------------------------------------------------


def doc_sections(text: str) -> list[tuple[str, str]]:
    """(title without its marks, body) for every `## ` section of a doc."""
    out = []
    for chunk in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = chunk.partition("\n")
        out.append((heading.split(" — ")[0].strip(), body))
    return out


def _check_commands(title: str, body: str) -> list[str]:
    """The presets, preset folders and prompt files a section's commands name, and its table rows' presets."""
    problems, dirs = [], []
    for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
        for line in block.splitlines():
            words = _words(line.split("#")[0])
            if not words or words[0] not in ("-m", "docs/make_benchmarks.py"):
                continue
            for flag in ("--presets-dir", "--prompts"):
                path = _opt(words, flag)
                if path and not (ROOT / path).exists():
                    problems.append(f"section '{title}': its command names {flag} {path}, which does not exist")
                if path and flag == "--presets-dir":
                    dirs.append(path)
            pdir = _opt(words, "--presets-dir")
            have = known_presets([pdir] if pdir and (ROOT / pdir).is_dir() else [])
            for n in (_opt(words, "--presets") or _opt(words, "--preset") or "").split(","):
                if n and n not in have:
                    where = f"a file in {pdir}" if pdir else "in a --presets-dir"
                    problems.append(
                        f"section '{title}': its command runs preset '{n}', which is neither shipped "
                        f"(python -m studio presets) nor {where}"
                    )
    have = known_presets([d for d in dirs if (ROOT / d).is_dir()])
    for n in sorted({base_name(n) for n in table_presets(body)} - have):
        problems.append(
            f"section '{title}': its table names preset '{n}', which is neither shipped nor in "
            f"{', '.join(dirs) or 'a --presets-dir its command names'}"
        )
    return problems


def check(doc: Path = DOC) -> list[str]:
    """What is wrong with `doc` against the generator, the presets and the stored records (empty: nothing)."""
    if not doc.is_file():
        return [f"{doc} does not exist: run {ME} --assemble"]
    text, problems = doc.read_text(), []
    titles = [s.title for s in SECTIONS] + [GPU_TITLE]
    found = doc_sections(text)
    for t, _ in found:
        if t not in titles:
            problems.append(f"{doc.name} has a section '{t}' that docs/make_benchmarks.py no longer makes")
    for s_name, t in [(s.name, s.title) for s in SECTIONS] + [("gpu", GPU_TITLE)]:
        if t not in [f for f, _ in found]:
            problems.append(f"{doc.name} lacks the section '{t}' ({s_name}) that docs/make_benchmarks.py makes")
    for t, body in found:
        problems += _check_commands(t, body)
    for f in bad_forms(text):
        problems.append(f"{doc.name} names the quant form '{f}', which the engine no longer has")
    for s in SECTIONS:
        lib = known_presets([])
        for n in text_presets(s.text):
            if n not in lib and not (ROOT / "docs" / "bench" / "forms" / f"{n}.yaml").is_file():
                problems.append(f"the generator's text for section {s.name} names preset '{n}', which is not shipped")
    for img in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        if not (doc.parent / img).is_file() and not (DOC.parent / img).is_file():
            problems.append(f"{doc.name} shows the picture {img}, which does not exist")
    from studio.spec.checks import ConfigError

    try:
        assembled = assemble()
    except ConfigError as e:  # a preset file that does not load: nothing can be compared with it
        return problems + [f"a preset cannot be read, so the doc cannot be checked against it: {e}"]
    if text != assembled:
        problems.append(
            f"{doc.name} is not what the generator assembles from docs/bench/runs and docs/bench/gpu "
            f"(edited by hand, or the presets changed since): run {ME} --assemble"
        )
    if doc == DOC and METHODS_DOC.read_text() != methods_doc():
        problems.append(f"docs/methods.md's table is not the stored `methods` run: run {ME} --assemble")
    return problems


# --- the command line ------------------------------------------------------------------------------------------------


def _pick(names: str | None) -> list[Section]:
    if names is None:
        flags = machine()["flags"]
        skipped = [s.name for s in SECTIONS if s.needs and not flags.get(s.needs)]
        if skipped:
            print(
                f"skipping {', '.join(skipped)}: this CPU lacks what they need; their stored output stays",
                file=sys.stderr,
            )
        return [s for s in SECTIONS if s.name not in skipped]
    by_name = {s.name: s for s in SECTIONS}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if "gpu" in wanted:
        raise SystemExit("the GPU section is .ci/gpu-check's record: run it on a CUDA machine (docs/bench/gpu/)")
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}: the sections are {', '.join(by_name)}, gpu")
    return [by_name[n] for n in wanted]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default=None, help="comma-separated section names to run (default: all)")
    ap.add_argument("--assemble", action="store_true", help="run nothing: write the doc from the stored outputs")
    ap.add_argument("--check", action="store_true", help="check the doc against the generator and the presets")
    ap.add_argument("--doc", default=str(DOC), help="the doc --check reads (default docs/benchmarks.md)")
    ap.add_argument("--list", action="store_true", help="the sections and their stored records")
    ap.add_argument("--auto-forms", action="store_true", help="print what quant_type auto picks on this CPU")
    ap.add_argument("--epoch", action="store_true", help="print the generator's epoch (for .ci/gpu-check)")
    ap.add_argument("--measuring", action="store_true", help="print the measuring code's hash (for .ci/gpu-check)")
    ap.add_argument("--presets-line", action="store_true", help="print name=tag for every shipped preset")
    a = ap.parse_args(argv)
    if a.measuring:
        print(measuring_hash())
        return 0
    if a.epoch or a.presets_line or a.auto_forms:
        lib = _library()
        print(
            EPOCH
            if a.epoch
            else auto_forms()
            if a.auto_forms
            else " ".join(f"{n}={lib.get(n).tag()}" for n in lib.names())
        )
        return 0
    if a.check:
        problems = check(Path(a.doc))
        for p in problems:
            print(p, file=sys.stderr)
        print(
            "ok: the doc matches the generator, the presets and the stored records"
            if not problems
            else f"{len(problems)} problem(s)",
            file=sys.stderr,
        )
        return 1 if problems else 0
    if a.list:
        home = reference_machine({s.name: r for s in SECTIONS if (r := load_record(s.name))})
        print("\n".join(overview({s.name: r for s in SECTIONS if (r := load_record(s.name))}, home)[2:]))
        return 0
    failed = []
    for s in [] if a.assemble else _pick(a.sections):
        try:
            run_section(s)
        except CommandFailed as e:  # the other sections still run; this one keeps its stored output
            failed.append(f"section {s.name}: {e}")
    DOC.write_text(assemble())
    METHODS_DOC.write_text(methods_doc())
    print(f"wrote {DOC} and {METHODS_DOC}", file=sys.stderr)
    problems = failed + check()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
