"""The command line's own plumbing: prompt files, quiet libraries, the progress bar on stderr."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def read_prompts(path: str | None) -> list[str] | None:
    """Prompts from a file, one per line; blank lines and lines starting with # are skipped."""
    if not path:
        return None
    lines = [x.strip() for x in Path(path).read_text(encoding="utf-8").splitlines()]
    prompts = [x for x in lines if x and not x.startswith("#")]
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompts in the file (one per line)")
    return prompts


def quiet_libraries() -> None:
    """Keep stderr for the progress bar: no per-pipeline bars, no library chatter below errors."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch  # noqa: F401  (torch sets its loggers' levels on import: quiet them after)

    for name in (
        "torch",
        "torch.utils._pytree",
        "torchao",
        "diffusers",
        "transformers",
        "cache_dit",
        "accelerate",
        "ray",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import torchao  # noqa: F401  (imported here, quietly, rather than in the middle of the progress bar)
    except ImportError:  # nothing lost here: an int8 preset says on its row that torchao is missing
        pass
    import diffusers  # both are requirements: a failure here is a broken install, and says so
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def progress_bar(desc: str):
    """A tqdm bar on stderr; returns (callback(done, total, label), close)."""
    from tqdm import tqdm

    bar = tqdm(total=1, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)

    def tick(done, total, label):
        bar.total = total
        bar.set_postfix_str(str(label)[:40])
        bar.update(done - bar.n)

    return tick, bar.close
