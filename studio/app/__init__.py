"""app: the Gradio UI (layout per tab in ui.py, components and each endpoint's form held by name in forms.py,
handlers over a small facade in handlers.py, whose device is a studio.worker.Device). The top of the house; off
ZeroGPU its process loads no torch (the device work runs in the worker).
"""
