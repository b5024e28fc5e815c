"""app: the Gradio UI over a studio.worker.Device, the top of the house. Off ZeroGPU its process loads no torch (the
device work runs in the worker)."""
