"""The request panel above the tabs: the fields every device endpoint's request is made of."""

from __future__ import annotations

import gradio as gr

from studio.app.forms import RequestPanel
from studio.app.values import notes_md
from studio.report import fmt
from studio.spec.profiles import shipped_loras
from studio.spec.request import MAX_BATCH


def request_panel(studio) -> RequestPanel:
    prof = studio.device.profile(studio.models[0])
    with gr.Row():
        with gr.Column(scale=3):
            # One line that grows: Enter generates (a box that starts at 2 lines takes Enter as a new line).
            prompt = gr.Textbox(label="Prompt", value=prof.first_prompt, lines=1, max_lines=4)
            examples = gr.Dropdown(label="Example prompts", choices=list(prof.example_prompts), value=None)
        with gr.Column(scale=2):
            model = gr.Dropdown(label="Model", choices=studio.models, value=studio.models[0], allow_custom_value=True)
            model_notes = gr.Markdown(notes_md(prof.notes))
            with gr.Row():
                seed = gr.Number(label="Seed", value=42, precision=0, minimum=0)
                dice = gr.Button("Random seed", size="sm")
    with gr.Row():
        steps = gr.Slider(label="Steps", minimum=1, maximum=100, step=1, value=prof.steps)
        width = gr.Number(label="Width", value=prof.width, precision=0, minimum=16)
        height = gr.Number(label="Height", value=prof.height, precision=0, minimum=16)
        # A value of None would make `guidance` a required API parameter: a model without guidance gets 0 (ignored).
        guidance = gr.Number(
            label="Guidance",
            value=prof.guidance if prof.guidance is not None else 0.0,
            visible=prof.guidance is not None,
        )
        aspect = gr.Dropdown(
            label="Aspect ratio (sizes the model takes)", choices=[a[0] for a in prof.aspect_sizes()], value=None
        )
        num_images = gr.Slider(label="Pictures (one batched call)", minimum=1, maximum=MAX_BATCH, step=1, value=1)
    with gr.Accordion("Negative prompt and true CFG", open=prof.true_cfg_scale is not None):
        with gr.Row():
            negative_prompt = gr.Textbox(label="Negative prompt (read with true CFG)", value="", lines=1, scale=3)
            true_cfg_scale = gr.Number(
                label="True CFG scale", value=prof.true_cfg_scale or 1.0, minimum=0, scale=1, info=fmt.TRUE_CFG_INFO
            )
    with gr.Accordion("Image input: img2img, inpaint, edit", open=False):
        with gr.Row():
            image = gr.Image(
                label="Input picture (img2img; an edit model's reference)",
                type="numpy",
                image_mode="RGB",
                elem_id="input-image",
            )
            mask_image = gr.Image(label="Mask (inpaint; white: repaint)", type="numpy", image_mode="L")
            with gr.Column():
                strength = gr.Slider(
                    label="Strength", minimum=0.05, maximum=1.0, step=0.05, value=0.6, info=fmt.STRENGTH_INFO
                )
                use_last = gr.Button("Use the last picture as input", size="sm")
    with gr.Accordion("LoRA adapters", open=False):
        shipped = list(shipped_loras(studio.models[0]))
        with gr.Row():
            loras = gr.Textbox(
                label="LoRA adapters (one per line: a shipped name, a .safetensors file, a folder or a Hub id, then "
                "@scale)",
                value="",
                lines=2,
                scale=3,
                elem_id="loras",
                placeholder=f"{shipped[0]}@0.8" if shipped else "/path/to/my_lora.safetensors@0.8",
            )
            lora_pick = gr.Dropdown(
                label="Shipped with this model (adds it at scale 1)",
                choices=shipped,
                value=None,
                scale=1,
                elem_id="lora-pick",
            )
    return RequestPanel(
        prompt=prompt,
        examples=examples,
        model=model,
        model_notes=model_notes,
        seed=seed,
        dice=dice,
        steps=steps,
        width=width,
        height=height,
        guidance=guidance,
        negative_prompt=negative_prompt,
        true_cfg_scale=true_cfg_scale,
        num_images_per_prompt=num_images,
        image=image,
        mask_image=mask_image,
        strength=strength,
        use_last=use_last,
        aspect=aspect,
        loras=loras,
        lora_pick=lora_pick,
    )
