"""The pipelines for image inputs (img2img, inpaint), made from the loaded one with diffusers' `from_pipe`: the same
modules, no second copy of the weights.

A step cache belongs to the pipeline it runs in: cache-dit patches the pipeline CLASS's call to start a fresh cache
context for every call (and to record its summary). An img2img pipeline made from a cache-dit pipeline shares its
cached transformer but not that call: measured on the embedded model, it ran in the last text-to-image call's stale
context (its last block ran 5 of 14 steps, warm-up already spent) and reported that call's cached list as its own.
So the model manager moves the cache to the pipeline of the task that runs (studio.engine.loader).
"""

from __future__ import annotations

from studio.spec.checks import ConfigError

AUTO = {"img2img": "AutoPipelineForImage2Image", "inpaint": "AutoPipelineForInpainting"}
# Pipelines that edit: the input picture is a reference the transformer reads beside the picture it makes (FLUX.1
# Kontext: its latents as extra tokens; Qwen-Image-Edit: also through the vision-language encoder). Their own weights
# (FLUX.1-Kontext-dev, Qwen-Image-Edit) load as these classes, and a picture on the request goes to them as `image`.
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
    """The loaded model's pipeline for `task` (text2img: the loaded pipeline itself), made once and kept; its
    transformer is always the loaded pipeline's current one. `cur`: an engine.loader.Loaded."""
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
