"""ringfeed: a shared-memory, ZeroMQ-fed input pipeline for TTS training with TensorFlow.

Installed, everything lives under this package, so nothing collides with a user's
own top-level modules: ``ringfeed.shared`` (contracts every process shares),
``ringfeed.producer`` (CPU producer processes), ``ringfeed.consumer`` (the stager,
the trainer, the inspector, the clients) and ``ringfeed.scripts`` (the command
line). In the repository those are the top-level folders ``shared/``,
``producer/``, ``consumer/`` and ``scripts/``, which this folder holds as committed
links (``ringfeed/shared -> ../shared``, ...): every checkout imports its own code,
and a wheel copies the folders' files under ``ringfeed/`` (pyproject.toml says why).
The public API for a training loop of one's own is :mod:`ringfeed.client`.
"""

__version__ = "0.1.0"
