"""The model process: model, XLA train step, the batch it places (fed by
consumer/client/batch_stream.py, as the loaders are), checkpoints, metrics (GPU:1); the
PyTorch and JAX example trainers in torch_example/ and jax_example/, on model_loop.py."""
