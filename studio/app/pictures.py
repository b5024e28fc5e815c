"""Pictures handed to gradio as files, each written once, atomically, named by its content: gradio rewrites a
returned numpy/PIL picture's cache file in place on every event, cutting short a download of the same picture, while
a file path is copied and renamed into place (docs/library-behaviour.md G13)."""

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
    """Writes the pictures an event returns into `folder` and gives gradio their paths; `keeper` bounds the folder."""

    folder: Path
    keeper: FileKeeper | None = None

    def file(self, picture):
        """A uint8 array or PIL image as the path of its PNG (written once per content); anything else as it is."""
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
        """`value` with its pictures as files, for an image, gallery or slider `component`."""
        if value is None or not isinstance(component, (gr.Image, gr.Gallery, gr.ImageSlider)):
            return value
        if isinstance(component, gr.Image):
            return self.file(value)
        if isinstance(component, gr.ImageSlider):
            return tuple(self.file(p) for p in value)
        return [(self.file(p[0]), *p[1:]) if isinstance(p, (tuple, list)) else self.file(p) for p in value]

    def served(self, fn, outputs=None):
        """Event handler `fn` with its result's pictures as files (`outputs`: the event's, for a non-dict result)."""

        @functools.wraps(fn)  # gradio reads the handler's signature through it
        def event(*args, **kwargs):
            return self.result(fn(*args, **kwargs), outputs)

        return event

    def result(self, result, outputs=None):
        """An event's result ({component: value}, or values in the order of `outputs`) with its pictures as files."""
        if isinstance(result, dict):
            return {c: self.value(c, v) for c, v in result.items()}
        if outputs is None:
            return result
        if len(outputs) == 1:
            return self.value(outputs[0], result)
        return type(result)(self.value(c, v) for c, v in zip(outputs, result, strict=True))
