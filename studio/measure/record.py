"""RunMetrics: everything one run measured, as one record; field names are the CLI's and the API's JSON keys.
`RunMetrics.of` derives the speed-up, base age, verdict and timing line from facts; nothing patches them afterwards."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from importlib import metadata

import numpy as np

from studio.measure.blocks import IdealCheck
from studio.measure.estimate import Estimate, interval_level, shown
from studio.measure.lpips import lpips_against
from studio.measure.quality import Verdict, judge, judge_batch
from studio.measure.timing import StepCounts
from studio.spec.headroom import CacheRoom

LIBRARIES = ("torch", "diffusers", "cache-dit", "torchao", "transformers")


def library_versions() -> dict:
    out = {}
    for pkg in LIBRARIES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass(frozen=True)
class Timing:
    """How a run's time was taken, as facts; `text()` is the record's `timing` line."""

    warmup_in_call: bool  # the untimed warm-up (or compile) ran in this call, not earlier
    runs: int = 1  # timed runs the reported one is the median of
    interleaved: bool = False  # base runs alternated with them
    base_now: bool | None = None  # the base timing was taken in this call (True), kept from before (False); None: none
    in_workers: bool = False  # timed inside parallel worker rank 0
    screening: bool = False  # not a measurement: no warm-up, time not reported (the tuner's screening runs)
    by_shape: bool = False  # the base timing is a kept one of the same shape (compare auto), maybe another prompt's
    grouped: bool = False  # base's runs came after the stack's, not between them (the device holds one weight set)

    def text(self, base_age_s: float | None) -> str:
        if self.screening:
            return "screening run: not warmed up, not a measurement"
        out = "warm-up run done" + (" in this call" if self.warmup_in_call else " earlier") + ", "
        out += {1: "1 timed run", 2: "the faster of 2 timed runs"}.get(self.runs, f"median of {self.runs} timed runs")
        if self.grouped:
            out += ", then base's as many (the device holds one weight set at a time: each set loaded once)"
        else:
            out += " interleaved with base" if self.runs > 1 and self.interleaved else ""
        out += " (timed inside parallel worker rank 0)" if self.in_workers else ""
        if self.by_shape:
            out += f"; base timed on a request of the same shape (prompt and seed aside), {base_age_s:.0f} s ago"
        elif self.base_now is True:
            out += f"; base timed warm right {'after' if self.grouped else 'before'}, in this call"
        elif self.base_now is False:
            out += f"; base timed warm {base_age_s:.1f} s before (kept)"
        return out


@dataclass(kw_only=True)
class RunTiming:
    """How long the run took, how it was timed, and its speed-up against base. The engine fills what it measured;
    `RunMetrics.of` derives the rest (the mean step, `how`, the speed-up and its interval)."""

    denoise_s: float
    step_ms: list[float]
    mean_step_ms: float = 0.0
    total_s: float
    how: str = ""  # how the timing was taken (warm-up, repeats, base freshness); the JSON's `timing`
    compile_s: float | None = None  # warm-up run that compiled, kept out of denoise time
    warmup_s: float | None = None  # untimed warm-up run of this stack and shape, when one ran
    base_denoise_s: float | None = None
    base_age_s: float | None = None  # seconds between the end of the base timing and the end of this run's
    speedup: float | None = None
    speedup_lo: float | None = None  # the speed-up's interval (studio.measure.estimate: a bootstrap, symmetric)
    speedup_hi: float | None = None
    interval_level: float | None = None  # what that interval held on recorded runs (estimate.COVERAGE, quiet)
    speedup_note: str | None = None  # why there is no speed-up (a useless interval; a measurement error), in words
    timed_pairs: int = 0  # base/stack pairs the speed-up came from
    pairs_stop: str | None = None  # why the pairing stopped where it did
    stalled_runs: int = 0  # timed runs a stall or a slow spell hit (the estimate holds)
    # what the speed-up divides: each side's floor price, each kind of step at its fastest over its timed runs, times
    # its count (studio.measure.estimate.price_ms), in seconds; beside the wall times a stall can lift
    denoise_priced_s: float | None = None
    base_priced_s: float | None = None
    # the share of the cores this process's threads needed that other programs took while the pairing ran
    # (studio.measure.crowding; None: not read, off the CPU or on parallel workers): CROWDED or more withholds
    cores_taken: float | None = None
    # the host's share of the cores meanwhile (a VM's steal, a container's waits for a CPU; studio.measure.crowding):
    # said beside the number from HOST_SAID on, not withheld; None: not read
    cores_host: float | None = None
    # base's floor per step over the fastest this machine has run the same request shape (studio.measure.pace; 0.27 =
    # 27% slower; None: no record, or base not timed in this call): over CARD_SLACK the host was slow, and a step
    # cache's speed-up reads off then (said on the card, not withheld: docs/measuring.md)
    base_pace_over: float | None = None


@dataclass
class RunCache:
    """What the step cache skipped and by whose count."""

    full_steps: int
    cached_steps: int
    transformer_calls: int  # over the whole run: steps x calls per step (2 with true CFG)
    cached_step_indices: list[int]
    count_source: str  # where the cached/full counts came from
    count_check: str | None  # agreement of a second source, or a disagreement
    residual_diffs: dict[int, float] = field(default_factory=dict)
    cache_threshold: float | None = None
    backend_cached_steps: list[int] | None = None  # the cache backend's own list, where it keeps one
    backend_cfg_cached_steps: list[int] | None = None  # its list for the unconditional branch, CFG cached apart
    blocks: int = 0  # transformer blocks one full call runs
    pruned_blocks: int | None = None  # DBPrune: block calls it pruned over the run, of `block_calls` (its own count)
    block_calls: int | None = None

    @classmethod
    def of(cls, counts: StepCounts, **report) -> RunCache:
        """The counts of a run (measure.timing) beside the backend's own `report` (this record's other fields)."""
        return cls(
            counts.full,
            counts.cached,
            cached_step_indices=counts.cached_indices,
            count_source=counts.source,
            count_check=counts.check,
            **report,
        )


@dataclass
class RunIdeal:
    """The speed-up the counts could give were the cache's own work free (measure.blocks), and the run against it."""

    ideal_speedup: float | None = None
    cached_share: float | None = None  # a cached step's ideal price as a share of a full step, measured
    ideal_source: str | None = None  # where the block times behind `cached_share` came from
    of_ideal: float | None = None  # measured speed-up over its non-cache reference, over the ideal
    of_ideal_lo: float | None = None  # its interval (the measured speed-up's, over the ideal)
    of_ideal_hi: float | None = None
    of_ideal_against: str | None = None  # that reference: "base", or "its own full steps"
    ideal_detail: dict | None = None  # the numbers behind the ideal: block times, full step, skipped time, share
    of_ideal_note: str | None = None  # why there is no `of ideal` (a reading over its ideal: a measurement error)

    @classmethod
    def of(cls, ideal: IdealCheck | None) -> RunIdeal:
        """The record of `ideal` (empty: nothing cached)."""
        if ideal is None:
            return cls()
        lo, hi = ideal.of_ideal_range or (None, None)
        return cls(
            ideal_speedup=ideal.ideal,
            cached_share=ideal.price.share,
            ideal_source=ideal.price.source,
            of_ideal=ideal.of_ideal,
            of_ideal_lo=lo,
            of_ideal_hi=hi,
            of_ideal_against=ideal.against,
            ideal_detail=ideal.price.as_dict(),
            of_ideal_note=ideal.why_not_shown(),
        )


@dataclass
class RunQuality:
    """The picture against base: the verdict and the figures behind it (None: not compared)."""

    verdict: Verdict = Verdict.NOT_COMPARED  # the JSON's `quality`
    psnr_db: float | None = None
    ssim: float | None = None
    hf_ratio: float | None = None
    worst_tile_psnr_db: float | None = None  # PSNR of the worst 8x8 tile against base (measure.quality.worst_tile)
    worst_tile_yx: list[int] | None = None  # that tile's top-left pixel, [y, x]
    # FLIP against base (measure.quality): the mean error (0 no visible difference, 1 the most), the highest mean of an
    # 8x8 tile and its top-left pixel [y, x]. The map as a picture: studio.measure.quality.flip_map(image, base_image).
    flip: float | None = None
    flip_worst_tile: float | None = None
    flip_worst_tile_yx: list[int] | None = None
    # LPIPS against base (measure.lpips, AlexNet v0.1) where its weights are present; else None and the sentence
    # saying how to add them (measure.lpips.NO_WEIGHTS). None and None: not compared.
    lpips: float | None = None
    lpips_note: str | None = None
    # A batch (num_images_per_prompt > 1), per picture in order: its seed and its PSNR, SSIM and verdict against the
    # same batch's base picture (the record's own are the batch's: measure.quality.judge_batch). None: one picture.
    batch: list[dict] | None = None
    # Against base at the step count of this run's speed-up (a cached run compared on: studio.engine.runner): steps,
    # full, speedup (by count), psnr_db (its picture against the full-step base picture), margin_db (this run's PSNR
    # minus that). None: not measured.
    vs_fewer: dict | None = None


@dataclass
class RunMemory:
    # The denoise loop's peak memory (studio.measure.memory): kind, peak_bytes, reserved_bytes, note. None: not read
    # here (parallel workers).
    peak_memory: dict | None = None
    # Under a block-streaming offload regime: bytes copied host-to-device per full and per cached step
    # (engine.offload.stream_report). None: everything resident.
    h2d: dict | None = None


@dataclass
class RunPlacement:
    device: str
    # Where each component of the pipeline lives (engine.placement.describe): regime, components {name: where},
    # device_bytes / host_bytes between uses, the peak estimate and the free memory it was placed against. None: not
    # recorded. The JSON's `placement`.
    plan: dict | None = None
    parallel: dict | None = None  # parallel workers: kind, world_size, ray, workers [{rank, device, host, pid}]


@dataclass
class RunLabels:
    tag: str  # the label of what RAN, from the engaged stack (spec.label), e.g. bf16+int8wo+DBCache_...+sdpa+compile
    dtype: str  # the dtype that ran (a preset's `auto` resolved)
    requested_tag: str = ""  # the label of what the preset asked for (`auto` unresolved, `sage` where SDPA ran)
    label_changes: list[str] = field(default_factory=list)  # parts that did not run as asked: ["sage->sdpa"]
    engaged: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)


# the parts of a RunMetrics, by attribute: its flat form (the CLI's and the API's JSON) merges their fields, these
# three under the JSON's names
PARTS = {"timing": RunTiming, "cache": RunCache, "ideal": RunIdeal, "room": CacheRoom, "quality": RunQuality}
PARTS |= {"memory": RunMemory}
PARTS |= {"placement": RunPlacement, "labels": RunLabels}
FLAT_NAMES = {"how": "timing", "verdict": "quality", "plan": "placement"}


@dataclass
class RunMetrics:
    """Everything one run measured, by concern. `as_dict()` is its flat form (docs/api.md), `from_dict` its inverse."""

    model: str
    preset: str
    request: dict
    timing: RunTiming
    cache: RunCache
    ideal: RunIdeal
    room: CacheRoom
    quality: RunQuality
    memory: RunMemory
    placement: RunPlacement
    labels: RunLabels
    reloaded: bool = False
    versions: dict = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        image: np.ndarray,
        base_image: np.ndarray | None,
        base_timed_at: float | None,
        ended: float,
        timing: Timing,
        timed: RunTiming,
        ratio: Estimate | None,
        ideal: IdealCheck | None,
        **parts,
    ) -> RunMetrics:
        """The record of one measured run compared with its base (None: not compared). `base_timed_at`, `ended`:
        time.monotonic at the end of the base's and this run's timing; `timed`: what the engine measured; `ratio`:
        base over this run from the timed pairs; `ideal`: None if nothing cached; `parts`: the other fields."""
        age = abs(ended - base_timed_at) if base_timed_at is not None else None
        s = shown(ratio)
        note = s.note
        if note is None and ideal is not None and ideal.against == "base":
            note = ideal.why_impossible()  # over base, a speed-up beyond the ideal is an error, not a result
        shows = note is None
        return cls(
            timing=replace(
                timed,
                mean_step_ms=(timed.denoise_s / max(1, len(timed.step_ms))) * 1e3,
                how=timing.text(age),
                base_age_s=age,
                speedup=s.point if shows else None,
                speedup_lo=s.lo if shows else None,
                speedup_hi=s.hi if shows else None,
                interval_level=interval_level() if s.lo is not None and shows else None,
                speedup_note=note,
                timed_pairs=ratio.pairs if ratio is not None else 0,
                pairs_stop=(ratio.stop or None) if ratio is not None else None,
                stalled_runs=ratio.stalled if ratio is not None else 0,
            ),
            ideal=RunIdeal.of(ideal),
            quality=_judged(image, base_image, parts.get("request") or {}),
            versions=library_versions(),
            **parts,
        )

    def as_dict(self) -> dict:
        """The flat form: the parts' fields side by side under the JSON's names (docs/api.md)."""
        d = {k: v for k, v in asdict(self).items() if k not in PARTS}
        for name in PARTS:
            d |= {FLAT_NAMES.get(k, k): v for k, v in asdict(getattr(self, name)).items()}
        d["residual_diffs"] = {str(k): v for k, v in self.cache.residual_diffs.items()}
        d["quality"] = str(self.quality.verdict)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunMetrics:
        """The record of a flat form (as_dict's inverse; a key it does not know is an error)."""
        flat = {**d, "quality": Verdict(d.get("quality", Verdict.NOT_COMPARED))}
        if "residual_diffs" in flat:
            flat["residual_diffs"] = {int(k): v for k, v in flat["residual_diffs"].items()}
        back = {v: k for k, v in FLAT_NAMES.items()}
        parts = {}
        for name, part in PARTS.items():
            names = {f.name for f in fields(part)}
            parts[name] = part(**{back.get(k, k): flat.pop(k) for k in list(flat) if back.get(k, k) in names})
        return cls(**flat, **parts)

    @property
    def broken(self) -> bool:
        return self.quality.verdict is Verdict.BROKEN


def _judged(image, base_image, request: dict) -> RunQuality:
    """The run's picture against base (RunQuality() where there is none); a batch's per picture too."""
    n = request.get("num_images_per_prompt") or 1
    if base_image is None:
        return RunQuality(batch=[_picture(request, i, None) for i in range(n)] if n > 1 else None)
    q, each = (judge(image, base_image), None) if n == 1 else judge_batch(image, base_image, n)
    lp, lp_note = lpips_against(image, base_image)
    return RunQuality(
        verdict=q.verdict,
        psnr_db=q.psnr_db,
        ssim=q.ssim,
        hf_ratio=q.hf_ratio,
        worst_tile_psnr_db=q.worst_tile_psnr_db,
        worst_tile_yx=list(q.worst_tile_yx),
        flip=q.flip,
        flip_worst_tile=q.flip_worst_tile,
        flip_worst_tile_yx=list(q.flip_worst_tile_yx) if q.flip_worst_tile_yx else None,
        lpips=lp,
        lpips_note=lp_note,
        batch=[_picture(request, i, e) for i, e in enumerate(each)] if each is not None else None,
    )


def _picture(request: dict, i: int, e) -> dict:
    """One picture of a batch: its seed, and its figures against the batch's base picture (None: not compared)."""
    return {
        "seed": request["seed"] + i,
        "psnr_db": e.psnr_db if e else None,
        "ssim": e.ssim if e else None,
        "flip": e.flip if e else None,
        "quality": str(e.verdict if e else Verdict.NOT_COMPARED),
    }


@dataclass
class RunResult:
    """One generation as it leaves the engine (and crosses the device worker's pipe): picture, base, record."""

    image: np.ndarray  # HxWx3 uint8
    base_image: np.ndarray | None
    metrics: RunMetrics

    def pil(self):
        from PIL import Image

        return Image.fromarray(self.image)
