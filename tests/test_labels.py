"""A run's label says what ran, from the engaged stack; what the preset asked for is beside it where they differ."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from studio.report.card import metrics_card
from studio.report.table import MatrixRow
from studio.spec import GenerationRequest

REQ = GenerationRequest(
    prompt="a red circle in the center, blue background", seed=3, steps=10, width=64, height=64, max_sequence_length=32
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the fallbacks checked here are a CPU's")


def test_attention_that_fell_back_is_labelled_as_what_ran_and_marked(runner):
    m = runner.generate(REQ, "sage", compare=False).metrics
    dt = {"bfloat16": "bf16", "float32": "fp32"}[m.labels.dtype]
    assert m.labels.tag == f"{dt}+sdpa" and m.labels.requested_tag == "auto+sage"
    assert m.labels.label_changes == ["sage->sdpa"] and any(
        x.startswith("sage: unavailable on cpu") for x in m.labels.fallbacks
    )
    card = metrics_card(m)
    assert f"<code>{dt}+sdpa</code>" in card and "asked: <code>auto+sage</code>" in card and "sage-&gt;sdpa" in card
    row = MatrixRow.from_metrics(m)
    assert row.cells()[0] == f"{dt}+sdpa (sage->sdpa)" and m.as_dict()["requested_tag"] == "auto+sage"


def test_float8_on_a_cpu_is_labelled_full_precision(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    runner.presets.add("fp8", "quantize_config: {quant_type: float8_per_row}\n")
    m = runner.generate(REQ, "fp8", compare=False).metrics
    assert "fp8" not in m.labels.tag and "int8" not in m.labels.tag and m.labels.label_changes == ["fp8dq->none"]
    assert m.labels.requested_tag == "auto+fp8dq+sdpa"


def test_a_stack_that_ran_as_asked_has_no_changes_and_a_skipped_cache_is_marked(runner):
    m = runner.generate(REQ, "cache", compare=False).metrics
    assert m.labels.label_changes == [] and m.labels.tag.endswith("+DBCache_F1B0W4R0.24MC3+sdpa")
    assert "asked" not in metrics_card(m)
    short = runner.generate(replace(REQ, steps=6), "cache", compare=False).metrics  # too few steps to gain: uncached
    assert "DBCache" not in short.labels.tag and short.labels.label_changes == ["DBCache_F1B0W4R0.24MC3->none"]


@pytest.mark.slow
def test_the_named_full_stack_on_a_cpu_has_no_sage_in_its_label(runner):
    m = runner.generate(REQ, "cache-int8-sage", compare=False).metrics
    form = "int8dq" if "amx_int8" in open("/proc/cpuinfo").read() else "int8wo"
    assert m.labels.tag.split("+")[1:] == [form, "DBCache_F1B0W4R0.24MC3", "sdpa", "compile"], m.labels.tag
    assert (
        m.labels.requested_tag == "auto+q8+offload-auto+DBCache_F1B0W4R0.24MC3+sage+compile"
        and m.labels.label_changes == ["sage->sdpa"]
    )
