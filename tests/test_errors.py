"""The one error boundary, without a model: which errors a person reads as they are (spec.errors.USER_ERRORS), how
anything else is said and logged (worker.protocol.crossing), what crosses the pipe by name, and the app's one place
that turns them into a gr.Error (app.errors.shown)."""

from __future__ import annotations

import logging
import pickle

import gradio as gr
import pytest
import torch

from studio.app.errors import shown
from studio.app.limits import Refused
from studio.spec import ConfigError, ModelLoadError, RunError
from studio.spec.errors import USER_ERRORS, OverTime, StudioBug
from studio.worker.protocol import WorkerCrashed, crossing, error_from, error_message

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    "e", [ConfigError("steps 0"), Refused("over the limit"), ModelLoadError("no such folder"), OverTime("300 s")]
)
def test_a_user_error_crosses_as_itself_with_its_sentence(e, caplog):
    assert isinstance(e, USER_ERRORS) and crossing(e, "generate") is e
    back = error_from(*error_message(e))
    assert str(back) == str(e) and type(back).__name__ in {"ConfigError", "ModelLoadError", "OverTime"}
    assert type(back) is (ConfigError if isinstance(e, ConfigError) else type(e))  # a kind of ConfigError: by name
    assert not caplog.records  # nothing logged: it is the user's


@pytest.mark.parametrize("e", [TypeError("unsupported operand"), ValueError("shapes differ"), KeyError("base")])
def test_anything_else_is_a_bug_logged_with_its_traceback(e, caplog):
    try:
        raise e
    except Exception as raised:
        with caplog.at_level(logging.ERROR, logger="studio.worker"):
            said = crossing(raised, "bench")
    assert isinstance(said, StudioBug) and isinstance(said, RunError)
    assert str(said) == f"a bug in the studio (logged): {type(e).__name__}: {e}"
    (record,) = caplog.records
    assert record.getMessage() == "device call bench failed: a bug in the studio" and record.exc_info[1] is e
    back = error_from(*error_message(said))
    assert type(back) is StudioBug and str(back) == str(said)


def test_a_crash_error_keeps_how_and_what_across_a_pickle():
    e = pickle.loads(pickle.dumps(WorkerCrashed("the device worker crashed", "SIGSEGV", ("sage", "tiny"))))
    assert (str(e), e.how, e.running) == ("the device worker crashed", "SIGSEGV", ("sage", "tiny"))


def test_the_app_shows_user_errors_and_form_values_and_lets_a_bug_of_its_own_go_up():
    with pytest.raises(gr.Error, match="That request can't run: steps 0"):
        with shown("That request can't run: "):
            raise ConfigError("steps 0")
    with pytest.raises(gr.Error, match=r"a bug in the studio \(logged\): KeyError: 'base'"):
        with shown():
            raise StudioBug("a bug in the studio (logged): KeyError: 'base'")
    with pytest.raises(gr.Error, match="invalid literal for int"):
        with shown():
            int("six")  # a form value that does not convert, in the app's own process: the visitor's
    with pytest.raises(KeyError):  # not a user's error: gradio logs it
        with shown():
            {}["x"]


@pytest.mark.quick
def test_the_studios_invariants_are_bugs_never_run_failures_and_compile_does_not_take_a_bug_for_its_own():
    """Issue 56: an invariant the studio keeps (spec.errors.Invariant) reaches the one boundary as a bug, never as
    'the run failed' (every RuntimeError was a run failure); a bug under a compiled variant (a KeyError in the
    ahead-of-time code) is raised as it is, not taken for compile's failure that marks the variant failed."""
    from types import SimpleNamespace

    from studio.engine.compile import first_run_or_eager
    from studio.engine.state import stack_state
    from studio.spec.errors import Invariant, is_run_failure

    assert not is_run_failure(Invariant("transformer is already quantized")) and is_run_failure(RuntimeError("oom"))
    tr = torch.nn.Linear(2, 2)
    running = SimpleNamespace(key=("aot", "default", "sdpa"))
    stack_state(tr).compile.running = running
    calls = []

    def run():
        calls.append(1)
        raise KeyError("parametrizations.weight.original0")

    with pytest.raises(KeyError):
        first_run_or_eager(tr, SimpleNamespace(), run)
    assert calls == [1] and not stack_state(tr).compile.failed  # not re-run eagerly, nothing marked failed
    stack_state(tr).compile.running = None
