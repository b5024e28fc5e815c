"""The UI's event handlers: thin translations between form values (by the API's parameter names) and the device,
returning {component: value}. Bound to a facade (`Studio`) and the laid-out components (an app.forms.UI), so a test
can call them with a fake engine and no server. Loads no torch."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr
from starlette.requests import Request as StarletteRequest

from studio.app.admit import Admission, Asks
from studio.app.errors import shown
from studio.app.forms import UI, TuneForm
from studio.app.gpu_time import Durations
from studio.app.history import History, history_csv, record, restored
from studio.app.keep import FileKeeper
from studio.app.limits import PublicGuard, internal_visitor, visitor
from studio.app.maps import AB_MAP_WHERE, GEN_MAP_WHERE, compared
from studio.app.progress import progress_hooks
from studio.app.values import batch_pictures, image_numbers, json_safe, notes_md, png, table_frame, tile_at
from studio.bench.ladders import matrix_picks
from studio.measure.quality import difference, split_batch
from studio.report import fmt
from studio.report.card import broken_flag, metrics_card
from studio.report.images import enlarge, error_picture
from studio.report.plots import plot_paired, plot_steps, plot_sweep, plot_tradeoff
from studio.report.table import MatrixRow
from studio.report.text import tune_summary
from studio.spec import PresetLibrary
from studio.spec.ask import Ask
from studio.spec.checks import ConfigError
from studio.spec.presets import MAX_PRESET_BYTES, preset_from_text, preset_to_yaml
from studio.spec.profiles import shipped_loras
from studio.spec.settings import current
from studio.worker.protocol import Device

CACHE_CHOICES = [("follow preset", "unset"), ("on", "true"), ("off", "false")]
COMPILE_CHOICES = CACHE_CHOICES
PREDICTED = "speed-up the counts predict (screening, not timed)"


@dataclass
class Studio:
    """The facade the UI talks to: `device` does the device work, the rest stays in this process. In public mode each
    session's presets live in a folder of its own (under `tmpdir`); otherwise `presets`' user folder is shared."""

    device: Device
    models: list[str]
    presets: PresetLibrary
    public: bool = False
    guard: PublicGuard | None = None  # a public studio's limits (app.limits); None: none
    time_limit_s: float | None = None  # seconds a request may run on the device (app.limits: request_s); None: none
    tmpdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="studio-")))
    keeper: FileKeeper | None = None  # the pictures and downloads within STUDIO_MAX_FILES_MB (app.keep)
    cache_keeper: FileKeeper | None = None  # gradio's cache within STUDIO_MAX_CACHE_MB (app.ui sets it: its folder)

    def __post_init__(self):
        if self.keeper is None:
            self.keeper = FileKeeper([self.pictures_dir, self.tmpdir / "downloads"], current().max_files_mb)

    @property
    def pictures_dir(self) -> Path:
        return self.tmpdir / "pictures"

    def write(self, name: str, text: str) -> str:
        """Write a download as `name`, atomically, in a folder named by its content (two visitors' same-named
        downloads never meet); its path."""
        data = text.encode()
        path = self.tmpdir / "downloads" / hashlib.sha256(data).hexdigest()[:24] / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, staging = tempfile.mkstemp(dir=path.parent, prefix=".download-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(staging, path)
            self.keeper.noted()
        return str(path)

    def wrote(self, request) -> None:
        """Count an event that writes a file against its visitor (public)."""
        if self.guard is not None:
            self.guard.write(self.visitor(request))

    def wrote_scope(self, scope, nbytes: int = 0) -> None:
        """`wrote` for an upload of `nbytes` seen at the ASGI door, its bytes counted too (public); gradio's cache
        kept in bounds."""
        request = StarletteRequest(scope)
        self.wrote(request)
        if self.guard is not None:
            self.guard.uploaded(self.visitor(request), nbytes)
        if self.cache_keeper is not None:
            self.cache_keeper.noted()

    def internal(self, request) -> bool:
        """Whether `request` is this process's own call for a visitor (the OpenAI endpoint's)."""
        client = getattr(request, "client", None)
        return (
            internal_visitor(getattr(request, "headers", None), getattr(client, "host", None), reached(request))
            is not None
        )

    def internal_scope(self, scope) -> bool:
        """`internal` from an ASGI scope."""
        return self.internal(StarletteRequest(scope))

    def visitor_scope(self, scope) -> str:
        """`visitor` from an ASGI scope."""
        return self.visitor(StarletteRequest(scope))

    def saving(self, request, lib: PresetLibrary, name: str) -> None:
        """Check a visitor's save of preset `name` in `lib` against the public preset counts."""
        if self.guard is not None and lib.user_dir is not None:
            in_all = sum(1 for _ in (self.tmpdir / "sessions").glob("*/*.yaml"))
            self.guard.saving(self.visitor(request), lib.user_dir / f"{name}.yaml", in_all)

    def visitor(self, request) -> str:
        """Who `request` comes from, for the public limits (app.limits.visitor)."""
        client = getattr(request, "client", None)
        return visitor(
            getattr(client, "host", None),
            getattr(request, "headers", None),
            getattr(request, "session_hash", None),
            self.guard.proxy_hops if self.guard is not None else 0,
            local=reached(request),
            ipv6_prefix=self.guard.ipv6_prefix if self.guard is not None else 64,
        )

    def library(self, request=None) -> PresetLibrary:
        """The presets this visitor sees: built-ins plus their own (public mode) or the shared user folder."""
        if not self.public:
            return self.presets
        session = getattr(request, "session_hash", None)
        if not session:
            return self.presets.with_user_dir(None)
        safe = "".join(c for c in str(session) if c.isalnum())[:64] or "anonymous"
        return self.presets.with_user_dir(self.tmpdir / "sessions" / safe)


def reached(request) -> str | None:
    """The address `request`'s connection reached on this machine (ASGI's `server`); None where not known (a
    gr.Request rebuilt in a ZeroGPU call)."""
    inner = request.__dict__.get("request") if hasattr(request, "__dict__") else None  # gr.Request's, not its getattr
    scope = getattr(inner if inner is not None else request, "scope", None)
    server = scope.get("server") if isinstance(scope, dict) else None
    return str(server[0]) if server else None


class Handlers:
    def __init__(self, studio: Studio, ui: UI):
        self.studio = studio
        self.ui = ui
        self.asks = Asks(studio)  # each event's form read once into its Ask (app.admit, spec.ask)
        self.durations = Durations(studio)  # what each event reserves on ZeroGPU (app.gpu_time)
        self.admit = Admission(studio)  # the public limits on the Ask, before an event takes the device (app.admit)
        self._resolved: dict = {}  # preset -> what its device-dependent parts become here (asked of the device once)

    # helpers ---------------------------------------------------------------------------------------------
    def _ask(self, event: str, request, image, mask_image, values: dict) -> Ask:
        return self.asks.of(event, request, values, image=image, mask_image=mask_image)

    def _run(self, ask: Ask, stack, progress):
        on_step, on_status = progress_hooks(progress)
        with shown():
            return self.studio.device.generate(
                ask.request,
                stack,
                model=ask.model,
                compare=ask.compare,
                progress=on_step,
                on_status=on_status,
                time_limit_s=self.studio.time_limit_s,
            )

    def _history(self, hist: History | None, req, results) -> dict:
        hist = record(hist, req, results)
        h = self.ui.hist
        return {h.table: hist.rows, h.rows: hist, h.gallery: hist.gallery()}

    # events ----------------------------------------------------------------------------------------------
    # The device endpoints take the form's fields by name (gradio's inputs_kwargs: see app.forms); the session's
    # history (a gr.State) comes as `history`, apart from the API's parameters.
    # The image inputs are named in each signature with their default (None): gradio's API marks a parameter
    # optional from the handler's own default when its component starts empty.
    def generate(
        self,
        request: gr.Request = None,
        progress=gr.Progress(),
        *,
        history=None,
        image=None,
        mask_image=None,
        **values,
    ):
        ask = self._ask("generate", request, image, mask_image, values)
        res = self._run(ask, ask.stacks[0], progress)
        gen, metrics = self.ui.gen, json_safe(res.metrics.as_dict())
        tile_yx = tile_at(res.metrics.quality.worst_tile_psnr_db, res.metrics.quality.worst_tile_yx)
        return {
            gen.image: enlarge(res.image),
            gen.card: metrics_card(res.metrics),
            gen.base_image: enlarge(res.base_image),
            gen.error_map: error_picture(res.image, res.base_image, tile_yx),
            gen.compared: compared(
                res.image, res.base_image, tile_yx, res.metrics.quality.flip_worst_tile_yx, GEN_MAP_WHERE
            ),
            gen.steps_plot: png(lambda buf: plot_steps(res.metrics, buf)),
            gen.json: metrics,
            gen.json_file: self.studio.write("metrics.json", json.dumps(metrics, indent=1)),
            gen.batch: batch_pictures(res),  # a plain value: the API returns it as data (an update would be a dict)
            gen.last: res.image,
            **self._history(history, ask.request, [res]),
        }

    def generate_compared(
        self,
        request: gr.Request = None,
        progress=gr.Progress(),
        *,
        history=None,
        image=None,
        mask_image=None,
        **values,
    ):
        """ "Compare with base": the Generate form's request with compare `on`."""
        values = {**values, "compare": "on", "image": image, "mask_image": mask_image}
        return self.generate(request, progress, history=history, **values)

    def images(
        self,
        request: gr.Request = None,
        progress=gr.Progress(),
        *,
        history=None,
        image=None,
        mask_image=None,
        **values,
    ):
        """Generate pictures from a prompt with a speed preset on a diffusion transformer, and measure them: each
        picture comes at its own size with the studio's numbers for it (what ran, denoise time, the speed-up over
        the `base` preset with its interval, cached and full steps, PSNR/SSIM against base's picture).

        Args:
            prompt: what the picture shows.
            model: the model (empty: the studio's first).
            preset: the speed preset (`base`: no speed-up, the reference; `cache`: step caching; see the Presets tab).
            seed: the seed (a batch's pictures take seed, seed + 1, ...).
            steps: denoising steps.
            width: width in pixels.
            height: height in pixels.
            num_images_per_prompt: pictures in one call, 1-4.
            compare: `on` times base beside the run (speed-up and PSNR), `auto` reuses a kept base timing of the same
                shape, `off` runs the preset alone (no speed-up, no PSNR).

        Returns:
            the picture (PNG; a batch's pictures stacked top to bottom), the pictures one by one, and a list of one
            record of numbers per picture.
        """
        ask = self._ask("generate", request, image, mask_image, values)
        res = self._run(ask, ask.stacks[0], progress)
        numbers = image_numbers(res.metrics.as_dict())
        pics = split_batch(res.image, len(numbers))
        api = self.ui.api
        return {
            api.picture: res.image,
            api.pictures: [(p, f"seed {x['seed']}: {x['tag']}") for p, x in zip(pics, numbers, strict=True)],
            api.numbers: numbers,
        }

    def compare(
        self,
        request: gr.Request = None,
        progress=gr.Progress(),
        *,
        history=None,
        image=None,
        mask_image=None,
        **values,
    ):
        ask = self._ask("compare", request, image, mask_image, values)
        ra, rb = (self._run(ask, stack, progress) for stack in ask.stacks)
        rows = [MatrixRow.from_metrics(ra.metrics), MatrixRow.from_metrics(rb.metrics)]
        flag = broken_flag(rows)  # only a broken stack is flagged above the pictures; the table shows every verdict
        a, b = enlarge(ra.image), enlarge(rb.image)
        b_vs_a = difference(rb.image, ra.image)  # the numbers of the map beside the slider
        tile_yx = tile_at(b_vs_a["worst_tile_psnr_db"], b_vs_a["worst_tile_yx"])
        ab = self.ui.ab
        return {
            ab.slider: (a, b),
            ab.error_map: error_picture(rb.image, ra.image, tile_yx),
            ab.compared: compared(rb.image, ra.image, tile_yx, None, AB_MAP_WHERE, ("B", "A"), fmt.AB_TILE_NOTE),
            ab.img_a: a,
            ab.img_b: b,
            ab.table: [r.ab_cells() for r in rows],
            ab.flag: flag,
            ab.json: json_safe({"a": ra.metrics.as_dict(), "b": rb.metrics.as_dict(), "b_vs_a": b_vs_a}),
            **self._history(history, ask.request, [ra, rb]),
        }

    def matrix(
        self,
        request: gr.Request = None,
        progress=gr.Progress(),
        *,
        history=None,
        image=None,
        mask_image=None,
        **values,
    ):
        ask = self._ask("matrix", request, image, mask_image, values)
        with shown():
            mat = self.studio.device.matrix(
                ask.request,
                list(ask.stacks),
                model=ask.model,
                repeats=ask.repeats,
                progress=lambda d, t, label: progress((d, t), desc=f"{label}: {d} of {t} timed runs", unit="runs"),
                library=self.studio.library(request),
                time_limit_s=self.studio.time_limit_s,
                prompts=ask.prompts[1:],
            )
        runs = {name: r.metrics.as_dict() for name, r in mat.results.items()}
        first = mat.chart_preset()  # the first cached stack, not whatever comes after base
        mx = self.ui.mx
        return {
            mx.table: table_frame(mat),  # with the optional columns some row has (FLIP; the worst over prompts)
            mx.plot: png(
                lambda buf: (
                    plot_paired(mat.paired, buf) if mat.paired else plot_tradeoff(mat.rows, buf, fewer=mat.fewer)
                )
            ),
            mx.pick: gr.update(choices=list(runs), value=first),
            mx.steps_plot: png(lambda buf: plot_steps(runs[first], buf)),
            mx.csv: self.studio.write("matrix.csv", mat.csv()),
            mx.md: self.studio.write("matrix.md", mat.markdown()),
            mx.runs: runs,
            mx.json: json_safe([r.as_dict() for r in mat.rows]),
            mx.noise: mat.noise_line(),
            **self._history(history, ask.request, list(mat.results.values())),
        }

    def tune(self, request: gr.Request = None, progress=gr.Progress(), *, image=None, mask_image=None, **values):
        """The tuner on the form's request with each prompt; public: the quick search only (it holds the device for
        minutes)."""
        ask = self._ask("tune", request, image, mask_image, values)
        form = TuneForm(image=image, mask_image=mask_image, **values)  # the tuner's own fields (not a stack's)
        size = "quick" if self.studio.public else form.size
        with shown():
            floor = float(form.floor)
            max_flip = float(form.max_flip) if form.max_flip else None  # 0 or empty: PSNR alone
            res = self.studio.device.tune(
                list(ask.requests),
                floor,
                model=ask.model,
                progress=lambda m: progress(0, desc=m),
                quick=size != "full",
                time_limit_s=self.studio.time_limit_s,
                max_flip=max_flip,
            )
        xs, ys, dbs = ([c[i] for c in res.curve] for i in range(3))
        label = "residual_diff_threshold (no calibrator)"
        plot = None
        if res.curve:
            plot = png(lambda buf: plot_sweep(label, xs, ys, dbs, None, buf, floor_db=floor, speed_label=PREDICTED))
        text = tune_summary(res, markdown=True)
        tn = self.ui.tn
        return {
            tn.result: text,
            tn.plot: plot,
            tn.yaml: preset_to_yaml(res.preset),
            tn.name: res.preset.name,
            tn.json: json_safe(res.as_dict()),
        }

    def all_methods(self, request: gr.Request = None):
        """The Matrix's "all step caches": base, the shipped DBCache and every method (its searched best where `methods
        --write` left one: docs/methods.md), at one repeat (within a public studio's matrix limit)."""
        picked = matrix_picks(self.studio.library(request).names())
        return {self.ui.mx.presets: gr.update(value=picked), self.ui.mx.repeats: 1}

    def pick_steps(self, name, runs):
        if not name or name not in (runs or {}):
            return {self.ui.mx.steps_plot: None}
        return {self.ui.mx.steps_plot: png(lambda buf: plot_steps(runs[name], buf))}

    def export_history(self, hist, request: gr.Request = None):
        with shown():
            self.studio.wrote(request)
        return {self.ui.hist.file: self.studio.write("history.csv", history_csv(hist))}

    @staticmethod
    def keep_history(hist):
        """The session's rows, for the browser's storage."""
        return json_safe(hist.rows) if isinstance(hist, History) else []

    def restore_history(self, saved):
        """On page load: the rows this browser kept."""
        hist = restored(saved)
        return {self.ui.hist.table: hist.rows, self.ui.hist.rows: hist}

    def clear_history(self):
        h, empty = self.ui.hist, History()
        return {h.table: [], h.rows: empty, h.gallery: [], h.saved: []}

    def on_model(self, model):
        with shown():  # an unknown name only fails when used; a folder's broken profile is said here
            p = self.studio.device.profile(model)
        r = self.ui.request
        return {
            r.examples: gr.update(choices=list(p.example_prompts), value=None),
            r.model_notes: notes_md(p.notes),
            r.steps: p.steps,
            r.width: p.width,
            r.height: p.height,
            r.guidance: gr.update(value=p.guidance if p.guidance is not None else 0.0, visible=p.guidance is not None),
            r.true_cfg_scale: p.true_cfg_scale or 1.0,
            r.aspect: gr.update(choices=[a[0] for a in p.aspect_sizes()], value=None),
            r.lora_pick: gr.update(choices=list(shipped_loras(model)), value=None),
        }

    @staticmethod
    def on_lora_pick(name, text):
        """A picked shipped LoRA added to the LoRA box at scale 1, unless it is there."""
        lines = [x for x in str(text or "").splitlines() if x.strip()]
        if not name or any(x.strip().rpartition("@")[0] == name or x.strip() == name for x in lines):
            return text
        return "\n".join(lines + [f"{name}@1"])

    def on_aspect(self, label, model):
        """Width and height from the model profile's size for the chosen aspect ratio."""
        sizes = {a[0]: a[1:] for a in self.studio.device.profile(model).aspect_sizes()}
        if label not in sizes:
            return {}
        r = self.ui.request
        return {r.width: sizes[label][0], r.height: sizes[label][1]}

    # the Presets tab (and the Tune tab's save): a preset shown with what it becomes here, exported for cache-dit,
    # uploaded, saved
    def save_tuned(self, name, text, request: gr.Request = None):
        if not (text or "").strip():
            raise gr.Error("Run the tuner first: there is no tuned preset to save yet.")
        out = self.save_preset(name, text, request)
        out[self.ui.tn.msg] = out.pop(self.ui.pv.msg)
        return out

    def show_preset(self, name, request: gr.Request = None):
        """A preset's description and YAML, and the YAML as a download."""
        lib = self.studio.library(request)
        with shown():
            p = lib.get(name)
        origin = "built in" if lib.is_builtin(name) else "user preset"
        if p not in self._resolved:
            self._resolved[p] = self.studio.device.resolved(p)
        desc = f"**{name}** ({origin}) — asks for `{p.tag()}`\n\n{p.description}\n\n*{self._resolved[p]}*"
        pv, text = self.ui.pv, lib.text(name)
        return {pv.desc: desc, pv.yaml: text, pv.yaml_file: self.studio.write(f"{name}.yaml", text)}

    def show_plan(self, name, device="here", model=None, request: gr.Request = None):
        """What the preset would run on `device` (here, or a named profile) for the model, and its memory plan
        (engine.plan, on the device)."""
        with shown():
            p = self.studio.library(request).get(name)
        try:
            return self.studio.device.plan(p, device or "here", model or None)
        except ConfigError as e:  # a model with no configs to plan from: the pane says so (no toast per change)
            return f"no plan: {e}"

    def export_preset(self, name, steps=None, request: gr.Request = None):
        """The preset as the YAML `cache_dit.load_configs` reads (step mask sized to `steps`), made by the device:
        cache-dit's config objects load torch."""
        with shown():
            self.studio.wrote(request)
            p = self.studio.library(request).get(name)
            text = self.studio.device.export(p, int(steps) if steps else None)
        return {self.ui.pv.export_file: self.studio.write(f"{name}.cache-dit.yaml", text)}

    def load_upload(self, path):
        if not path:
            return {}
        size = Path(path).stat().st_size
        if size > MAX_PRESET_BYTES:
            raise gr.Error(f"That preset file is {size} bytes: a preset is at most {MAX_PRESET_BYTES} bytes of YAML.")
        stem = "".join(c for c in Path(path).stem if c.isalnum() or c in "-_.")[:64]
        return {self.ui.pv.new_yaml: Path(path).read_text(errors="replace"), self.ui.pv.new_name: stem}

    def save_preset(self, name, text, request: gr.Request = None):
        name = (name or "").strip()
        if not name:
            raise gr.Error("Give the new preset a name.")
        with shown("Preset not saved: "):
            lib = self.studio.library(request)
            if self.studio.guard is not None:  # checked before the file is written
                self.studio.guard.preset(preset_from_text(text or "", name), builtin=False)
            self.studio.wrote(request)
            self.studio.saving(request, lib, name)
            p = lib.add(name, text or "")
        choices = lib.names()
        pv = self.ui.pv
        out = {c: gr.update(choices=choices) for c in self.ui.preset_lists()}
        out[pv.name] = gr.update(choices=choices, value=name)
        out[pv.msg] = f"Saved **{name}** — `{p.tag()}`. It is now in every preset list."
        return out
