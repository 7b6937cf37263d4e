"""Training: the loop, its recipes and its batches (not needed to serve a model)."""
