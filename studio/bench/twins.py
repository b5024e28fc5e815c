"""The twins a bench times beside a preset, so each of its ratios has the right reference.

- the EAGER twin of a compiled preset (the same stack without torch.compile): their PSNR is compile's noise floor,
  and the twin's time gives compile's saving per image;
- the NON-CACHE twin of a cached preset (the same stack without its step cache: `cache-compile` -> `compile`,
  `cache` -> `base`): its `of ideal` is measured against it, so compile's or INT8's gain does not leak into what
  the cache's own machinery costs.

A twin already among the presets is used as it is; a missing one is added under the preset's name with a suffix.
"""

from __future__ import annotations

from dataclasses import replace

from studio.spec.preset import CacheSpec, CompileSpec, Preset

EAGER_SUFFIX = "-eager"
NOCACHE_SUFFIX = "-nocache"


def eager_twin(p: Preset) -> Preset:
    """The same stack without torch.compile."""
    return replace(p, name=p.name + EAGER_SUFFIX, compile=replace(p.compile, enabled=False))


def _eager_stack(p: Preset) -> tuple:
    """What runs when `p` runs eagerly: its stack with the compile settings, which do nothing then, left out."""
    return replace(p, compile=CompileSpec()).stack


def with_twins(presets: list[Preset]) -> tuple[list[Preset], dict[str, str]]:
    """The presets plus an eager twin for each compiled one that has none among them; {compiled: twin name}."""
    out, twins = list(presets), {}
    for p in presets:
        if not p.compile.enabled:
            continue
        twin = eager_twin(p)
        found = next((q for q in out if not q.compile.enabled and _eager_stack(q) == _eager_stack(twin)), None)
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
        twin = replace(p, name=p.name + NOCACHE_SUFFIX, cache_config=CacheSpec())
        found = next((q for q in out if q.stack == twin.stack), None)
        if found is None:
            out.append(twin)
            found = twin
        twins[p.name] = found.name
    return out, twins
