"""LPIPS against the base image, where its weights are present (Zhang et al. 2018, `lpips` 0.1.4's AlexNet v0.1):
0 is the same picture; a cache's blur or shifted edge reads about 0.1, a different picture 0.5 or more. The weights
are not shipped (fetch_weights; else NO_WEIGHTS). The network is rebuilt here from torch modules, as lpips computes it:
torchvision, which `lpips` imports, has no build for torch 2.13's CPU wheel. torch is imported inside the functions."""

from __future__ import annotations

import hashlib
import importlib.util
import urllib.request
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

BACKBONE = "alexnet-owt-7be5be79.pth"  # torchvision's file name for its ImageNet AlexNet (its hub cache keeps it so)
HEADS = "alex.pth"  # lpips' linear heads, v0.1 (lpips/weights/v0.1/alex.pth)
BACKBONE_SHA256_PREFIX = BACKBONE.split("-")[-1].split(".")[0]  # "7be5be79": torchvision names files by their hash
BACKBONE_URL = "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"
# lpips' heads come from lpips 0.1.4's wheel on PyPI (a content-addressed URL: a PyPI file never changes), read as a
# zip; the wheel and the heads inside it are both checked by SHA-256.
HEADS_URL = (
    "https://files.pythonhosted.org/packages/9b/13/1df50c7925d9d2746702719f40e864f51ed66f307b20ad32392f1ad2bb87/"
    "lpips-0.1.4-py3-none-any.whl"
)
HEADS_MEMBER = "lpips/weights/v0.1/alex.pth"
HEADS_SHA256 = (
    "fd537af5828b69d2e6ffc0a397bd506dbc28ca183543617690844c08e102ec5e",  # the wheel (PyPI's listed digest)
    "df73285e35b22355a2df87cdb6b70b343713b667eddbda73e1977e0c860835c0",  # lpips/weights/v0.1/alex.pth in it
)
STAGES = ((0, 2), (2, 5), (5, 8), (8, 10), (10, 12))  # lpips' slices of AlexNet's features: relu1 .. relu5
CHANNELS = (64, 192, 384, 256, 256)
SHIFT = (-0.030, -0.088, -0.188)  # lpips' ScalingLayer: inputs in [-1, 1], then (x - shift) / scale
SCALE = (0.458, 0.448, 0.450)
NO_WEIGHTS = (
    f"LPIPS: no weights here (how to add them: put torchvision's AlexNet {BACKBONE} ({BACKBONE_URL}) and lpips' "
    f"v0.1 heads {HEADS} (in lpips' wheel at {HEADS_MEMBER}: {HEADS_URL}) in torch's hub cache, "
    "<hub dir>/checkpoints, e.g. ~/.cache/torch/hub/checkpoints; or `pip install lpips` for the heads; on a Space "
    "the studio fetches both once at start, elsewhere STUDIO_LPIPS_FETCH=1 does)"
)


@dataclass(frozen=True)
class Weights:
    backbone: Path
    heads: Path


def _hub_checkpoints() -> Path:
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints"


def _package_heads() -> Path | None:
    """lpips' own heads file, where the package is installed (found without importing it: it imports torchvision)."""
    spec = importlib.util.find_spec("lpips")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "weights" / "v0.1" / HEADS
    return path if path.is_file() else None


def find_weights(folders=()) -> Weights | None:
    """The backbone and heads files, the first found of each in `folders`, torch's hub cache, then (heads) an installed
    lpips; None when either is missing."""
    places = [Path(f) for f in folders] + [_hub_checkpoints()]
    backbone = next((p / BACKBONE for p in places if (p / BACKBONE).is_file()), None)
    heads = next((p / HEADS for p in places if (p / HEADS).is_file()), None) or _package_heads()
    return Weights(backbone, heads) if backbone and heads else None


def fetch_weights(
    dest: str | Path,
    urls: dict | None = None,
    backbone_sha256: str = BACKBONE_SHA256_PREFIX,
    heads_sha256: tuple[str, str] = HEADS_SHA256,
) -> Weights:
    """Download both files into `dest` (find_weights looks in torch's hub cache), each only if absent; a file appears
    only whole and only if its SHA-256 checks (the backbone's prefix is in its name; the heads' wheel and file are
    HEADS_SHA256). `urls` and the hashes: a test's own mirror. Without network this raises urllib's own error."""
    urls = {BACKBONE: BACKBONE_URL, HEADS: HEADS_URL} | (urls or {})
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / BACKBONE).is_file():
        _download(urls[BACKBONE], folder / BACKBONE, backbone_sha256)
    if not (folder / HEADS).is_file():
        _heads_from_wheel(urls[HEADS], folder / HEADS, heads_sha256)
    return Weights(folder / BACKBONE, folder / HEADS)


def _heads_from_wheel(url: str, path: Path, sha256: tuple[str, str]) -> None:
    """lpips' heads read out of its wheel at `url` (HEADS_MEMBER), both checked (`sha256`: the wheel's, the heads')."""
    wheel = path.with_name("lpips-heads.whl")
    _download(url, wheel, sha256[0])
    try:
        with zipfile.ZipFile(wheel) as z:
            data = z.read(HEADS_MEMBER)
    finally:
        wheel.unlink()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256[1]:
        raise ValueError(f"LPIPS weights: {HEADS_MEMBER} in {url} has SHA-256 {got[:12]}..., not {sha256[1][:12]}...")
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    part.replace(path)


def _download(url: str, path: Path, sha256_prefix: str | None) -> None:
    part = path.with_name(path.name + ".part")
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as src, open(part, "wb") as out:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if sha256_prefix and not digest.hexdigest().startswith(sha256_prefix):
        part.unlink()
        raise ValueError(
            f"LPIPS weights: {url} gave a file whose SHA-256 is {digest.hexdigest()[:12]}..., not {sha256_prefix}... "
            f"as {path.name} says; not kept"
        )
    part.replace(path)


def alexnet_features():
    """torchvision's AlexNet `features` (conv/ReLU/max-pool, 13 layers), the same layers and state-dict keys."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(64, 192, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(192, 384, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(384, 256, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(256, 256, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
    )


@lru_cache(maxsize=2)
def _network(backbone: Path, heads: Path):
    """(features, heads as 1x1 weights per stage), loaded once per process and files."""
    import torch

    features = alexnet_features()
    state = torch.load(backbone, map_location="cpu", weights_only=True)
    own = {k.removeprefix("features."): v for k, v in state.items() if not k.startswith("classifier.")}
    features.load_state_dict(own)
    lins = torch.load(heads, map_location="cpu", weights_only=True)
    w = [lins[f"lin{i}.model.1.weight"].float() for i in range(len(STAGES))]
    for i, (t, c) in enumerate(zip(w, CHANNELS)):
        if tuple(t.shape) != (1, c, 1, 1):
            raise ValueError(
                f"lpips heads {heads}: lin{i} has shape {tuple(t.shape)}, AlexNet v0.1 wants (1, {c}, 1, 1)"
            )
    return features.eval().float(), w


def _tensor(img):
    import torch

    x = torch.from_numpy(np.ascontiguousarray(img)).float().permute(2, 0, 1)[None] / 255.0 * 2 - 1
    return (x - torch.tensor(SHIFT).view(1, 3, 1, 1)) / torch.tensor(SCALE).view(1, 3, 1, 1)


def distance(image: np.ndarray, base: np.ndarray, weights: Weights) -> float:
    """LPIPS (AlexNet, v0.1) of two HxWx3 uint8 pictures of one size (at least 32 px a side)."""
    import torch

    if image.shape != base.shape or image.ndim != 3 or min(image.shape[:2]) < 32:
        raise ValueError(f"lpips: pictures {image.shape} and {base.shape}: give two HxWx3 of one size, 32 px or more")
    features, lins = _network(weights.backbone, weights.heads)
    total = 0.0
    with torch.no_grad():
        a, b = _tensor(image), _tensor(base)
        for (lo, hi), w in zip(STAGES, lins):
            a, b = features[lo:hi](a), features[lo:hi](b)
            na = a / (a.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10)
            nb = b / (b.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10)
            total += float(torch.nn.functional.conv2d((na - nb) ** 2, w).mean())
    return total


def lpips_against(image: np.ndarray, base: np.ndarray, folders=()) -> tuple[float | None, str | None]:
    """(LPIPS of `image` against `base`, None) where the weights are found; (None, NO_WEIGHTS) where not."""
    weights = find_weights(folders)
    if weights is None:
        return None, NO_WEIGHTS
    return distance(image, base, weights), None
