"""DiT Speed Studio: fast diffusion-transformer generation with measured speed and quality. Only its entry points
(app.py, `python -m studio`, the tests' conftest) read the environment, once, into studio.spec.settings."""

__version__ = "0.1.0"
