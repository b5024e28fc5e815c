"""Where the studio is hosted (no torch: the app's process asks before anything loads)."""

from __future__ import annotations

from pathlib import Path

from studio.spec.settings import current

ROOT = str(Path(__file__).resolve().parents[2])  # the folder `studio` is in (the edges put it on PYTHONPATH)


def on_zerogpu() -> bool:
    """ZeroGPU Spaces (`spaces` installed and SPACES_ZERO_GPU set): the GPU is attached per call to a process that
    `spaces` forks for the handler, and run-time compilation is not available."""
    return current().zerogpu
