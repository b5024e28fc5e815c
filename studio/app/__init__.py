"""app: the Gradio UI (layout per tab in ui.py, components and each endpoint's form held by name in forms.py,
handlers over a small facade in handlers.py). The top of the house."""
