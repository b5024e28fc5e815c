"""The doctor with each family in a child process, so a native crash costs one row, not the table (issue 20).

A child (`python -m studio.bench.isolated FAMILY PRESETS DEVICE`) builds the family's tiny instance, runs the presets
in order and prints each row as one JSON line as soon as it has it. When the child dies by a signal, the rows it
printed stand, the preset it was running is a row that says how it died, and a new child runs the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from studio.bench.doctor import DoctorRow, check_family
from studio.spec.errors import how_it_died
from studio.spec.hosting import child_env
from studio.spec.presets import PresetLibrary

CRASH_ENV = "STUDIO_DOCTOR_CRASH_ON"  # TEST ONLY: "family:preset" makes the child kill itself with SIGSEGV there


def crashed_row(family: str, preset: str, how: str) -> DoctorRow:
    return DoctorRow(
        family, preset, "-", 0, 0, [], None, None, None, None, "crashed", [],
        [f"the run crashed its process ({how}); the family's other presets ran in a new one"], crashed=how,
    )  # fmt: skip


def _child(family: str, presets: list[str], device, on_status) -> tuple[list[DoctorRow], str | None]:
    """One child over `presets`: the rows it printed, and how it died (None: it finished)."""
    cmd = [sys.executable, "-m", "studio.bench.isolated", family, ",".join(presets), str(device or "")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env())
    rows = []
    for line in proc.stdout:
        if line.startswith("{"):
            rows.append(DoctorRow(**json.loads(line)))
        elif on_status and line.strip():
            on_status(line.strip())
    code = proc.wait()
    return rows, None if code == 0 else how_it_died(code)


def run_isolated(families, presets=None, device=None, on_status=None) -> list[DoctorRow]:
    """run_doctor's rows, each family in children of its own (module doc)."""
    presets = list(presets or PresetLibrary().one_process_names())
    rows = []
    for family in families:
        todo = list(presets)
        while todo:
            got, died = _child(family, todo, device, on_status)
            rows += got
            done = {r.preset for r in got}
            todo = [p for p in todo if p not in done]
            if died is None or not todo:
                break
            rows.append(crashed_row(family, todo[0], died))
            if on_status:
                on_status(f"{family}: {todo[0]} crashed its process ({died}); the rest in a new one")
            todo = todo[1:]
    return rows


def _main(family: str, presets: list[str], device: str | None) -> None:
    from studio.tiny.families import save_family

    crash_on = os.environ.get(CRASH_ENV, "")

    def row_out(row: DoctorRow) -> None:
        print(json.dumps(asdict(row)), flush=True)

    def status(msg: str) -> None:
        print(msg, flush=True)
        if crash_on and msg == f"{family}: {crash_on.split(':', 1)[-1]}" and crash_on.startswith(family + ":"):
            os.kill(os.getpid(), signal.SIGSEGV)

    with tempfile.TemporaryDirectory(prefix="studio-doctor-") as tmp:
        status(f"{family}: building a tiny random-weight instance")
        folder = save_family(family, Path(tmp) / family)
        check_family(family, folder, presets, device or None, on_status=status, on_row=row_out)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2].split(","), sys.argv[3] if len(sys.argv) > 3 else None)
