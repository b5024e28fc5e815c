"""Pictures leave an event as files written once (studio/app/pictures.py): gradio rewrites a numpy picture's cache
file in place on every event that returns it, and a download of that picture running meanwhile ends short."""

from __future__ import annotations

import os
import threading

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from studio.app.pictures import PictureFiles

pytestmark = pytest.mark.quick


def _picture(seed=0, size=(48, 64)):
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def test_the_same_picture_is_one_file_written_once(tmp_path):
    files = PictureFiles(tmp_path / "pictures")
    first = files.file(_picture())
    stat = os.stat(first)
    again = files.file(_picture())  # the same pixels from another event
    assert again == first
    after = os.stat(again)
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)  # not written again
    assert np.array_equal(np.asarray(Image.open(first)), _picture())  # lossless: the pixels that were measured
    assert files.file(_picture(seed=1)) != first  # another picture, another file
    assert files.file(Image.fromarray(_picture())) == first  # a PIL image of the same pixels: the same file
    assert sorted(p.name for p in (tmp_path / "pictures").iterdir()) == sorted(
        os.path.basename(p) for p in {first, files.file(_picture(seed=1))}
    )  # no staging file left behind


def test_a_reader_never_sees_a_short_file_while_the_picture_is_returned_again(tmp_path):
    """What broke a download in CI: the size read by stat, then fewer bytes read from the file."""
    files = PictureFiles(tmp_path / "pictures")
    path = files.file(_picture(size=(256, 256)))
    short, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            size = os.stat(path).st_size
            with open(path, "rb") as f:
                got = len(f.read())
            if got != size:
                short.append((size, got))

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(30):
        assert files.file(_picture(size=(256, 256))) == path
    stop.set()
    reader.join()
    assert short == []


def test_only_picture_components_get_files(tmp_path):
    files = PictureFiles(tmp_path)
    a, b = _picture(0), _picture(1)
    image, gallery, slider, state = gr.Image(), gr.Gallery(), gr.ImageSlider(), gr.State()
    out = files.result({image: a, gallery: [(a, "seed 1"), b], slider: (a, b), state: {"kept": a}})
    assert out[image] == files.file(a)
    assert out[gallery] == [(files.file(a), "seed 1"), files.file(b)]  # captions kept, in order
    assert out[slider] == (files.file(a), files.file(b))
    assert out[state]["kept"] is a  # a state keeps its arrays
    assert files.result({image: None})[image] is None
    # by position, for a handler that returns a tuple (the error map and its caption)
    note = gr.Markdown()
    assert files.result((a, "caption"), [image, note]) == (files.file(a), "caption")
    assert files.result(a, [image]) == files.file(a)
    with pytest.raises(TypeError, match="dtype float32 .*want uint8"):
        files.file(a.astype(np.float32))
