"""Fixtures: tiny real pipelines (diffusers FluxPipeline classes with small random or trained weights)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")
# the bench's record of this machine's pace (studio.measure.pace): the tests' own, not the user's ~/.cache
os.environ.setdefault("STUDIO_PACE_FILE", os.path.join(tempfile.mkdtemp(prefix="studio-pace-"), "p.json"))

import pytest  # noqa: E402
import torch  # noqa: E402

from studio.engine import (
    ModelManager,  # noqa: E402
    Runner,  # noqa: E402
)
from studio.spec import PresetLibrary  # noqa: E402
from studio.spec.hosting import edge_environ  # noqa: E402
from studio.spec.settings import Settings, current, install, using  # noqa: E402
from studio.tiny.build import TinyConfig, build_pipeline  # noqa: E402

# The tests' edge: the environment read once into the settings record (STUDIO_DTYPE=float32 pytest ... runs the fp32
# path on a CPU with native bf16), as app.py and cli.py do.
install(Settings.from_env(os.environ))
os.environ.update(edge_environ(os.environ))  # (for the processes the tests start)

# The README's test command runs the tests that read no timing on two pytest-xdist workers, then the `timing` ones
# alone. Each worker computes on one thread, so the two share the two cores rather than fight over them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

GPU_MARKS = ("gpu", "budget24")


def pytest_collection_modifyitems(config, items):
    """The GPU tests run where a `-m` expression names them (.ci/gpu-check); the README's command, on a CUDA CI
    machine too, skips them with the reason."""
    if any(m in (config.getoption("markexpr") or "") for m in GPU_MARKS):
        return
    skip = pytest.mark.skip(reason="a GPU test: .ci/gpu-check runs it (-m gpu), the README's command never does")
    for item in items:
        if any(m in item.keywords for m in GPU_MARKS):
            item.add_marker(skip)


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


def one_pair(r: Runner) -> Runner:
    """Base timed once beside each stack, no extra pairs: for tests that check pictures, counts and what ran. A test
    of how a speed-up is taken (pairs, spreads, agreement) sets its own pairing (tests/test_honest.py)."""
    r.pairing = replace(r.pairing, cheap_pairs=1, max_extra_pairs=0)
    return r


@pytest.fixture
def runner(random_model_dir):
    r = one_pair(Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model=random_model_dir))
    yield r
    r.manager.unload()  # cache-dit patches the pipeline class: never leave a cached pipeline behind


@pytest.fixture
def tiny_runner():
    """The embedded, trained model."""
    r = one_pair(Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model="tiny"))
    yield r
    r.manager.unload()


def _make_lora(tmp_path_factory, seed: int, rank: int, targets=("to_q", "to_k", "to_v")) -> str:
    """A LoRA of the embedded model's transformer, made here: peft adapters on its attention projections with small
    random weights, saved with diffusers' own save_lora_weights (what a user's trained LoRA file is)."""
    from diffusers import FluxPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from studio.spec.profiles import resolve_model

    tr = FluxPipeline.from_pretrained(resolve_model("tiny"), dtype=torch.float32).transformer
    cfg = LoraConfig(r=rank, lora_alpha=4, target_modules=list(targets), init_lora_weights=False)
    tr.add_adapter(cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in tr.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.4)
    out = tmp_path_factory.mktemp(f"lora{seed}-{len(targets)}")
    FluxPipeline.save_lora_weights(  # with its config, so alpha/r (the scale per unit) loads as trained
        out, transformer_lora_layers=get_peft_model_state_dict(tr), transformer_lora_adapter_metadata=cfg.to_dict()
    )
    return str(out / "pytorch_lora_weights.safetensors")


@pytest.fixture(scope="session")
def make_lora(tmp_path_factory):
    """make_lora(seed, rank, targets): another LoRA of the embedded model, saved as tiny_lora is."""
    return lambda seed, rank, targets=("to_q", "to_k", "to_v"): _make_lora(tmp_path_factory, seed, rank, targets)


@pytest.fixture(scope="session")
def tiny_lora(tmp_path_factory):
    """A rank-4 LoRA of the embedded model (alpha 4)."""
    return _make_lora(tmp_path_factory, seed=0, rank=4)


@pytest.fixture(scope="session")
def tiny_lora_b(tmp_path_factory):
    """Another LoRA of the same layers: other weights, rank 8 (alpha 4: half tiny_lora's scale per unit)."""
    return _make_lora(tmp_path_factory, seed=1, rank=8)


def _cpu_busy_share(seconds: float = 1.0) -> float | None:
    """The share of all cores busy over `seconds` while this process sleeps: what OTHER processes take (Linux)."""
    import time

    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait

    try:
        t0, i0 = read()
        time.sleep(seconds)
        t1, i1 = read()
    except OSError:
        return None
    return 1 - (i1 - i0) / max(1, t1 - t0)


QUIET_BELOW = 0.15  # other processes' share of the cores under which a timing test must show its number


@pytest.fixture
def quiet():
    """Whether the machine is quiet now (other processes take under QUIET_BELOW of the cores over a second). A test
    marked `timing` REQUIRES a speed-up on a quiet machine (a studio that always withheld its number must fail); on a
    busy one it accepts a withheld number with its reason."""
    share = _cpu_busy_share()
    return share is not None and share < QUIET_BELOW


@pytest.fixture
def settings():
    """settings(dtype="float32", ...): this process's settings changed for one test (spec.settings.using), undone
    after it."""
    import contextlib

    with contextlib.ExitStack() as stack:
        yield lambda **kw: stack.enter_context(using(**kw))


def plain_ui():
    """The app's record of components with each component a plain key ("gen.image", "mx.json", ...): handlers called
    in a test return {key: value}, no gradio server."""
    from dataclasses import fields

    from studio.app import forms

    tabs = dict(
        request=forms.RequestPanel,
        gen=forms.GenerateTab,
        ab=forms.CompareTab,
        mx=forms.MatrixTab,
        tn=forms.TuneTab,
        pv=forms.PresetsTab,
        hist=forms.HistoryTab,
        api=forms.ApiOnly,
    )
    return forms.UI(**{n: cls(**{f.name: f"{n}.{f.name}" for f in fields(cls)}) for n, cls in tabs.items()})
