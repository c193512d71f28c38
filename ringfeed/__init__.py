"""ringfeed: a shared-memory, ZeroMQ-fed input pipeline for TTS training with TensorFlow,
PyTorch or JAX.

Installed, everything lives under this package, so nothing collides with a user's
own top-level modules: ``ringfeed.shared`` (contracts every process shares),
``ringfeed.producer`` (CPU producer processes), ``ringfeed.consumer`` (the stager,
the trainer, the inspector, the clients) and ``ringfeed.scripts`` (the command
line). In the repository those are the top-level folders ``shared/``,
``producer/``, ``consumer/`` and ``scripts/``, which this folder holds as committed
links (``ringfeed/shared -> ../shared``, ...): every checkout imports its own code,
and a wheel copies the folders' files under ``ringfeed/`` (pyproject.toml says why).
The public API for a training loop of one's own is :mod:`ringfeed.client` (TensorFlow,
and the framework-free BatchClient), :mod:`ringfeed.torch` and :mod:`ringfeed.jax`. Those
two are named like the frameworks they serve: a script run from inside this folder would
import them as ``torch`` and ``jax`` (Python puts a script's folder first on its path).
"""

__version__ = "0.1.0"
