"""Model code, policies, the streaming step, tokenizer, checkpoints, training and data."""
