"""The batch ring pinned in place: each mapping of it registered with the device's
driver once, so that a loader's copy to the device reads the batch slot itself, with
no copy into a staging buffer first. No framework here: the PyTorch and JAX loaders
give it their framework's registration (torch_loader.py: cudaHostRegister through
``torch.cuda.cudart()``; jax_loader.py: the XLA client's ``dma_map``).

    pin = HostPin(register, unregister, "cuda:0", on_gpu=True)
    BatchClient(..., pin=pin)    # pin.pin(address, nbytes) once a ring is mapped,
                                 # pin.unpin(address) before it is unmapped
    pin.covers(array)            # the loader's place(): straight from the slot?

register(address, nbytes) returns "" once the span is pinned, else why not; where it
is not (the CPU, no GPU, a locked-memory limit, a driver that refuses), the loader says
so once and copies each batch out of the slot as it did before (pinned staging buffers
in PyTorch, a fresh host array in JAX). Registration is per process and per mapping
(LMCache pins its shared-memory pool in each process that maps it; FIELD-NOTES.md),
and slow: DeepSpeed measured it, and registered host memory at ~55 GB/s to the device
against ~16 GB/s unregistered on an H200, so it is done once per mapping, never per
batch. CUDA rejects a zero-byte registration: a ring of no bytes is not registered.

A slot read by a copy in flight goes back to the stager only when that copy has ended
(batch_stream.py SlotReads), and the client unpins a mapping only after the stream's
copies out of it have ended and before it unmaps it (batch_client.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

# register(address, nbytes) -> "" or why the span is not pinned; unregister(address)
# -> "" or why it could not be unpinned.
Register = Callable[[int, int], str]
Unregister = Callable[[int], str]


class HostPin:
    """The spans of mapped batch rings pinned for one loader's device, and whether an
    array lies in one (a RingPin: batch_client.py)."""

    def __init__(
        self, register: Register, unregister: Unregister, device: str, on_gpu: bool
    ) -> None:
        """device: the loader's, as its messages name it; on_gpu: a span not pinned is a
        warning (a GPU copy loses bandwidth), else, on the CPU, an info line."""
        self._register, self._unregister = register, unregister
        self.device, self.on_gpu = device, on_gpu
        self.spans: dict[int, int] = {}  # address -> bytes, pinned now
        self.refused = ""  # why a mapping was not pinned, said once

    def pin(self, address: int, nbytes: int) -> None:
        """Pin [address, address + nbytes): a mapping the client just made."""
        if nbytes <= 0:
            why = "a ring of no bytes: CUDA rejects a zero-byte registration"
        else:
            why = self._register(address, nbytes)
        if not why:
            self.spans[address] = nbytes
            log.debug("batch ring pinned for %s: %.1f MB", self.device, nbytes / 1e6)
            return
        if not self.refused:
            self.refused = why
            log.log(
                logging.WARNING if self.on_gpu else logging.INFO,
                "the batch ring is not pinned in place for %s (%s): each batch is copied "
                "out of its slot first, as without pinning",
                self.device,
                why,
            )

    def unpin(self, address: int) -> None:
        """Unpin the span pinned at `address` (nothing if none is): the client is about
        to unmap it, and no copy reads it."""
        if self.spans.pop(address, None) is None:
            return
        why = self._unregister(address)
        if why:
            log.warning("the batch ring's pinned span for %s stays pinned: %s", self.device, why)

    @property
    def pinned(self) -> bool:
        """Is a mapping pinned now (batches then go straight from the slot)?"""
        return bool(self.spans)

    def covers(self, array: np.ndarray) -> bool:
        """Does `array`'s memory lie in a pinned span, in one piece (a view of a pinned
        slot: a batch's views are contiguous, schema.batch_views)?"""
        if not array.flags.c_contiguous:
            return False
        start = array.ctypes.data
        end = start + array.nbytes
        return any(a <= start and end <= a + n for a, n in self.spans.items())
