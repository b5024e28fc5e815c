"""Pictures handed to gradio as files, each written once, atomically, and named by its content.

gradio (6.31, processing_utils.save_pil_to_cache) caches a numpy or PIL picture an event returns by writing its
encoded bytes to `<cache>/<hash of the bytes>/image.png` with `Path.write_bytes`: in place, every time. Two events
that return the same picture (two visitors asking for the default prompt and seed; two servers sharing /tmp/gradio)
rewrite that file while the first one's download is streaming it: starlette has sent a Content-Length from a stat,
reads the file as it is being rewritten, and the download ends short ("peer closed connection without sending
complete message body (received 0 bytes, expected 14160)", seen once in CI). A file path goes another way
(processing_utils.save_file_to_cache): copied under a temporary name and renamed into place, and never rewritten
once there. So every picture leaves an event as a file (docs/library-behaviour.md G13).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from studio.app.keep import FileKeeper

DIGITS = 24  # hex digits of the content's sha256 in a picture's file name


@dataclass(frozen=True)
class PictureFiles:
    """Writes the pictures an event returns into `folder` and gives gradio their paths; `keeper` (app.keep) keeps the
    folder within its cap."""

    folder: Path
    keeper: FileKeeper | None = None

    def file(self, picture):
        """A uint8 array or a PIL image as the path of its PNG (the same picture: the same path, not written again);
        anything else (a path, None) as it is."""
        if isinstance(picture, np.ndarray):
            if picture.dtype != np.uint8:
                raise TypeError(f"picture: dtype {picture.dtype} (want uint8, as the pipelines' pictures are)")
            picture = Image.fromarray(picture)
        if not isinstance(picture, Image.Image):
            return picture
        buf = io.BytesIO()
        picture.save(buf, format="PNG")
        data = buf.getvalue()
        path = self.folder / f"{hashlib.sha256(data).hexdigest()[:DIGITS]}.png"
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, staging = tempfile.mkstemp(dir=self.folder, prefix=".picture-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(staging, path)  # readers see the whole file or none
            if self.keeper is not None:
                self.keeper.noted()
        return str(path)

    def value(self, component, value):
        """`value` as `component` shows it, its pictures as files (gr.Image, gr.Gallery, gr.ImageSlider)."""
        if value is None or not isinstance(component, (gr.Image, gr.Gallery, gr.ImageSlider)):
            return value
        if isinstance(component, gr.Image):
            return self.file(value)
        if isinstance(component, gr.ImageSlider):
            return tuple(self.file(p) for p in value)
        return [(self.file(p[0]), *p[1:]) if isinstance(p, (tuple, list)) else self.file(p) for p in value]

    def served(self, fn, outputs=None):
        """`fn` (an event's handler) with its result's pictures as files (`outputs`: the event's, for a result
        that is not a dict)."""

        @functools.wraps(fn)  # gradio reads the handler's signature through it
        def event(*args, **kwargs):
            return self.result(fn(*args, **kwargs), outputs)

        return event

    def result(self, result, outputs=None):
        """An event's result with its pictures as files: {component: value}, or values in the order of
        `outputs` (one value when there is one output)."""
        if isinstance(result, dict):
            return {c: self.value(c, v) for c, v in result.items()}
        if outputs is None:
            return result
        if len(outputs) == 1:
            return self.value(outputs[0], result)
        return type(result)(self.value(c, v) for c, v in zip(outputs, result, strict=True))
