"""The pipelines for image inputs (img2img, inpaint), made from the loaded one with diffusers' `from_pipe` (the same
modules). cache-dit patches a pipeline CLASS's call to open each call's cache context, which a pipeline made from it
does not share (it ran in a stale context), so the model manager moves the cache to the task's pipeline."""

from __future__ import annotations

from studio.spec.checks import ConfigError

AUTO = {"img2img": "AutoPipelineForImage2Image", "inpaint": "AutoPipelineForInpainting"}
# Pipelines that edit: the input picture is a reference the transformer reads beside the picture it makes; a picture
# on the request goes to them as `image`.
EDIT_PIPELINES = ("FluxKontextPipeline", "QwenImageEditPipeline", "QwenImageEditPlusPipeline")
NEEDS_PICTURE = ("QwenImageEditPipeline", "QwenImageEditPlusPipeline")  # Kontext draws from text alone too


def edits(pipe) -> bool:
    """Whether `pipe` reads a request's picture as a reference to edit (its whole schedule runs)."""
    return type(pipe).__name__ in EDIT_PIPELINES


def _edit_task(cur, task: str):
    """An edit model's own pipeline takes the picture; what it does not read is refused rather than ignored."""
    name = type(cur.pipe).__name__
    if task == "inpaint":
        raise ConfigError(f"request.mask_image: {name} edits with the picture as a reference and takes no mask")
    return cur.pipe


def task_pipe(cur, task: str):
    """The loaded model's pipeline for `task`, made once and kept, always with the current transformer."""
    if task == "text2img":
        if type(cur.pipe).__name__ in NEEDS_PICTURE:
            raise ConfigError(f"request.image: {type(cur.pipe).__name__} edits a picture: give one (Image input)")
        return cur.pipe
    if edits(cur.pipe):
        return _edit_task(cur, task)
    pipe = cur.pipes.get(task)
    if pipe is None:
        import diffusers

        try:
            pipe = getattr(diffusers, AUTO[task]).from_pipe(cur.pipe)
        except (ValueError, KeyError, AttributeError) as e:  # diffusers maps no such pipeline for this family
            raise ConfigError(
                f"request.image: {type(cur.pipe).__name__} has no {task} pipeline in diffusers ({e}); this model "
                "takes text-to-image requests only"
            ) from None
        pipe.set_progress_bar_config(disable=True)
        cur.pipes[task] = pipe
    if pipe.transformer is not cur.pipe.transformer:  # other weights (dtype, quantization) went in since
        pipe.register_modules(transformer=cur.pipe.transformer)
    return pipe
