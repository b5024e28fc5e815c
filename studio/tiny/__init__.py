"""Tools for the embedded tiny model: its scenes and grammar, builder, trainer and evaluation.

They sit above the engine and use it (`python -m studio.tiny.train`, `python -m studio.tiny.eval`); the model
itself is plain data in studio/models/tiny/pipeline, loaded like any other diffusers folder.
"""
