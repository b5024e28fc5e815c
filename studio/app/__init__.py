"""app: the Gradio UI (layout per tab in ui.py, handlers over a small facade in handlers.py). The top of the house."""
