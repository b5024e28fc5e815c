"""The tuner's search narrowed for a test on the embedded model: one calibrator, run-length cap and warm-up, no step
masks, base as the only non-cache option, no other method, one DBCache finalist, one timed repeat. What a test
varies is its keywords."""

from dataclasses import replace

from studio.bench.tune import SearchSpace

NARROW = SearchSpace(
    calibrators=("none",),
    run_caps=(3,),
    warmups=(4,),
    masks=(),
    non_cache=("base",),
    finalists=1,
    repeats=1,
    methods=(),
)


def narrow(**kw) -> SearchSpace:
    return replace(NARROW, **kw)
