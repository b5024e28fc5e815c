"""The twins a bench times beside a preset, so each ratio has the right reference: a compiled preset's EAGER twin
(compile's noise floor and saving per image) and a cached preset's NON-CACHE twin (its `of ideal`, so compile's or
INT8's gain does not leak into the cache's). A twin already among the presets is used; a missing one is added, under
a name no preset has."""

from __future__ import annotations

from dataclasses import replace

from studio.spec.preset import CacheSpec, CompileSpec, Preset

EAGER_SUFFIX = "-eager"
NOCACHE_SUFFIX = "-nocache"


def _free(name: str, taken) -> str:
    """`name`, or with a number after it where a preset of another stack already has it (a user's `x-eager`)."""
    names = {q.name for q in taken}
    out, k = name, 2
    while out in names:
        out, k = f"{name}{k}", k + 1
    return out


def eager_twin(p: Preset, taken=()) -> Preset:
    return replace(p, name=_free(p.name + EAGER_SUFFIX, taken), compile=replace(p.compile, enabled=False))


def eager_stack(p: Preset) -> tuple:
    """What runs when `p` runs eagerly: its stack with the compile settings, which do nothing then, left out."""
    return replace(p, compile=CompileSpec()).stack


def with_twins(presets: list[Preset]) -> tuple[list[Preset], dict[str, str]]:
    """The presets plus an eager twin for each compiled one that has none among them; {compiled: twin name}."""
    out, twins = list(presets), {}
    for p in presets:
        if not p.compile.enabled:
            continue
        twin = eager_twin(p, out)
        found = next((q for q in out if not q.compile.enabled and eager_stack(q) == eager_stack(twin)), None)
        if found is None:
            out.append(twin)
            found = twin
        twins[p.name] = found.name
    return out, twins


def cache_twins(presets: list[Preset]) -> tuple[list[Preset], dict[str, str]]:
    """The presets plus a non-cache twin for each cached one that has none among them; {cached: twin name}."""
    out, twins = list(presets), {}
    for p in presets:
        if not p.cache.enabled:
            continue
        twin = replace(p, name=_free(p.name + NOCACHE_SUFFIX, out), cache_config=CacheSpec())
        found = next((q for q in out if q.stack == twin.stack), None)
        if found is None:
            out.append(twin)
            found = twin
        twins[p.name] = found.name
    return out, twins
