"""Library chatter below errors and no per-pipeline progress bars (WorkerConfig.quiet): stderr stays the CLI's."""

from __future__ import annotations

import logging
import warnings

LIBRARIES = ("torch", "torch.utils._pytree", "torchao", "diffusers", "transformers", "cache_dit", "accelerate", "ray")


def quiet_libraries() -> None:
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401  (torch sets its loggers' levels on import: quiet them after)

    for name in LIBRARIES:
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
