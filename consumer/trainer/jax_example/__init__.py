"""The JAX example trainer: the model process of `ringfeed run CONFIG --trainer jax`."""
