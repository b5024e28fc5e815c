"""The errors a request can end with besides a bad value (checks.ConfigError), each one sentence a person can read.

They live at the bottom of the house so that the app's process can raise the ones the device worker sends back
(studio.worker.client) without loading the engine, and torch with it.
"""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says which and why, in words a person can act on."""


class RunError(RuntimeError):
    """A run failed inside the pipeline (or the process running it died); the message is one sentence."""
