"""The model process: feeder, model, XLA train step, checkpoints, metrics (GPU:1); the
PyTorch and JAX example trainers in torch_example/ and jax_example/, on model_loop.py."""
