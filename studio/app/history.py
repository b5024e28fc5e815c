"""A visitor's history (a gr.State per session): a table row and a thumbnail for every run, both bounded. Thumbnails
are small JPEGs, not full pictures (memory across a public studio's sessions). The rows are kept in the browser too
(gr.BrowserState, so a reload finds them; `restored` checks them: the browser's owner can edit them); thumbnails
would fill its storage quota and last the visit. A studio restart starts a new key, and the history afresh."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from studio.report.images import from_jpeg, thumbnail_jpeg
from studio.report.table import COLUMNS, MatrixRow
from studio.spec.settings import current

HISTORY_COLUMNS = ["#", "prompt", "seed", "steps", "size"] + list(COLUMNS)


def history_max() -> int:
    """Rows kept per session (STUDIO_HISTORY_ROWS)."""
    return current().history_rows


THUMBS_MAX = 48  # thumbnails kept per session (the newest)


@dataclass
class History:
    rows: list = field(default_factory=list)
    thumbs: list = field(default_factory=list)  # [(thumbnail JPEG bytes, caption)], newest first (the gallery's order)

    def gallery(self) -> list:
        """(picture, caption), newest first."""
        return [(from_jpeg(data), cap) for data, cap in self.thumbs]


def history_rows(hist: list, req, results) -> list:
    for res in results:
        number = hist[-1][0] + 1 if hist else 1
        row = [number, req.prompt[:200], req.seed, req.steps, f"{req.width}x{req.height}"]
        hist = hist + [row + MatrixRow.from_metrics(res.metrics).cells()]
    return hist[-history_max() :]


def record(hist: History | None, req, results) -> History:
    """`hist` with a row and a thumbnail for each of `results` (RunResults of `req`)."""
    hist = hist if isinstance(hist, History) else History()
    rows = history_rows(hist.rows, req, results)
    new = [(thumbnail_jpeg(res.image), caption(row)) for res, row in zip(results, rows[-len(results) :], strict=True)]
    return History(rows, (new[::-1] + hist.thumbs)[:THUMBS_MAX])


def _cell(c) -> bool:
    return (
        c is None or (isinstance(c, str) and len(c) <= 400) or (isinstance(c, int | float) and not isinstance(c, bool))
    )


def restored(saved) -> History:
    """The History a browser kept (rows only): numbered rows of the table's shape and plain cells, at most
    history_max(); anything else in `saved` is left out."""
    rows = saved if isinstance(saved, list) else []
    ok = [
        list(r)
        for r in rows
        if isinstance(r, list) and len(r) == len(HISTORY_COLUMNS) and isinstance(r[0], int) and all(map(_cell, r))
    ]
    return History(ok[-history_max() :], [])


def caption(row: list) -> str:
    """A thumbnail's caption: row number, preset, speed-up and PSNR."""
    cells = dict(zip(HISTORY_COLUMNS, row, strict=True))
    return f"#{cells['#']} {cells['preset']} · {cells['vs base']} · {cells['PSNR']}"


def history_csv(hist: History | None) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(HISTORY_COLUMNS)
    w.writerows(hist.rows if isinstance(hist, History) else [])
    return buf.getvalue()
