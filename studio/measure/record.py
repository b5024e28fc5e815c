"""RunMetrics: everything one run measured, as one record. Field names are the CLI's and the API's JSON keys."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from studio.measure.quality import Verdict


@dataclass
class RunMetrics:
    model: str
    preset: str
    tag: str
    device: str
    dtype: str  # the dtype that ran (a preset's `auto` resolved)
    request: dict
    denoise_s: float
    step_ms: list[float]
    mean_step_ms: float
    full_steps: int
    cached_steps: int
    transformer_calls: int  # over the whole run: steps x calls per step (2 with true CFG)
    cached_step_indices: list[int]
    count_source: str  # where the cached/full counts came from
    count_check: str | None  # agreement of a second source, or a disagreement
    residual_diffs: dict[int, float]
    cache_threshold: float | None
    backend_cached_steps: list[int] | None  # the cache backend's own list, where it keeps one
    backend_cfg_cached_steps: list[int] | None  # its list for the unconditional branch, when CFG is cached apart
    speedup: float | None
    base_denoise_s: float | None
    base_age_s: float | None  # seconds between the end of the base timing and the end of this run's
    psnr_db: float | None
    ssim: float | None
    hf_ratio: float | None
    quality: Verdict
    timing: str  # how the timing was taken (warm-up, repeats, base freshness)
    compile_s: float | None  # warm-up run that compiled, kept out of denoise time
    warmup_s: float | None  # untimed warm-up run of this stack and shape, when one ran
    engaged: list[str]
    fallbacks: list[str]
    reloaded: bool
    total_s: float
    versions: dict = field(default_factory=dict)
    blocks: int = 0  # transformer blocks one full call runs
    ideal_speedup: float | None = None  # what the cached/full counts would give if a cached step cost only Fn+Bn
    parallel: dict | None = None  # parallel workers: kind, world_size, ray, workers [{rank, device, host, pid}]

    @property
    def of_ideal(self) -> float | None:
        """Measured speed-up over the ideal one: what the caching machinery itself costs (1.0: nothing)."""
        if self.speedup is None or not self.ideal_speedup:
            return None
        return self.speedup / self.ideal_speedup

    def as_dict(self) -> dict:
        d = asdict(self)
        d["residual_diffs"] = {str(k): v for k, v in self.residual_diffs.items()}
        d["quality"] = str(self.quality)
        d["of_ideal"] = self.of_ideal
        return d

    @property
    def broken(self) -> bool:
        return self.quality is Verdict.BROKEN
