"""Fixtures: tiny real pipelines (diffusers FluxPipeline classes with small random or trained weights)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

from studio.engine import (
    ModelManager,  # noqa: E402
    Runner,  # noqa: E402
)
from studio.spec import PresetLibrary  # noqa: E402
from studio.tiny.build import TinyConfig, build_pipeline  # noqa: E402

# Small and fast: 2 double + 2 single blocks of width 64, 64x64 images.
RANDOM_CFG = TinyConfig(heads=2, head_dim=32, double_blocks=2, single_blocks=2, vae_channels=(16, 32, 32))


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    """A FluxPipeline folder with random weights, saved in bf16 and loaded back through from_pretrained."""
    d = tmp_path_factory.mktemp("random-flux")
    pipe = build_pipeline(RANDOM_CFG, seed=0)
    pipe.to(torch.bfloat16)
    pipe.save_pretrained(d, safe_serialization=True)
    from studio.tiny.build import write_profile

    write_profile(d, RANDOM_CFG)
    return str(d)


@pytest.fixture
def runner(random_model_dir):
    r = Runner(ModelManager("cpu"), PresetLibrary(), model=random_model_dir)
    yield r
    r.manager.unload()  # cache-dit patches the pipeline class: never leave a cached pipeline behind


@pytest.fixture
def tiny_runner():
    """The embedded, trained model."""
    r = Runner(ModelManager("cpu"), PresetLibrary(), model="tiny")
    yield r
    r.manager.unload()
