"""One OpenMP team at a time: the UI thread lends its cores to a running capture.

PyTorch's CPU kernels split their work over an OpenMP team (GNU libgomp in the Linux
wheels). Every thread that runs a parallel op owns a team of its own, and libgomp counts
the threads of all teams: once the process holds more OpenMP threads than it has CPUs,
*every* team stops spin-waiting between parallel regions and sleeps on a futex instead
(libgomp's "throttled" spin count). A decode step is thousands of small parallel ops, so
each then pays a sleep and a wake. Measured on this project's 2-CPU machine, a 300-token
capture of the sample model on a worker thread took 3.6 s alone, and 6.4 s once the main
thread had run one parallel matmul (3,500 voluntary context switches instead of 5); with
the main thread on one OpenMP thread, 3.5 s again.

The app captures on a worker thread and draws on its event-loop thread, which runs
tensor code too (heatmaps, feature rows). While a capture runs, :func:`hold` puts the
calling (UI) thread on one OpenMP thread and releases its team; :func:`release` restores
the thread's setting when the last capture started from it has ended. The UI's tensor
work is small, so it loses little. The count is per thread, like OpenMP's own setting. In
Jupyter the held thread is the kernel's, so a cell run while the app generates computes on
one thread until the run ends. A hold whose page closed before its run ended is never
released: that thread stays on one OpenMP thread, which costs a UI thread little.

The capture itself runs on :func:`capture_threads` threads (:func:`set_threads`, for the worker
thread only): every core PyTorch would use, unless the operator sets another count
(``--capture-threads``, :class:`~trajscope.ui.operator.ServeConfig`). Leaving one core to the browser
and the event loop was measured and costs more than it gives on a 2-CPU machine (docs/performance.md,
"The app's capture on every core").
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
import threading
from typing import Callable

log = logging.getLogger(__name__)
_OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the thread's pool, not only idle it
_held = threading.local()  # per thread: .count (holds) and .previous (its max threads before the first)


@functools.lru_cache(maxsize=1)
def runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime PyTorch's CPU kernels use (``None`` when there is none to reach)."""
    import torch

    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    names = [p for pat in ("libgomp*.so*", "libomp*.so*", "libiomp5*.so*", "libomp*.dylib", "libiomp5*.dylib")
             for p in sorted(glob.glob(os.path.join(libdir, pat)))]
    # last, None: a build linked against the system's runtime, already in the process's global namespace
    for name in [*names, None]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "omp_set_num_threads") and hasattr(lib, "omp_get_max_threads"):
            return lib
    return None


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def capture_threads() -> int:
    """OpenMP threads for a capture the app runs: the operator's ``--capture-threads`` (or
    ``TRAJSCOPE_CAPTURE_THREADS``) when set, else every core PyTorch would use."""
    from trajscope.ui import operator

    chosen = operator.config().capture_threads
    return chosen if chosen is not None else _torch_threads()


def set_threads(n: int) -> bool:
    """Run the calling thread's tensor work on ``n`` OpenMP threads (other threads keep theirs).

    Returns False (and does nothing) where no OpenMP runtime can be reached.
    """
    lib = runtime()
    if lib is None:
        return False
    _torch_threads()  # PyTorch's own per-thread set-up first, or it would undo this at the first parallel op
    lib.omp_set_num_threads(max(1, int(n)))
    return True


def held() -> int:
    """How many running captures the calling thread is holding its team back for."""
    return getattr(_held, "count", 0)


def hold() -> bool:
    """Put the calling thread on one OpenMP thread and free its team, until :func:`release`.

    Nested holds count; only the first changes the setting. Returns False (and does nothing)
    where no OpenMP runtime can be reached.
    """
    lib = runtime()
    if lib is None:
        return False
    if held() == 0:
        _torch_threads()  # PyTorch sets a thread's OpenMP threads on its first parallel op: let it happen first
        _held.previous = int(lib.omp_get_max_threads())
        lib.omp_set_num_threads(1)
        pause = getattr(lib, "omp_pause_resource", None)
        if pause is not None and hasattr(lib, "omp_get_initial_device"):
            if pause(_OMP_PAUSE_HARD, lib.omp_get_initial_device()) != 0:  # frees this thread's pool only
                log.debug("omp_pause_resource refused; this thread's idle team stays")
    _held.count = held() + 1
    return True


def release() -> None:
    """Undo one :func:`hold` of the calling thread; the last restores its OpenMP threads."""
    if held() == 0:
        return
    _held.count -= 1
    if _held.count == 0:
        runtime().omp_set_num_threads(_held.previous)


def lend(dispatch) -> Callable[[], None]:
    """:func:`hold` the calling thread if ``dispatch`` defers work to it; return the one-shot release.

    ``dispatch`` is a :func:`~trajscope.ui.views._base.dispatcher`: when it runs callbacks on this
    thread's event loop (``dispatch.deferred``), the release it returns is meant to be dispatched
    back here when the work ends. Without a loop (scripts, tests) nothing is held.
    """
    if not getattr(dispatch, "deferred", False) or not hold():
        return lambda: None
    owner, done = threading.get_ident(), []

    def give_back() -> None:
        if done or threading.get_ident() != owner:  # OpenMP's setting is the thread's own
            return
        done.append(True)
        release()

    return give_back
