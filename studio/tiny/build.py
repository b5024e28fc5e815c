"""Build the tiny FLUX-architecture pipeline: tokenizers made from the grammar's words, small real modules, each a
stock diffusers/transformers class, so cache-dit, First-Block-Cache, torchao and torch.compile hook it as FLUX.1's."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

from studio.spec.profiles import EMBEDDED_DIR, PROFILE_FILE, ModelProfile
from studio.tiny.grammar import VOCAB

CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"


@dataclass(frozen=True)
class TinyConfig:
    size: int = 64
    text_len: int = 32
    vae_channels: tuple[int, ...] = (32, 64, 64)  # scale factor 2 ** (len - 1) = 4
    latent_channels: int = 4
    heads: int = 4
    head_dim: int = 32
    double_blocks: int = 2
    single_blocks: int = 4
    clip_dim: int = 64
    t5_dim: int = 128
    t5_layers: int = 2

    @property
    def vae_scale(self) -> int:
        return 2 ** (len(self.vae_channels) - 1)

    @property
    def image_tokens(self) -> int:
        return (self.size // self.vae_scale // 2) ** 2

    def as_dict(self) -> dict:
        return asdict(self)


def _bpe_whole_words(words) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocab and merges under which every word becomes ONE token; merges are appended word by word at the lowest
    rank, so a new one never changes how an earlier word merges."""
    vocab: dict[str, int] = {CLIP_BOS: 0, CLIP_EOS: 1}  # EOS id 1, not 2: CLIP treats eos_token_id == 2 as legacy
    for w in words:
        for c in list(w[:-1]) + [w[-1], w[-1] + "</w>"]:
            vocab.setdefault(c, len(vocab))
    merges: list[tuple[str, str]] = []
    rank: dict[tuple[str, str], int] = {}
    for w in words:
        parts = list(w[:-1]) + [w[-1] + "</w>"]
        while len(parts) > 1:
            pairs = [(rank.get((a, b)), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            known = [(r, i) for r, i in pairs if r is not None]
            if known:
                _, i = min(known)
            else:
                i = 0
                pair = (parts[0], parts[1])
                rank[pair] = len(merges)
                merges.append(pair)
                vocab.setdefault(pair[0] + pair[1], len(vocab))
            parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2 :]
    return vocab, merges


def build_clip_tokenizer(max_len: int) -> CLIPTokenizer:
    """A byte-pair tokenizer over the grammar's words, one token per word (the longest prompt: 18 with BOS/EOS)."""
    vocab, merges = _bpe_whole_words(sorted(VOCAB, key=lambda w: (len(w), w)))
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=max_len,
        bos_token=CLIP_BOS,
        eos_token=CLIP_EOS,
        pad_token=CLIP_EOS,
        unk_token=CLIP_EOS,
    )


def build_t5_tokenizer() -> T5Tokenizer:
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -8.0)]
    for w in VOCAB:
        if w == ",":
            pieces.append((",", -1.0))
        else:
            pieces.append(("\u2581" + w, -1.0))
            pieces.append((w, -4.0))  # "left,green" (no space) tokenizes to known pieces, not <unk>
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def build_pipeline(cfg: TinyConfig = TinyConfig(), seed: int = 0) -> FluxPipeline:
    """A FluxPipeline with freshly initialised tiny modules (fp32)."""
    torch.manual_seed(seed)
    tok = build_clip_tokenizer(cfg.text_len)
    tok2 = build_t5_tokenizer()
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tok.get_vocab()),
            hidden_size=cfg.clip_dim,
            intermediate_size=cfg.clip_dim * 2,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=cfg.text_len,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
            projection_dim=cfg.clip_dim,
        )
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=len(tok2.get_vocab()),
            d_model=cfg.t5_dim,
            d_kv=cfg.t5_dim // 4,
            d_ff=cfg.t5_dim * 2,
            num_layers=cfg.t5_layers,
            num_heads=4,
            relative_attention_num_buckets=16,
            relative_attention_max_distance=32,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
            feed_forward_proj="gated-gelu",
        )
    )
    n = len(cfg.vae_channels)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * n,
        up_block_types=["UpDecoderBlock2D"] * n,
        block_out_channels=list(cfg.vae_channels),
        layers_per_block=1,
        latent_channels=cfg.latent_channels,
        norm_num_groups=16,
        sample_size=cfg.size,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=1.0,
        shift_factor=0.0,
    )
    width = cfg.heads * cfg.head_dim
    third = (cfg.head_dim // 4) // 2 * 2
    axes = (cfg.head_dim - 2 * ((cfg.head_dim - third) // 2), (cfg.head_dim - third) // 2, (cfg.head_dim - third) // 2)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=cfg.latent_channels * 4,
        num_layers=cfg.double_blocks,
        num_single_layers=cfg.single_blocks,
        attention_head_dim=cfg.head_dim,
        num_attention_heads=cfg.heads,
        joint_attention_dim=cfg.t5_dim,
        pooled_projection_dim=cfg.clip_dim,
        guidance_embeds=False,
        axes_dims_rope=axes,
    )
    assert sum(axes) == cfg.head_dim and width == transformer.inner_dim
    tokens = cfg.image_tokens
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=tokens,
        max_image_seq_len=tokens * 4,
    )
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=tok,
        text_encoder_2=t5,
        tokenizer_2=tok2,
        transformer=transformer,
    )


# The profile the embedded model ships with (studio_profile.json beside its weights) ------------------------------
DEFAULT_DIR = EMBEDDED_DIR

EXAMPLE_PROMPTS = (
    "a red circle in the center, blue background",
    "an orange triangle on the left, black background",
    "a yellow square at the top, purple background",
    "a white circle on the left and a green square on the right, black background",
    "a blue triangle at the top and a red circle at the bottom, yellow background",
)


def tiny_profile(cfg: TinyConfig) -> ModelProfile:
    return ModelProfile(
        name="tiny-flux (embedded)",
        width=cfg.size,
        height=cfg.size,
        steps=28,
        guidance=None,
        max_sequence_length=cfg.text_len,
        size_multiple=cfg.vae_scale * 2,
        min_size=cfg.size // 2,
        max_size=cfg.size * 2,
        gpu_step_s=0.02,
        example_prompts=EXAMPLE_PROMPTS,
        notes="trained by the project on drawn scenes: 'a <colour> <shape> <where>[ and ...], <colour> background'",
    )


def write_profile(folder: Path, cfg: TinyConfig) -> None:
    (Path(folder) / PROFILE_FILE).write_text(json.dumps(tiny_profile(cfg).as_dict(), indent=1))
