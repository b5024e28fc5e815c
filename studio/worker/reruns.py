"""The CLI's bench and doctor over the device worker, carrying on when a stack's native crash kills it (WorkerCrashed;
the client has already started a new worker). Over the in-process device a native crash ends the CLI."""

from __future__ import annotations

import tempfile
from pathlib import Path

from studio.spec.errors import RunError
from studio.spec.presets import BASE, PresetLibrary
from studio.worker.protocol import Device, WorkerCrashed


def bench(device: Device, requests: list, presets: list[str] | None, on_status=None, **kwargs):
    """The device's bench, run again without each stack that crashes the worker; its BenchReport with `crashed`
    {stack: how it died}. A crash in `base` ends it: every speed-up is measured against base."""
    crashed: dict[str, str] = {}
    while True:
        try:
            rep = device.bench(requests, presets, exclude=tuple(crashed), **kwargs)
        except WorkerCrashed as e:
            if e.running is None:
                raise RunError(f"the device worker died ({e.how}) while loading, before the bench's first run") from e
            name = e.running[0]
            if name == BASE or name in crashed:
                raise RunError(
                    f"{name} crashed the device worker ({e.how}); every speed-up is measured against base"
                ) from e
            crashed[name] = e.how
            if on_status:
                on_status(f"{name} crashed the device worker ({e.how}); the bench runs again without it")
            continue
        rep.crashed = crashed
        return rep


def doctor(device: Device, families: list[str], presets: list[str] | None = None, on_status=None) -> list:
    """studio.bench.doctor's rows per family; a preset that crashes the worker becomes a row saying how it died, and
    the family's rest run in the new worker."""
    from studio.bench.doctor import crashed_row  # (loads the engine: the CLI's process only, never the app's)

    presets = list(presets or PresetLibrary().one_process_names())
    rows = []
    with tempfile.TemporaryDirectory(prefix="studio-doctor-") as tmp:  # here: a crashed worker leaves no folder
        for family in families:
            folder, todo = str(Path(tmp) / family), list(presets)
            while todo:
                got, died = [], None
                try:
                    device.doctor_family(family, folder, todo, on_status=on_status, on_row=got.append)
                except WorkerCrashed as e:
                    died = e.how
                rows += got
                done = {r.preset for r in got}
                todo = [p for p in todo if p not in done]
                if died is None or not todo:
                    break
                rows.append(crashed_row(family, todo[0], died))  # the presets run in order: the first not done
                if on_status:
                    on_status(f"{family}: {todo[0]} crashed the device worker ({died}); the rest in a new one")
                todo = todo[1:]
    return rows
