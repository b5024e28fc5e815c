"""docs/benchmarks.md against its generator: `python docs/make_benchmarks.py --check` (no model runs, seconds)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "docs" / "make_benchmarks.py"
DOC = ROOT / "docs" / "benchmarks.md"

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def mb():
    spec = importlib.util.spec_from_file_location("make_benchmarks", GEN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_benchmarks"] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def _check_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GEN), "--check", *args], cwd=ROOT, capture_output=True, text=True)


def test_committed_doc_passes():
    p = _check_cli()
    assert p.returncode == 0, p.stderr


def test_a_removed_section_fails_with_its_name(tmp_path):
    doctored = re.sub(r"\n## The studio against plain diffusers.*?(?=\n## )", "", DOC.read_text(), flags=re.S)
    (tmp_path / "benchmarks.md").write_text(doctored)
    p = _check_cli("--doc", str(tmp_path / "benchmarks.md"))
    assert p.returncode == 1
    assert "lacks the section 'The studio against plain diffusers (`--vs-raw`)' (vs-raw)" in p.stderr


def test_a_preset_renamed_to_none_that_exists_fails(mb, tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(re.sub(r"\bcache-compile\b", "cache-compiled", DOC.read_text()))
    problems = mb.check(doc)
    assert any("runs preset 'cache-compiled', which is neither shipped" in p for p in problems), problems
    assert any("table names preset 'cache-compiled'" in p for p in problems), problems


def test_an_old_form_or_an_extra_section_fails(mb, tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOC.read_text().replace("int8_weight_only", "int8_dynamic") + "\n## Old numbers\n\ntext\n")
    problems = mb.check(doc)
    assert any("names the quant form 'int8_dynamic'" in p for p in problems), problems
    assert any("has a section 'Old numbers' that docs/make_benchmarks.py no longer makes" in p for p in problems)
    assert any("is not what the generator assembles" in p for p in problems)


def test_a_preset_no_longer_shipped_fails_the_committed_doc(mb, tmp_path, monkeypatch):
    from studio.spec.presets import BUILTIN_DIR, PresetLibrary

    shutil.copytree(BUILTIN_DIR, tmp_path / "presets")
    (tmp_path / "presets" / "cache-compile.yaml").unlink()
    monkeypatch.setattr(
        mb, "_library", lambda d=None: PresetLibrary(tmp_path / "presets").with_user_dir(mb.ROOT / d if d else None)
    )
    problems = mb.check(DOC)
    assert any("runs preset 'cache-compile', which is neither shipped" in p for p in problems), problems


def test_gpu_section_shows_only_a_current_gpu_check_record(mb, tmp_path, monkeypatch):
    monkeypatch.setattr(mb, "GPU_DIR", tmp_path)
    assert mb.render_gpu()[0] == f"## On a GPU — {mb.GPU_MISSING}"  # no record at all
    lib = mb._library()
    presets = " ".join(f"{n}={lib.get(n).tag()}" for n in lib.names())
    head = (
        f"# gpu-check record\ndate: 2030-01-02\ngpu: X\ncommit: abc\nepoch: {mb.EPOCH}\n"
        f"measuring: {mb.measuring_hash()}\npresets: {presets}\n\n"
    )
    table = "| family | preset | verdict |\n|---|---|---|\n| flux | {} | good |\n"
    (tmp_path / "gpu-check-2030-01-02.md").write_text(head + "### doctor\n\n" + table.format("cache"))
    lines = mb.render_gpu()
    assert lines[0] == "## On a GPU — measured 2030-01-02" and "| flux | cache | good |" in "\n".join(lines)
    (tmp_path / "gpu-check-2030-01-03.md").write_text(head.replace("epoch: ", "epoch: 0") + table.format("gone"))
    lines = "\n".join(mb.render_gpu())  # the newer record is stale and names a preset that is gone: not shown
    assert "measured 2030-01-02" in lines and "| gone |" not in lines


def test_a_record_of_another_command_is_stale(mb):
    rec = json.loads((mb.RUNS / "forms.json").read_text())
    rec["measuring"] = mb.measuring_hash()  # as if made with today's measuring code
    section = next(s for s in mb.SECTIONS if s.name == "forms")
    assert mb.stale_reasons(rec, section.command) == []
    rec["command"] = rec["command"].replace("--repeats 3", "--repeats 2")
    assert "its command was" in mb.stale_reasons(rec, section.command)[0]


def test_a_record_made_with_other_measuring_code_is_stale(mb):
    """A stored output names the hash of the code that measured it (studio/measure, studio/bench): made with other
    code, or before the hash was kept, it is stale and says why."""
    rec = json.loads((mb.RUNS / "forms.json").read_text())
    section = next(s for s in mb.SECTIONS if s.name == "forms")
    rec["measuring"] = mb.measuring_hash()
    assert mb.stale_reasons(rec, section.command) == []
    rec["measuring"] = "0" * 16
    assert mb.stale_reasons(rec, section.command) == [
        f"the measuring code (studio/measure, studio/bench) changed since it ran ({rec['commit']})"
    ]
    del rec["measuring"]
    assert "before the measuring code's hash was recorded" in mb.stale_reasons(rec, section.command)[0]


def test_the_auto_forms_section_runs_against_todays_engine():
    """`--auto-forms` (a section with no model run) calls the engine's resolver directly: a signature change there
    failed this section during a full re-run, after the suite had passed. Every 8-bit preset gets its row."""
    from studio.spec.presets import PresetLibrary

    p = subprocess.run([sys.executable, str(GEN), "--auto-forms"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lib = PresetLibrary()
    eight_bit = [n for n in lib.names() if lib.get(n).quant.enabled]
    assert eight_bit and all(f"| {n} | " in p.stdout for n in eight_bit), p.stdout
    assert "dtype `auto` here: " in p.stdout
