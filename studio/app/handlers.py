"""The UI's event handlers: thin translations between form values and the engine, returning {component: value}.

`Handlers` is bound to a facade (`Studio`: the runner, the models offered, a folder for downloads, the preset
library) and to the laid-out components (`ui`, any object with the component attributes), so the handlers can be
called in a test with a fake engine and plain objects, no server.
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from studio.bench import run_matrix
from studio.engine import BASE, ModelLoadError, RunError, Runner
from studio.measure.quality import Verdict
from studio.report.card import metrics_card
from studio.report.plots import plot_steps, plot_tradeoff
from studio.report.table import COLUMNS, MatrixRow
from studio.spec import ConfigError, PresetLibrary, parse_switch
from studio.spec.presets import MAX_PRESET_BYTES

CACHE_CHOICES = [("follow preset", "unset"), ("on", "true"), ("off", "false")]
COMPILE_CHOICES = CACHE_CHOICES
HISTORY_COLUMNS = ["#", "prompt", "seed", "steps", "size"] + list(COLUMNS)
MAX_PUBLIC_TUNE_PROMPTS = 3
PREDICTED = "speed-up the counts predict (screening, not timed)"


@dataclass
class Studio:
    """The facade the UI talks to.

    In public mode each visitor's presets live in a folder of their own session (under `tmpdir`), so what one
    visitor saves no other visitor sees; otherwise the one user folder of `presets` is shared."""

    runner: Runner
    models: list[str]
    presets: PresetLibrary
    public: bool = False
    tmpdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="studio-")))

    def write(self, name: str, text: str) -> str:
        """Write a download atomically (a crash leaves the old file or the new one, never half of one)."""
        path = self.tmpdir / name
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return str(path)

    def library(self, request=None) -> PresetLibrary:
        """The presets this visitor sees: built-ins plus their own (public mode) or the shared user folder."""
        if not self.public:
            return self.presets
        session = getattr(request, "session_hash", None)
        if not session:
            return self.presets.with_user_dir(None)
        safe = "".join(c for c in str(session) if c.isalnum())[:64] or "anonymous"
        return self.presets.with_user_dir(self.tmpdir / "sessions" / safe)


def png(render) -> np.ndarray:
    buf = io.BytesIO()
    render(buf)
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"))


def enlarge(img: np.ndarray | None, min_side: int = 384) -> np.ndarray | None:
    """Small native sizes shown enlarged (nearest neighbour: pixels stay honest)."""
    if img is None:
        return None
    h, w = img.shape[:2]
    k = max(1, math.ceil(min_side / max(h, w)))
    return img if k == 1 else np.kron(img, np.ones((k, k, 1), dtype=img.dtype))


def notes_md(notes: str) -> str:
    """A profile's notes as Markdown text: `<colour>` in a grammar is text, not an HTML tag."""
    return html.escape(notes or "")


def json_safe(value):
    """JSON has no Infinity: an identical picture's PSNR (inf) is sent as the string "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def threshold_value(value) -> float | None:
    """A browser's empty number field sends 0: 0 (or nothing) means "follow the preset"."""
    if value in (None, "") or float(value) <= 0:
        return None
    return float(value)


PROGRESS_EVERY_S = 1.0


def progress_hooks(progress, every_s: float = PROGRESS_EVERY_S):
    """(on_step, on_status) callbacks that drive a gr.Progress from the engine.

    Step updates go out at most once every `every_s` seconds, so a run under a second sends none: each update
    costs the server several ms and makes the browser redraw (measured on the embedded model: +6.5 ms per step
    with one update per step, and with the browser on the same 2 cores, stack runs slowed while the base runs
    beside them, which report no steps, did not: a speed-up of 1.19x where the bench said 1.64x)."""
    cached = []
    started = [None]

    def on_step(i, total, rec):
        if rec.cached:
            cached.append(i)
        now = time.monotonic()
        if started[0] is None or i == 0:
            started[0] = now
        if now - started[0] < every_s:
            return
        started[0] = now
        desc = f"denoising step {i + 1}/{total}" + (" — served from cache" if rec.cached else "")
        if cached:
            desc += f" (cached so far: {len(cached)})"
        progress((i + 1, total), desc=desc, unit="steps")

    def on_status(msg):
        cached.clear()
        progress(0, desc=msg)

    return on_step, on_status


HISTORY_MAX = 200  # rows kept per session: a visitor's history never grows without bound


def history_rows(hist: list, req, results) -> list:
    for res in results:
        number = hist[-1][0] + 1 if hist else 1
        row = [number, req.prompt[:200], req.seed, req.steps, f"{req.width}x{req.height}"]
        hist = hist + [row + MatrixRow.from_metrics(res.metrics).cells()]
    return hist[-HISTORY_MAX:]


class Handlers:
    def __init__(self, studio: Studio, ui):
        self.studio = studio
        self.ui = ui

    # helpers ---------------------------------------------------------------------------------------------
    def _request(self, prompt, model, seed, steps, width, height, guidance):
        if not prompt or not str(prompt).strip():
            raise gr.Error("Write a prompt first: the prompt is empty.")
        runner = self.studio.runner
        try:
            takes_guidance = runner.profile(model).guidance is not None
            return runner.request(
                str(prompt),
                model=model,
                seed=int(seed if seed is not None else 0),
                steps=int(steps),
                width=int(width),
                height=int(height),
                guidance=float(guidance) if guidance is not None and takes_guidance else None,
            )
        except (ConfigError, ValueError) as e:
            raise gr.Error(f"That request can't run: {e}") from None

    def _run(self, req, model, preset, cache, threshold, compile, progress, request=None):
        on_step, on_status = progress_hooks(progress)
        try:
            return self.studio.runner.generate(
                req,
                preset,
                model=model,
                cache_enabled=parse_switch(cache, "cache switch"),
                cache_threshold=threshold_value(threshold),
                compile_enabled=parse_switch(compile, "compile switch"),
                progress=on_step,
                on_status=on_status,
                presets=self.studio.library(request),
            )
        except (ConfigError, ModelLoadError, RunError, ValueError) as e:
            raise gr.Error(str(e)) from None

    def _history(self, hist, req, results) -> dict:
        hist = history_rows(hist or [], req, results)
        return {self.ui.hist_table: hist, self.ui.history: hist}

    # events ----------------------------------------------------------------------------------------------
    def generate(
        self, prompt, model, seed, steps, width, height, guidance, preset, cache, threshold, compile="unset",
        hist=None, request: gr.Request = None, progress=gr.Progress(),
    ):  # fmt: skip
        req = self._request(prompt, model, seed, steps, width, height, guidance)
        res = self._run(req, model, preset, cache, threshold, compile, progress, request)
        ui = self.ui
        return {
            ui.image: enlarge(res.image),
            ui.card: metrics_card(res.metrics),
            ui.base_image: enlarge(res.base_image),
            ui.steps_plot: png(lambda buf: plot_steps(res.metrics, buf)),
            ui.metrics_json: json_safe(res.metrics.as_dict()),
            **self._history(hist, req, [res]),
        }

    def compare(
        self, prompt, model, seed, steps, width, height, guidance, preset_a, preset_b, cache, threshold,
        compile="unset", hist=None, request: gr.Request = None, progress=gr.Progress(),
    ):  # fmt: skip
        req = self._request(prompt, model, seed, steps, width, height, guidance)
        ra = self._run(req, model, preset_a, cache, threshold, compile, progress, request)
        rb = self._run(req, model, preset_b, cache, threshold, compile, progress, request)
        rows = [MatrixRow.from_metrics(ra.metrics), MatrixRow.from_metrics(rb.metrics)]
        broken = [r.preset for r in rows if r.quality == Verdict.BROKEN.value]
        flag = (
            f'<span class="flag-broken">⚠ {", ".join(broken)}: likely broken, not lossy '
            f"(PSNR and high-frequency energy say noise)</span>"
            if broken
            else ""
        )
        a, b = enlarge(ra.image), enlarge(rb.image)
        ui = self.ui
        return {
            ui.slider: (a, b),
            ui.img_a: a,
            ui.img_b: b,
            ui.ab_table: [r.cells() for r in rows],
            ui.ab_flag: flag,
            ui.ab_json: json_safe({"a": ra.metrics.as_dict(), "b": rb.metrics.as_dict()}),
            **self._history(hist, req, [ra, rb]),
        }

    def matrix(
        self, prompt, model, seed, steps, width, height, guidance, presets, repeats, cache="unset", compile="unset",
        hist=None, request: gr.Request = None, progress=gr.Progress(),
    ):  # fmt: skip
        req = self._request(prompt, model, seed, steps, width, height, guidance)
        if not presets:
            raise gr.Error("Choose at least one preset for the matrix.")
        try:
            mat = run_matrix(
                self.studio.runner,
                req,
                list(presets),
                model=model,
                repeats=int(repeats or 1),
                progress=lambda d, t, label: progress((d, t), desc=f"{label}: {d} of {t} timed runs", unit="runs"),
                cache_enabled=parse_switch(cache, "cache switch"),
                compile_enabled=parse_switch(compile, "compile switch"),
                presets_library=self.studio.library(request),
            )
        except (ConfigError, ModelLoadError, RunError, ValueError) as e:
            raise gr.Error(str(e)) from None
        runs = {name: r.metrics.as_dict() for name, r in mat.results.items()}
        first = next((r.preset for r in mat.rows if r.preset != BASE), mat.rows[0].preset)
        ui = self.ui
        return {
            ui.mx_table: [r.cells() for r in mat.rows],
            ui.mx_plot: png(lambda buf: plot_tradeoff(mat.rows, buf)),
            ui.mx_pick: gr.update(choices=list(runs), value=first),
            ui.mx_steps: png(lambda buf: plot_steps(runs[first], buf)),
            ui.mx_csv: self.studio.write("matrix.csv", mat.csv()),
            ui.mx_md: self.studio.write("matrix.md", mat.markdown()),
            ui.matrix_runs: runs,
            ui.mx_json: json_safe([r.as_dict() for r in mat.rows]),
            ui.mx_noise: mat.noise_line(),
            **self._history(hist, req, list(mat.results.values())),
        }

    def tune(
        self, prompt, model, seed, steps, width, height, guidance, floor, prompts_text, size="quick",
        request: gr.Request = None, progress=gr.Progress(),
    ):  # fmt: skip
        """The tuner (studio.bench.tune) on the form's request with each prompt; a public studio runs the quick
        search on at most MAX_PUBLIC_TUNE_PROMPTS prompts (one tuner holds the device for minutes)."""
        from dataclasses import replace as _replace

        from studio.bench.tune import QUICK, tune
        from studio.report.plots import plot_sweep
        from studio.spec.presets import preset_to_yaml

        req = self._request(prompt, model, seed, steps, width, height, guidance)
        prompts = [x.strip() for x in (prompts_text or "").splitlines() if x.strip()] or [req.prompt]
        if self.studio.public:
            prompts, size = prompts[:MAX_PUBLIC_TUNE_PROMPTS], "quick"
        try:
            floor = float(floor)
            res = tune(
                self.studio.runner, [_replace(req, prompt=p) for p in prompts], floor, model=model,
                progress=lambda m: progress(0, desc=m), space=QUICK if size != "full" else None,
            )  # fmt: skip
        except (ConfigError, ModelLoadError, RunError, ValueError, TypeError) as e:
            raise gr.Error(str(e)) from None
        xs, ys, dbs = ([c[i] for c in res.curve] for i in range(3))
        label = "residual_diff_threshold (no calibrator)"
        plot = png(lambda buf: plot_sweep(label, xs, ys, dbs, None, buf, floor, PREDICTED)) if res.curve else None
        summary = {
            "preset": res.preset.name, "floor_db": floor, "worst_psnr_db": res.worst_db, "speedup": res.speedup,
            "vs_cache": res.vs_cache, "runs": res.runs, "screening_runs": res.screened, "timed_runs": res.timed,
            "prompts": prompts, "knobs": res.preset.as_dict(),
        }  # fmt: skip
        text = (
            f"**{res.preset.name}** — `{res.preset.tag()}`: worst PSNR **{res.worst_db:.2f} dB** over "
            f"{len(prompts)} prompts (target {floor:g}), **{res.speedup:.2f}x** vs base, "
            f"{res.vs_cache:.2f}x the `cache` preset's; {res.runs} runs ({res.screened} screening, {res.timed} timed)."
        )
        ui = self.ui
        return {
            ui.tn_result: text, ui.tn_plot: plot, ui.tn_yaml: preset_to_yaml(res.preset),
            ui.tn_name: res.preset.name, ui.tn_json: json_safe(summary),
        }  # fmt: skip

    def save_tuned(self, name, text, request: gr.Request = None):
        if not (text or "").strip():
            raise gr.Error("Run the tuner first: there is no tuned preset to save yet.")
        out = self.save_preset(name, text, request)
        out[self.ui.tn_msg] = out.pop(self.ui.save_msg)
        return out

    def pick_steps(self, name, runs):
        if not name or name not in (runs or {}):
            return {self.ui.mx_steps: None}
        return {self.ui.mx_steps: png(lambda buf: plot_steps(runs[name], buf))}

    def show_preset(self, name, request: gr.Request = None):
        lib = self.studio.library(request)
        try:
            p = lib.get(name)
        except ConfigError as e:
            raise gr.Error(str(e)) from None
        origin = "built in" if lib.is_builtin(name) else "user preset"
        desc = f"**{name}** ({origin}) — `{p.tag()}`\n\n{p.description}"
        return {self.ui.pv_desc: desc, self.ui.pv_yaml: lib.text(name)}

    def load_upload(self, path):
        if not path:
            return {}
        size = Path(path).stat().st_size
        if size > MAX_PRESET_BYTES:
            raise gr.Error(f"That preset file is {size} bytes: a preset is at most {MAX_PRESET_BYTES} bytes of YAML.")
        stem = "".join(c for c in Path(path).stem if c.isalnum() or c in "-_.")[:64]
        return {self.ui.new_yaml: Path(path).read_text(errors="replace"), self.ui.new_name: stem}

    def save_preset(self, name, text, request: gr.Request = None):
        name = (name or "").strip()
        if not name:
            raise gr.Error("Give the new preset a name.")
        try:
            lib = self.studio.library(request)
            p = lib.add(name, text or "")
        except ConfigError as e:
            raise gr.Error(f"Preset not saved: {e}") from None
        choices = lib.names()
        ui = self.ui
        out = {c: gr.update(choices=choices) for c in (ui.preset, ui.preset_a, ui.preset_b, ui.mx_presets)}
        out[ui.pv_name] = gr.update(choices=choices, value=name)
        out[ui.save_msg] = f"Saved **{name}** — `{p.tag()}`. It is now in every preset list."
        return out

    def export_history(self, hist):
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(HISTORY_COLUMNS)
        w.writerows(hist or [])
        return {self.ui.hist_file: self.studio.write("history.csv", buf.getvalue())}

    def on_model(self, model):
        try:
            p = self.studio.runner.profile(model)
        except Exception as e:  # an unknown name only fails when used; keep the form as it is
            raise gr.Error(str(e)) from None
        ui = self.ui
        return {
            ui.examples: gr.update(choices=list(p.example_prompts), value=None),
            ui.model_notes: notes_md(p.notes),
            ui.steps: p.steps,
            ui.width: p.width,
            ui.height: p.height,
            ui.guidance: gr.update(
                value=p.guidance if p.guidance is not None else 0.0, visible=p.guidance is not None
            ),
        }
