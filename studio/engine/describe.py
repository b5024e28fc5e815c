"""What a run ran, as its record says it: the engaged lines, the fallbacks, and the label (spec.label) with what was
asked beside it. Derived from the applied stack and the run, never from the preset alone."""

from __future__ import annotations

from studio.engine.call import cfg_lines
from studio.engine.hooks import fingerprint
from studio.engine.lora import lora_lines
from studio.engine.run import Measured, RunContext
from studio.engine.state import stack_state
from studio.engine.tasks import edits
from studio.measure.record import RunLabels
from studio.spec.label import changes, join_label
from studio.spec.preset import DTYPE_SHORT, Preset


def fallback_lines(run: Measured) -> list[str]:
    """What did not run as asked, and what could not be read about the run."""
    disagree = [f"step counts: {run.counts.check}"] if run.counts.disagree else []
    return run.stack.fallbacks() + list(run.lost) + disagree


def steps_lines(p: Preset, sc: RunContext) -> list[str]:
    """A preset that runs a share of the request's steps: how many ran, against base at all of them."""
    if not sc.asked_steps:
        return []
    return [
        f"steps: {sc.request.steps} of the request's {sc.asked_steps} (step_share {p.step_share:g}), against base at "
        f"all {sc.asked_steps}"
    ]


def tuned_lines(p: Preset, pipe) -> list[str]:
    """For a preset a search tuned on one transformer: whether this is that transformer (its quality floor known)."""
    if not p.tuned_for:
        return []
    here = fingerprint(pipe.transformer)
    if here == p.tuned_for:
        return [f"settings: searched on this transformer ({here})"]
    return [
        f"settings: searched on {p.tuned_for}, not on this transformer ({here}): their quality floor is not known here"
    ]


def engaged_lines(ctx: RunContext, run: Measured, pipe) -> list[str]:
    """What ran, in words: the stack's lines, the dtype's note, a cut prompt, a cache that cached nothing."""
    lines = run.stack.lines() + ([f"dtype: {ctx.dtype.note}"] if ctx.dtype.note else [])
    if run.dropped:
        lines.append(f"prompt: {run.dropped[0]} tokens, the model reads {run.dropped[1]}; the rest was dropped")
    lines += cfg_lines(ctx.request, pipe, run.calls_per_step) + lora_lines(ctx.request, stack_state(pipe.transformer))
    r = ctx.request
    if r.task != "text2img" and edits(pipe):
        lines.append(
            f"edit: {type(pipe).__name__} read the input picture as a reference "
            f"({r.image.shape[1]}x{r.image.shape[0]}); all {r.steps} steps ran"
        )
    elif r.task != "text2img":
        lines.append(f"{r.task}: strength {r.strength:g}: the last {r.executed_steps} of {r.steps} steps ran")
    if run.stack.is_engaged("cache") and run.counts.cached == 0 and run.report.threshold is not None:
        lines.append(
            f"cache: engaged, but no step came under R{run.report.threshold:g} on this run "
            "(python -m studio sweep finds the threshold where this model starts caching)"
        )
    return lines


def labels(ctx: RunContext, p: Preset, run: Measured, pipe) -> RunLabels:
    """The run's label from its engaged stack, beside what the preset asked for, and its engaged and fallback lines."""
    n = len(ctx.request.loras)
    lora = f"lora{n}" if n else ""
    sc = ctx.for_preset(p)
    steps = f"steps{sc.request.steps}of{sc.asked_steps}" if sc.asked_steps else ""  # what ran: k of the asked n
    ran = {"dtype": DTYPE_SHORT[ctx.dtype.name], **run.stack.label_parts(), "lora": lora, "steps": steps}
    asked = {**p.label_parts(), "lora": lora, "steps": steps}
    return RunLabels(
        tag=join_label(ran),
        dtype=ctx.dtype.name,
        requested_tag=join_label(asked),
        label_changes=changes(asked, ran, run.stack.fell_back_parts()),
        engaged=engaged_lines(ctx, run, pipe) + steps_lines(p, sc) + tuned_lines(p, pipe),
        fallbacks=fallback_lines(run),
    )
