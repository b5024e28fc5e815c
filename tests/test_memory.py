"""The memory columns: the denoise loop's peak (studio.measure.memory) and, under a block-streaming regime, the bytes
copied onto the device per full and per cached step, from the engine's record to the card, the JSON and the bench's
table."""

from __future__ import annotations

import json
import re

from studio.measure.memory import MemoryProbe
from studio.report.card import metrics_card
from studio.report.table import Matrix, MatrixRow
from studio.spec import GenerationRequest
from tests.switched import stack

CACHE = "cache_config: {residual_diff_threshold: 0.5}\n"  # random weights cache at 0.5 (test_engine)


def req(**kw):
    base = dict(prompt="a red circle in the center, blue background", seed=3, steps=10, width=64, height=64)
    return GenerationRequest(**{**base, **kw})


def test_the_peak_rss_probe_sees_what_the_loop_allocated_and_not_what_came_before():
    import torch

    from studio.measure.memory import _hwm_bytes

    before = torch.ones(256 * 2**20 // 4)  # 256 MiB touched and freed before the probes: the process's peak
    del before
    high = _hwm_bytes()
    with MemoryProbe(torch.device("cpu")) as quiet:
        pass
    with MemoryProbe(torch.device("cpu")) as busy:
        big = torch.ones(256 * 2**20 // 4)  # 256 MiB inside
        del big
    q, b = quiet.result, busy.result
    assert q.kind == b.kind == "cpu peak RSS" and q.note is None and b.note is None
    assert high - q.peak_bytes > 200 * 2**20  # reset at the start: what came before is not this run's peak
    assert b.peak_bytes - q.peak_bytes > 200 * 2**20  # what the loop allocated is


def test_every_run_reports_its_peak_memory_and_a_streaming_one_its_bytes_per_step(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    runner.presets.add("group", "dtype: float32\noffload_config: {policy: group_offload}\n" + CACHE)
    resident = runner.generate(req(), stack(runner, "cache", threshold=0.5)).metrics
    assert (
        resident.memory.peak_memory["kind"] == "cpu peak RSS"
        and resident.memory.peak_memory["peak_bytes"] > 50 * 2**20
    )
    assert resident.memory.h2d is None  # nothing streams when everything is resident
    card = metrics_card(resident)
    # (in MiB or GiB by the size: the peak RSS is the whole process's, other tests' models in it too)
    assert "<td>peak memory</td>" in card and re.search(r"\d [MG]iB \(cpu peak RSS\)", card), card
    group = runner.generate(req(), "group").metrics
    h2d = group.memory.h2d
    assert h2d["h2d_bytes_per_full_step"] > h2d["h2d_bytes_per_cached_step"] > 0  # a cached step skips blocks
    assert group.cache.cached_steps > 0 and group.cache.cached_step_indices == resident.cache.cached_step_indices
    assert "host-to-device per full step" in metrics_card(group)
    assert "nothing crossed a bus" in metrics_card(group)  # the CPU is both devices here, and the card says so
    d = json.loads(json.dumps(group.as_dict()))  # the API's record carries both as numbers
    assert d["peak_memory"]["peak_bytes"] > 0 and d["h2d"]["h2d_bytes_per_full_step"] == h2d["h2d_bytes_per_full_step"]
    # the bench's columns, shown where a row has them
    rows = [MatrixRow.from_metrics(resident), MatrixRow.from_metrics(group)]
    m = Matrix(req(), runner.model, rows, {}, 1)
    cols = m.columns()
    assert {"peak memory", "H2D/full step", "H2D/cached step"} <= set(cols)
    cells = dict(zip(cols, m.rows[1].cells(m.optional())))
    assert cells["H2D/full step"].endswith("MiB") and cells["peak memory"].endswith(("MiB", "GiB"))  # (the process)
    assert dict(zip(cols, m.rows[0].cells(m.optional())))["H2D/full step"] == "-"
