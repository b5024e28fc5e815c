"""Errors a request can end with besides a bad value (checks.ConfigError), each one sentence a person can read;
at the bottom of the house so the app's process can raise those the device worker sends back without loading torch."""

from __future__ import annotations

import signal

from studio.spec.checks import ConfigError


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says which and why, in words a person can act on."""


class RunError(RuntimeError):
    """A run failed inside the pipeline (or the process running it died); the message is one sentence."""


class OverTime(RunError):
    """A request ran past the studio's time limit per request and was stopped between two steps (engine.run)."""


class Invariant(AssertionError):
    """The studio's own invariant broken (a quantized transformer quantized again, a calibration that recorded the
    wrong count): a bug, never a run failure nor a user's error, so it reaches the one boundary with its traceback."""


class StudioBug(RunError):
    """An exception no part of the studio expected (a TypeError, an IndexError, a ValueError from a library) reached
    the edge of a device call: its traceback is logged where it happened, and the user reads `bug_sentence`."""


# The errors a person is told as they are: a bad value (ConfigError and its kinds, such as a public studio's limits),
# a model that cannot load, a run that failed with its sentence (RunError and its kinds: OverTime, a crashed worker, a
# StudioBug already said). Nothing else: a plain ValueError or TypeError is a bug, not a user's mistake.
USER_ERRORS = (ConfigError, ModelLoadError, RunError)

# What a run may fail with that is not the studio's fault, and so becomes a RunError with its sentence: a resource
# running out (MemoryError; torch's OutOfMemoryError is a RuntimeError), a kernel, compiler or allocator failing
# (torch, Inductor and cache-dit raise RuntimeError; a kernel missing for a dtype, NotImplementedError), or an error
# class of the libraries a run goes through (Ray's, when a parallel worker dies; Triton's). A TypeError, KeyError,
# ValueError or AttributeError is none of these: it is a bug, and reaches the one boundary with its traceback.
RUN_FAILURES = (RuntimeError, MemoryError, NotImplementedError)
RUN_LIBRARIES = ("torch", "triton", "ray", "cache_dit", "diffusers", "torchao", "sageattention", "kernels")


def is_run_failure(e: BaseException) -> bool:
    """Whether `e`, raised inside a run, is a failure the studio can name (RUN_FAILURES) rather than its own bug."""
    return isinstance(e, RUN_FAILURES) or type(e).__module__.split(".")[0] in RUN_LIBRARIES


def bug_sentence(e: BaseException) -> str:
    """What a user reads of an unexpected exception: its type and the first line of its message."""
    first = str(e).splitlines()[0][:300] if str(e) else ""
    return f"a bug in the studio (logged): {type(e).__name__}: {first}"


def how_it_died(exitcode: int | None) -> str:
    """A process's end in a word or two: the signal's name (SIGKILL: the OOM killer's) or the exit code."""
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
