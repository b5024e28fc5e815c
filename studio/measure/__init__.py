"""measure: timing (a clock, step counting that survives torch.compile) and quality (PSNR, SSIM, the error map and
the worst tile, verdicts).

Imports only `spec` from the studio.
"""

from studio.measure.quality import Quality, Verdict, error_map, judge, noise_energy, psnr, ssim, worst_tile
from studio.measure.record import RunMetrics
from studio.measure.timing import StepCounter, StepCounts, StepProbe, StepRecord, count_steps

__all__ = [
    "Quality",
    "RunMetrics",
    "StepCounter",
    "StepCounts",
    "StepProbe",
    "StepRecord",
    "Verdict",
    "count_steps",
    "error_map",
    "judge",
    "noise_energy",
    "psnr",
    "ssim",
    "worst_tile",
]
