"""The model process: feeder, model, XLA train step, checkpoints, metrics (GPU:1)."""
