"""DiT Speed Studio: fast diffusion-transformer generation with measured speed and quality.

Its entry points (app.py, `python -m studio`, the tests' conftest) read the environment once, into
studio.spec.settings; nothing below them reads or writes os.environ.
"""

__version__ = "0.1.0"
