"""DiT Speed Studio: fast diffusion-transformer generation with measured speed and quality."""

import os

# cache-dit logs every hook it installs to stdout at INFO and WARNING; keep stdout for results (the CLI's --json).
os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")

__version__ = "0.1.0"
