"""The errors a request can end with besides a bad value (checks.ConfigError), each one sentence a person can read.

They live at the bottom of the house so that the app's process can raise the ones the device worker sends back
(studio.worker.client) without loading the engine, and torch with it.
"""

from __future__ import annotations

import signal


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says which and why, in words a person can act on."""


class RunError(RuntimeError):
    """A run failed inside the pipeline (or the process running it died); the message is one sentence."""


class OverTime(RunError):
    """A request ran past the studio's time limit per request and was stopped between two steps (engine.run)."""


def how_it_died(exitcode: int | None) -> str:
    """A process's end in a word or two: the signal's name (SIGSEGV, SIGKILL: the OOM killer's, SIGABRT) or the
    exit code."""
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        if -exitcode == signal.SIGKILL:
            return "SIGKILL: out of memory, or killed"  # the kernel's OOM killer sends SIGKILL
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
