"""The embedded tiny model's studio side: its grammar's words, its builder (configs, tokenizers, the pipeline
folder's profile) and the tiny instances of other families. Its training and evaluation live in the lab (lab/tiny);
the model itself is plain data in studio/models/tiny/pipeline, loaded like any other diffusers folder.
"""
