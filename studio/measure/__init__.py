"""measure: timing (a clock, step counting that survives torch.compile) and quality (PSNR, SSIM, verdicts).

Imports only `spec` from the studio.
"""

from studio.measure.quality import Quality, Verdict, judge, noise_energy, psnr, ssim
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
    "judge",
    "noise_energy",
    "psnr",
    "ssim",
]
