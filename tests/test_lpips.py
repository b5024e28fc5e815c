"""LPIPS where its weights are present (studio.measure.lpips): offline it says how to add them and everything else
works; its wiring with a backbone and heads the test makes (randomly initialised AlexNet features saved under
torchvision's file name and keys, non-negative random heads under lpips' keys), put where the studio looks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from studio.measure.lpips import (
    BACKBONE,
    CHANNELS,
    HEADS,
    HEADS_MEMBER,
    HEADS_SHA256,
    HEADS_URL,
    NO_WEIGHTS,
    alexnet_features,
    distance,
    fetch_weights,
    find_weights,
    lpips_against,
)
from studio.spec.settings import torch_hub_checkpoints


def _weights(folder, head_scale: float = 1.0, seed: int = 0):
    """A backbone file as torchvision saves AlexNet ("features.N.weight", and a classifier the studio skips) and a
    heads file as lpips ships it ("linK.model.1.weight"), made here."""
    torch.manual_seed(seed)
    state = {f"features.{k}": v for k, v in alexnet_features().state_dict().items()}
    state["classifier.1.weight"] = torch.zeros(4, 9216)
    torch.save(state, folder / BACKBONE)
    heads = {f"lin{i}.model.1.weight": torch.rand(1, c, 1, 1) * head_scale for i, c in enumerate(CHANNELS)}
    torch.save(heads, folder / HEADS)
    return find_weights([folder])


def _noise(seed: int, side: int = 64):
    return np.random.default_rng(seed).integers(0, 256, (side, side, 3)).astype(np.uint8)


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """torch's hub cache pointed at an empty folder for the test (where the studio looks for the weights), through
    TORCH_HOME: torch.hub.set_dir would pin the folder for the process, TORCH_HOME unread from then on."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    return tmp_path / "hub" / "checkpoints"


@pytest.mark.quick
def test_without_weights_it_says_how_to_add_them(hub_dir):
    a = _noise(0)
    assert find_weights() is None
    assert lpips_against(a, a) == (None, NO_WEIGHTS)
    assert NO_WEIGHTS.startswith("LPIPS: no weights here (how to add them: put torchvision's AlexNet ")
    assert "alexnet-owt-7be5be79.pth" in NO_WEIGHTS and "v0.1 heads alex.pth" in NO_WEIGHTS


@pytest.mark.quick
def test_lpips_with_a_test_made_backbone(tmp_path):
    w = _weights(tmp_path)
    a, b = _noise(1), _noise(2)
    assert distance(a, a, w) == 0.0
    d = distance(a, b, w)
    assert d > 0 and distance(b, a, w) == pytest.approx(d, rel=1e-6)  # symmetric
    # the heads weigh each stage linearly: heads twice as large, twice the distance
    (tmp_path / "x2").mkdir()
    w2 = _weights(tmp_path / "x2", head_scale=2.0)
    assert distance(a, b, w2) == pytest.approx(2 * d, rel=1e-5)
    # a small change reads less than an unrelated picture
    near = np.clip(a.astype(int) + 3, 0, 255).astype(np.uint8)
    assert 0 < distance(near, a, w) < d
    with pytest.raises(ValueError, match=r"pictures \(16, 16, 3\) and \(16, 16, 3\): give two HxWx3 of one size, 32"):
        distance(a[:16, :16], a[:16, :16], w)


@pytest.mark.quick
def test_fetched_once_whole_and_checked(tmp_path, monkeypatch):
    """fetch_weights (what a Space runs once at start) from file:// URLs standing in for the download sites: both
    files land where find_weights looks, a file already there is not fetched again, a backbone whose hash is not the
    one its name carries is not kept, and an unreachable site raises urllib's error (app.fetch_lpips logs it)."""
    import hashlib
    import urllib.error
    import zipfile

    src = tmp_path / "site"
    src.mkdir()
    _weights(src)
    # the heads' site is a mirror of PyPI's layout: lpips' wheel, the heads at their path inside it
    wheel = src / HEADS_URL.rsplit("/", 1)[1]
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("lpips/__init__.py", "")
        z.write(src / HEADS, HEADS_MEMBER)
    heads_sha = (
        hashlib.sha256(wheel.read_bytes()).hexdigest(),
        hashlib.sha256((src / HEADS).read_bytes()).hexdigest(),
    )
    urls = {BACKBONE: (src / BACKBONE).as_uri(), HEADS: wheel.as_uri()}
    sha = hashlib.sha256((src / BACKBONE).read_bytes()).hexdigest()[:8]
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    dest = torch_hub_checkpoints()
    assert dest == tmp_path / "torch" / "hub" / "checkpoints" == Path(torch.hub.get_dir()) / "checkpoints"
    w = fetch_weights(dest, urls=urls, backbone_sha256=sha, heads_sha256=heads_sha)
    assert w == find_weights([dest]) and w.backbone.read_bytes() == (src / BACKBONE).read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == sorted([BACKBONE, HEADS])  # no .part, no wheel left
    assert w.heads.read_bytes() == (src / HEADS).read_bytes()  # the heads as the wheel carries them
    with pytest.raises(ValueError, match=r"lpips/weights/v0.1/alex.pth in file:.* has SHA-256 .*, not 000000000000"):
        fetch_weights(tmp_path / "wrong", urls=urls, backbone_sha256=sha, heads_sha256=(heads_sha[0], "0" * 64))
    assert sorted(p.name for p in (tmp_path / "wrong").iterdir()) == [BACKBONE]  # nothing of the heads kept
    # the real source: a content-addressed PyPI file of lpips 0.1.4, its wheel and heads both pinned by SHA-256
    assert HEADS_URL.startswith("https://files.pythonhosted.org/packages/") and HEADS_URL.endswith(
        "/lpips-0.1.4-py3-none-any.whl"
    )
    assert [len(h) for h in HEADS_SHA256] == [64, 64] and HEADS_URL in NO_WEIGHTS
    a, b = _noise(1), _noise(2)
    assert distance(a, b, w) == distance(a, b, find_weights([src]))  # the same network
    (src / BACKBONE).unlink()  # the site is gone: what is there already is not fetched again
    assert fetch_weights(dest, urls=urls, backbone_sha256=sha, heads_sha256=heads_sha) == w
    _weights(src)  # the site has it again; but a hash that is not the one asked for
    with pytest.raises(ValueError, match=r"not 00000000\.\.\. as alexnet-owt-7be5be79\.pth says; not kept"):
        fetch_weights(tmp_path / "other", urls=urls, backbone_sha256="00000000")
    assert not (tmp_path / "other" / BACKBONE).exists() and not (tmp_path / "other" / (BACKBONE + ".part")).exists()
    with pytest.raises(urllib.error.URLError):
        fetch_weights(tmp_path / "third", urls={BACKBONE: (tmp_path / "nowhere").as_uri()})
    # who fetches: a Space (downloads work there), or an operator who says so; never an offline machine by default
    from studio.spec.settings import Settings

    assert Settings.from_env({"SPACE_ID": "a/b"}).lpips_fetch and not Settings.from_env({}).lpips_fetch
    assert not Settings.from_env({"SPACE_ID": "a/b", "STUDIO_LPIPS_FETCH": "0"}).lpips_fetch
    assert Settings.from_env({"STUDIO_LPIPS_FETCH": "1"}).lpips_fetch


def test_lpips_on_the_embedded_model_where_the_weights_are(tiny_runner, hub_dir):
    """The run's record and card: the sentence without weights (every other figure there), a number with them."""
    from studio.report.card import metrics_card

    req = tiny_runner.request("a red circle in the center, blue background", seed=42, steps=12)
    m = tiny_runner.generate(req, "cache").metrics
    assert (
        m.quality.lpips is None
        and m.quality.lpips_note == NO_WEIGHTS
        and m.quality.psnr_db is not None
        and m.quality.flip is not None
    )
    assert "<td>LPIPS</td><td>not installed" in metrics_card(m)  # how to add them: docs/measuring.md
    hub_dir.mkdir(parents=True)
    w = _weights(hub_dir)
    res = tiny_runner.generate(req, "cache")
    m = res.metrics
    assert m.quality.lpips_note is None and m.quality.lpips == pytest.approx(
        distance(res.image, res.base_image, w), abs=1e-12
    )
    assert m.quality.lpips > 0 and "<td>LPIPS</td><td>" in metrics_card(m) and m.as_dict()["lpips"] == m.quality.lpips
