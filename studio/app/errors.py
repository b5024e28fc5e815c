"""The app's one place where an error becomes what a visitor reads: a gr.Error with its sentence. Device errors
arrive already crossed (studio.worker.protocol.crossing); here a form value that does not convert is the visitor's
mistake too."""

from __future__ import annotations

from contextlib import contextmanager

import gradio as gr

from studio.app.limits import RateLimited, Refused
from studio.spec.checks import ConfigError
from studio.spec.errors import USER_ERRORS, ModelLoadError, OverTime, RunError

SHOWN = (*USER_ERRORS, ValueError, TypeError)

# What a visitor reads above the sentence (the error's title), by the error's kind, the most specific first. The
# title crosses to API clients (gradio_client's AppError.title): the OpenAI endpoint answers each with its status.
TITLES = (
    (RateLimited, "Too many requests"),
    (Refused, "Over this studio's limits"),
    (ConfigError, "That request can't run"),
    (ModelLoadError, "The model could not load"),
    (OverTime, "Over the time limit"),
    (RunError, "The run failed"),
    ((ValueError, TypeError), "That request can't run"),
)


def title_of(e: BaseException) -> str:
    return next((title for kind, title in TITLES if isinstance(e, kind)), "Error")


@contextmanager
def shown(prefix: str = ""):
    """An error of SHOWN inside re-raised as a gr.Error (`prefix` + its sentence); anything else is a bug and goes on
    up (gradio logs it and shows its generic error)."""
    try:
        yield
    except SHOWN as e:
        raise gr.Error(prefix + str(e), title=title_of(e)) from None
