"""The files the studio hands to gradio (pictures, downloads), kept within a total size (STUDIO_MAX_FILES_MB). gradio
copies each into its own cache when the result is sent, so a file is needed only until then: the oldest go first,
never one younger than `grace_s` (gradio may still be copying it), at most once every `every_s`."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MB = 2**20


@dataclass(frozen=True)
class Pruned:
    removed: int
    freed_bytes: int
    kept_bytes: int


def prune(roots: list[Path], cap_bytes: int, grace_s: float, now: float | None = None) -> Pruned:
    """Delete the oldest files under `roots` until their total is at most `cap_bytes`, keeping every file modified
    within `grace_s`, and the folders left empty."""
    now = time.time() if now is None else now
    files = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                p = os.path.join(dirpath, n)
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue
                files.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in files)
    removed = freed = 0
    for mtime, size, p in sorted(files):
        if total <= cap_bytes or now - mtime < grace_s:
            break  # the rest are newer
        try:
            os.remove(p)
        except FileNotFoundError:
            continue
        total, removed, freed = total - size, removed + 1, freed + size
        _drop_empty(Path(p).parent, roots)
    return Pruned(removed, freed, total)


def _drop_empty(folder: Path, roots: list[Path]) -> None:
    if folder in roots:
        return
    try:
        folder.rmdir()  # only when empty
    except OSError:
        pass  # not empty (another file in it), or gone: either way nothing to drop


@dataclass
class FileKeeper:
    """Keeps the files under `roots` within `cap_mb`; call `noted()` after each file written."""

    roots: list[Path]
    cap_mb: float
    grace_s: float = 120.0
    every_s: float = 5.0
    last: Pruned | None = None
    _at: float = field(default=float("-inf"))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def noted(self, now: float | None = None) -> Pruned | None:
        """Prune if the last pruning is older than `every_s` (None: not due, or another thread is pruning)."""
        now = time.monotonic() if now is None else now
        if now - self._at < self.every_s or not self._lock.acquire(blocking=False):
            return None
        try:
            self._at = now
            self.last = prune(self.roots, int(self.cap_mb * MB), self.grace_s)
            return self.last
        finally:
            self._lock.release()
