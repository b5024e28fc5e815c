"""The embedded tiny model's studio side: its grammar, its builder and the tiny instances of other families. Its
training lives in the lab (lab/tiny); the model is plain data in studio/models/tiny/pipeline."""
