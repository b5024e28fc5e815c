"""What the studio keeps on disk, bounded: the files it hands to gradio (pictures, downloads) by their total size.

Every picture an event returns leaves it as a file (app.pictures), and every download (a run's metrics.json, a
matrix's CSV, a preset's YAML) is a file too (app.handlers.Studio.write), all under the studio's folder. gradio
copies each into its own cache when the event's result is sent (processing_utils.save_file_to_cache) and serves the
copy from there, so the studio's file is needed only until then. `FileKeeper` deletes the oldest of them once their
total passes the cap (STUDIO_MAX_FILES_MB), never one younger than `grace_s` (an event whose result gradio is still
copying), at most once every `every_s` (a listing of the folder per event would cost more than the files). gradio's
cache itself is bounded by age (`delete_cache`, STUDIO_CACHE_AGE_S: app.serve); a visitor's saved presets by count
(app.limits: presets_per_visitor, presets_in_all).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MB = 2**20


@dataclass(frozen=True)
class Pruned:
    """What one pruning did: files removed and their bytes, and what is kept."""

    removed: int
    freed_bytes: int
    kept_bytes: int


def prune(roots: list[Path], cap_bytes: int, grace_s: float, now: float | None = None) -> Pruned:
    """Delete the oldest files under `roots` (by modification time) until their total is at most `cap_bytes`,
    keeping every file modified within `grace_s`; then the folders left empty. A file another thread removed
    meanwhile is skipped."""
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
    """Keeps the files under `roots` within `cap_mb` (module doc); `noted()` after each file written."""

    roots: list[Path]
    cap_mb: float
    grace_s: float = 120.0
    every_s: float = 5.0
    last: Pruned | None = None
    _at: float = field(default=float("-inf"))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def noted(self, now: float | None = None) -> Pruned | None:
        """Prune if the last pruning is older than `every_s` (None: not due, or another thread is at it)."""
        now = time.monotonic() if now is None else now
        if now - self._at < self.every_s or not self._lock.acquire(blocking=False):
            return None
        try:
            self._at = now
            self.last = prune(self.roots, int(self.cap_mb * MB), self.grace_s)
            return self.last
        finally:
            self._lock.release()
