"""Limit math-library threads (BLAS, OpenMP, numba) in producer processes.

Each producer is one process per core; a BLAS or numba pool of its own in
each one oversubscribes the cores (N producers x N threads) and makes step
times jitter, so producers run with producers.math_threads (default 1).
Libraries read their thread variables when they load, so a parent passes
:func:`math_thread_env` to the children it spawns, and a child that already
imported them calls :func:`pin_math_threads`.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

# The limit this process set, or the pool it was forked from (producer/process/pool.py pins
# before it forks): each worker's threadpoolctl scan of its loaded libraries took ~10
# ms of its start.
_pinned: int | None = None

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


def math_thread_env(n: int) -> dict[str, str]:
    """Environment entries limiting every math library to n threads (merge into a child's env)."""
    if n < 1:
        raise ValueError(f"producers.math_threads must be >= 1, got {n}")
    return {name: str(n) for name in THREAD_ENV_VARS}


def pin_math_threads(n: int) -> None:
    """Limit this process's math libraries to n threads; called once at producer start.

    Loaded BLAS/OpenMP pools are limited through threadpoolctl; the variables are
    also set so libraries loaded later (scipy's own OpenBLAS, numba) start limited.
    """
    global _pinned
    if _pinned == n:
        return
    from threadpoolctl import threadpool_limits

    os.environ.update(math_thread_env(n))
    if "numba" in sys.modules:
        import numba

        # numba cannot go above the pool size it started with. This may load its
        # threading layer (libgomp), so it goes before threadpoolctl limits OpenMP.
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    threadpool_limits(limits=n)
    _pinned = n
    log.debug("math libraries limited to %d thread(s)", n)
