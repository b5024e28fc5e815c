"""Tiny random-weight instances of every DiT family the studio names, built offline from each pipeline's own classes
(flux: no CFG; qwen-image: true CFG, two calls a step; sd3: CFG batched; z-image: CFG-free), tokenizers made in memory.
Random weights' residual diffs sit at 0.3-0.5, hence CACHING_THRESHOLD; the builders import diffusers lazily."""

from __future__ import annotations

import json
from pathlib import Path

import torch

FAMILIES = ("flux", "qwen-image", "sd3", "z-image")
# Thresholds that make caches cache on random weights (measured on these instances at 64x64, 12 steps).
CACHING_THRESHOLD = {"cache-dit": 0.9, "fbcache": 0.9}
_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# What each family's profile says (64 px, 12 steps; the CFG mode each family really uses).
PROFILES = {
    "flux": dict(guidance=None, true_cfg_scale=None, steps=12, max_sequence_length=32),
    "qwen-image": dict(guidance=None, true_cfg_scale=4.0, steps=12, max_sequence_length=64),
    "sd3": dict(guidance=4.0, true_cfg_scale=None, steps=12, max_sequence_length=32),
    "z-image": dict(guidance=0.0, true_cfg_scale=None, steps=8, max_sequence_length=64),
    "flux-kontext": dict(guidance=2.5, true_cfg_scale=None, steps=12, max_sequence_length=32, edits=True),
}


def _byte_vocab() -> dict[str, int]:
    """GPT-2's byte-to-unicode table as a vocabulary: every byte is one token, so any text encodes."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): i for i, c in enumerate(cs)}
    for s in _QWEN_SPECIAL:
        vocab[s] = len(vocab)
    return vocab


def qwen_tokenizer():
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer(
        vocab=_byte_vocab(), merges=[], unk_token="<|endoftext|>", pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )
    tok.chat_template = _CHAT_TEMPLATE
    return tok


def _small_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(16, 32),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=8,
        shift_factor=0.0,
        scaling_factor=1.0,
    )


def _flux():
    from studio.tiny.build import TinyConfig, build_pipeline

    cfg = TinyConfig(heads=2, head_dim=32, double_blocks=2, single_blocks=2, vae_channels=(16, 32, 32))
    return build_pipeline(cfg, seed=0)


def _qwen_image():
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = qwen_tokenizer()
    n = len(tok.get_vocab())
    text = dict(
        vocab_size=n,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
    )
    vision = dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, fullatt_block_indexes=[0]
    )
    te = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=text, vision_config=vision, vocab_size=n, hidden_size=32)
    )
    tr = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=4,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[False],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    )
    return QwenImagePipeline(FlowMatchEulerDiscreteScheduler(), vae, te, tok, tr)


def _sd3():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from studio.tiny.build import build_clip_tokenizer, build_t5_tokenizer

    tok, tok3 = build_clip_tokenizer(77), build_t5_tokenizer()

    def clip():
        return CLIPTextModelWithProjection(
            CLIPTextConfig(
                vocab_size=len(tok.get_vocab()),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=77,
                projection_dim=32,
                eos_token_id=1,
                bos_token_id=0,
                pad_token_id=1,
            )
        )

    t5 = T5EncoderModel(
        T5Config(vocab_size=len(tok3.get_vocab()), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    )
    tr = SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        num_layers=4,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
        pos_embed_max_size=64,
    )
    return StableDiffusion3Pipeline(
        transformer=tr,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_small_vae(),
        text_encoder=clip(),
        tokenizer=tok,
        text_encoder_2=clip(),
        tokenizer_2=tok,
        text_encoder_3=t5,
        tokenizer_3=tok3,
    )


def _z_image():
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    tok = qwen_tokenizer()
    te = Qwen3Model(
        Qwen3Config(
            vocab_size=len(tok.get_vocab()),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
        )
    )
    tr = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=4,
        dim=64,
        n_layers=4,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=32,
        axes_dims=[8, 12, 12],
        axes_lens=[256, 64, 64],
    )
    return ZImagePipeline(FlowMatchEulerDiscreteScheduler(), _small_vae(), te, tok, tr)


def _flux_kontext():
    """FLUX.1 Kontext's pipeline on the tiny FLUX components (the input picture read as reference tokens)."""
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**_flux().components)


_BUILDERS = {"flux": _flux, "qwen-image": _qwen_image, "sd3": _sd3, "z-image": _z_image, "flux-kontext": _flux_kontext}
# Families whose pipeline edits: a request's picture is a reference, not a start (engine.tasks); checked on their own
# (tests/test_engine.py), not in every family's parametrized checks.
EDIT_FAMILIES = ("flux-kontext",)


def build_family(name: str, seed: int = 0):
    """The family's pipeline with fresh random weights (float32)."""
    if name not in _BUILDERS:
        raise ValueError(f"family {name!r} is not known: use one of {list(FAMILIES + EDIT_FAMILIES)}")
    torch.manual_seed(seed)
    return _BUILDERS[name]()


def save_family(name: str, folder: str | Path, seed: int = 0) -> Path:
    """Build the family and save it as a diffusers folder (bf16 weights) with its studio profile."""
    from studio.spec.profiles import PROFILE_FILE, ModelProfile

    folder = Path(folder)
    pipe = build_family(name, seed)
    pipe.to(torch.bfloat16)
    pipe.save_pretrained(folder, safe_serialization=True)
    prof = ModelProfile(
        name=f"tiny {name} (random weights)",
        width=64,
        height=64,
        size_multiple=16,
        min_size=32,
        max_size=128,
        example_prompts=("a red circle in the center, blue background",),
        **PROFILES[name],
    )
    (folder / PROFILE_FILE).write_text(json.dumps(prof.as_dict(), indent=1))
    return folder
