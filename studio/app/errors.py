"""The app's one place where an error becomes what a visitor reads: a gr.Error with its sentence.

What the device raises has crossed its boundary already (studio.worker.protocol.crossing): a user error
(spec.errors.USER_ERRORS) with its own sentence, or a StudioBug saying "a bug in the studio (logged): ...". In this
process a form value that does not convert (int("abc"), float(None)) is the visitor's mistake too.
"""

from __future__ import annotations

from contextlib import contextmanager

import gradio as gr

from studio.spec.errors import USER_ERRORS

SHOWN = (*USER_ERRORS, ValueError, TypeError)


@contextmanager
def shown(prefix: str = ""):
    """An error of SHOWN inside, raised as a gr.Error with its sentence after `prefix`; anything else goes on up (a
    bug in the app's own process: gradio logs it and shows its generic error)."""
    try:
        yield
    except SHOWN as e:
        raise gr.Error(prefix + str(e)) from None
