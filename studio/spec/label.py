"""The one function that makes a stack's label, e.g. `bf16+int8dq+DBCache_F1B0W4R0.24MC3+sdpa+compile`; what was
asked and what ran go through it, so `changes` can name the parts that did not run as asked (`sage->sdpa`)."""

from __future__ import annotations

LABEL_ORDER = ("dtype", "quantize", "offload", "cache", "attention", "compile", "parallel", "lora", "steps")
# What a part is called when nothing of it runs (in `changes`): an eager run, a resident one, full precision...
NOTHING = {"compile": "eager", "offload": "resident", "quantize": "none", "cache": "none", "parallel": "one process"}


def join_label(parts: dict[str, str]) -> str:
    """`parts` (part -> token, "" or absent: nothing of that part) as one label, in LABEL_ORDER."""
    return "+".join(parts[k] for k in LABEL_ORDER if parts.get(k))


def changes(asked: dict[str, str], ran: dict[str, str], fell_back: set[str]) -> list[str]:
    """The parts in `fell_back` (steps that did not engage as asked), each as `asked->ran`, in LABEL_ORDER."""
    out = []
    for k in LABEL_ORDER:
        if k in fell_back and asked.get(k):
            out.append(f"{asked[k]}->{ran.get(k) or NOTHING.get(k, 'none')}")
    return out
