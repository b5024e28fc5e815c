"""The description of each endpoint offered as an MCP tool (gradio's `api_description`, also on the API page). An
agent acts on these alone, so each says what the endpoint does, which presets exist, and what its numbers mean."""

from __future__ import annotations

from studio.measure.estimate import interval_words

NUMBERS = (
    "Numbers: `tag` is what ran (never only what was asked; `label_changes` lists parts that fell back), `denoise_s` "
    "the denoising loop's time, `speedup` the speed-up over the `base` preset with its interval `speedup_lo`-"
    f"`speedup_hi` ({interval_words()}; `interval_level`) from `timed_pairs` timed pairs (null with "
    "`speedup_note` saying why when the timing cannot be "
    "trusted), `cached_steps`/`full_steps` the steps the cache skipped and ran, `psnr_db`/`ssim` the picture against "
    "base's picture of the same request (30 dB and up: close; under 20 dB: a different or broken picture; `quality` "
    "says which)."
)


def preset_lines(presets: list[tuple[str, str]]) -> str:
    """`name`: description, one per preset."""
    return "; ".join(f"`{n}`: {d.rstrip('.')}" for n, d in presets)


def tool_descriptions(presets: list[tuple[str, str]], models: list[str]) -> dict[str, str]:
    """{api_name: description} for the endpoints offered as tools; `presets`: (name, description) a caller may name."""
    what = (
        "DiT Speed Studio runs a text-to-image diffusion transformer with a speed preset: a stack of step caching, "
        f"8-bit quantization, attention kernels and compilation. Models: {', '.join(models)}. Presets: "
        f"{preset_lines(presets)}."
    )
    return {
        "images": (
            f"Generate pictures from a prompt with a speed preset and get each picture at its own size with its "
            f"numbers. {what} {NUMBERS}"
        ),
        "generate": (
            "The Generate tab as an endpoint: one run of a preset with the page's outputs (the picture enlarged for "
            "display, the metrics card as HTML, base's picture, an error map, a per-step chart) and `metrics`, the "
            f"run's full record. Programs that want the pictures and numbers only call `images`. {what} {NUMBERS}"
        ),
        "compare": (
            "Run one request with two presets (`preset_a`, `preset_b`) and compare them: both pictures, a table of "
            f"their numbers and B's difference from A (`b_vs_a`: PSNR and the worst 8x8 tile). {what}"
        ),
        "matrix": (
            "Time several presets (`presets`, a list) on one request, each against base in the same round-robin, "
            "with `repeats` rounds: a row per preset (speed-up with its interval, cached steps, PSNR, what ran) and "
            f"a last row `base (again)`, the noise floor. {what}"
        ),
        "headroom": (
            "Before a run: how many steps the preset's step cache can skip at all in this request (its warm-up, its "
            "caps and its step mask against the steps that run), with /generate's parameters and no run. "
            "`skippable` of `steps`, `at_most` the most it could speed the run up were a cached step free, `tight` "
            "and `warning` where that is little or nothing (a few-step request, a distilled model); `cache: false` "
            f"for a preset without a step cache. {what}"
        ),
        "tune": (
            "Search a step cache's threshold for the fastest preset whose pictures stay above a PSNR floor (`floor`, "
            "in dB) against base on the given prompts (`prompts_text`, one a line); returns the tuned preset as YAML "
            f"and its numbers. {what}"
        ),
    }
