"""The pipeline call: one request as the arguments this pipeline takes, run once, the image as uint8. Shared with
the bench's plain-diffusers recipe, so both call a pipeline the same way."""

from __future__ import annotations

import inspect

import numpy as np
import torch

from studio.spec.checks import ConfigError
from studio.spec.request import GenerationRequest


def call_params(pipe) -> dict:
    """The pipeline call's parameters (the pipeline's own class's, also when parallel workers proxy the call)."""
    cls = getattr(pipe, "_cache_dit_ray_pipeline_original_class", type(pipe))
    return inspect.signature(cls.__call__).parameters


def true_cfg(pipe, request: GenerationRequest) -> bool:
    """Whether this run uses true CFG: two transformer calls per step (conditional, then unconditional)."""
    takes = "true_cfg_scale" in call_params(pipe)
    return takes and request.true_cfg_scale is not None and request.true_cfg_scale > 1


def cfg_lines(request: GenerationRequest, pipe, calls_per_step: int) -> list[str]:
    """What the request's true CFG did, in words, where it asked for it."""
    scale = request.true_cfg_scale
    if scale is None:
        return []
    if "true_cfg_scale" not in call_params(pipe):
        unused = f"true CFG: {type(pipe).__name__} takes none; true_cfg_scale {scale:g} was not used"
        return [unused] if scale > 1 else []
    if not true_cfg(pipe, request):
        return []  # off (scale 1): one call per step, as without it
    neg = request.negative_prompt
    neg = f'negative prompt "{neg[:60]}"' if neg else "an empty negative prompt"
    return [f"true CFG {scale:g}, {neg}: {calls_per_step} transformer calls per step"]


def pipe_kwargs(pipe, request: GenerationRequest, probe=None) -> dict:
    """The pipeline call for `request`, with only the arguments this pipeline takes."""
    params = call_params(pipe)
    n = request.num_images_per_prompt
    kw = dict(
        prompt=request.prompt,
        height=request.height,
        width=request.width,
        num_inference_steps=request.steps,
        generator=torch.Generator("cpu").manual_seed(request.seed),
        output_type="np",
    )
    if n > 1:
        if "num_images_per_prompt" not in params:
            raise ConfigError(f"request.num_images_per_prompt={n}: {type(pipe).__name__} makes one picture a call")
        # one generator per picture: picture i of the batch starts from the noise of a one-picture run of seed + i
        kw["generator"] = [torch.Generator("cpu").manual_seed(request.seed + i) for i in range(n)]
        kw["num_images_per_prompt"] = n
    if probe is not None:
        kw["callback_on_step_end"] = probe
    if "max_area" in params:  # FLUX Kontext derives its size from max_area (1 MP by default), not height and width
        kw["max_area"] = request.width * request.height
    if request.task != "text2img":
        kw.update(_image_kwargs(pipe, request, params))
    if request.guidance is not None and "guidance_scale" in params:
        kw["guidance_scale"] = request.guidance
    if true_cfg(pipe, request):
        kw["true_cfg_scale"] = request.true_cfg_scale
        kw["negative_prompt"] = request.negative_prompt or " "
    else:
        if "true_cfg_scale" in params:
            kw["true_cfg_scale"] = 1.0  # said, not left to a pipeline default (Qwen-Image's is 4.0)
        if request.negative_prompt and "negative_prompt" in params:
            kw["negative_prompt"] = request.negative_prompt
    if request.max_sequence_length is not None and "max_sequence_length" in params:
        kw["max_sequence_length"] = request.max_sequence_length
    return kw


def _image_kwargs(pipe, request: GenerationRequest, params) -> dict:
    """The picture inputs: img2img/inpaint's start picture, strength and mask, or an edit pipeline's reference."""
    from PIL import Image

    picture = Image.fromarray(request.image)
    if "strength" in params:
        out = {"image": picture, "strength": request.strength}
        if request.mask_image is not None:
            out["mask_image"] = Image.fromarray(request.mask_image)
        return out
    if request.strength != 1.0:
        raise ConfigError(
            f"request.strength={request.strength:g}: {type(pipe).__name__} edits with the picture as a reference and "
            "runs its whole schedule; leave strength at 1"
        )
    if "_auto_resize" not in params:  # Qwen-Image-Edit sizes its reference itself (~1 MP: its VAE and its prompt)
        return {"image": picture}
    # FLUX Kontext: the reference at the request's pixel count in its own aspect (its tokens cost what the request's
    # size says), instead of Kontext's own resize to a ~1 MP training size
    w, h = picture.size
    k = (request.width * request.height / (w * h)) ** 0.5
    size = (max(16, round(w * k)), max(16, round(h * k)))
    return {
        "image": picture.resize(size, Image.Resampling.LANCZOS) if size != (w, h) else picture,
        "_auto_resize": False,
    }


def dropped_tokens(pipe, request: GenerationRequest) -> tuple[int, int] | None:
    """(tokens in the prompt, tokens the model reads) when the long-text encoder will cut the prompt, else None."""
    limit = request.max_sequence_length
    # the tokenizer of the long-text encoder: T5 for FLUX (tokenizer_2) and SD3 (tokenizer_3), else the only one
    tok = getattr(pipe, "tokenizer_3", None) or getattr(pipe, "tokenizer_2", None) or getattr(pipe, "tokenizer", None)
    if limit is None or tok is None:
        return None
    try:
        n = len(tok(request.prompt).input_ids)
    except Exception:  # a tokenizer that cannot count this way: say nothing rather than guess
        return None
    return (n, limit) if n > limit else None


def call_pipe(pipe, request: GenerationRequest, probe=None) -> np.ndarray:
    """Run the pipeline once; the image as HxWx3 uint8 (a batch stacked top to bottom: (n*H)xWx3). A call that does
    not finish leaves no hook state behind: diffusers resets it only at the end of `__call__`, so the next request
    would start from this one's (docs/library-behaviour.md)."""
    try:
        return strip(pipe(**pipe_kwargs(pipe, request, probe)).images)
    except BaseException:
        reset_hook_state(getattr(pipe, "transformer", None))
        raise


def reset_hook_state(module) -> None:
    """diffusers' cache hooks on `module` back to a fresh run's state, as diffusers does at a pipeline call's end."""
    reset = getattr(module, "_reset_stateful_cache", None)
    if reset is not None:
        reset()


def strip(images) -> np.ndarray:
    """A pipeline's output pictures as one uint8 array, top to bottom (measure.quality.split_batch undoes it)."""
    return np.concatenate([as_uint8(im) for im in images], axis=0)


def as_uint8(image) -> np.ndarray:
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0, 1) * 255).round().astype(np.uint8)
    return arr
