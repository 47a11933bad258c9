"""This process's compute threads: letting a thread's idle OpenMP workers go.

torch's CPU build runs intra-op work on OpenMP (GNU libgomp). Every thread that runs a parallel
op gets a team of its own (itself plus ``threads - 1`` workers), and the team outlives the op.
Once the process holds more OpenMP threads than it has cores, libgomp *throttles* every team:
between two parallel ops its workers spin about 100 times, not 300,000, and then sleep in the
kernel, so each op of a forward pass waits for its workers to be woken. A model of many small
ops then runs ~2x slower (MobileNetV2 here: 11 ms on the thread that loaded it, 28 ms on a
second thread while the first thread's team lives). That is what happens when one thread loads
and checks a model and another serves it.

:func:`release_thread_pool` ends the calling thread's team (OpenMP 5's
``omp_pause_resource_all``): a thread about to idle (a server's main thread once its workers
serve, a client driver once its clients run) calls it, so that the threads that compute have
the cores' worth of OpenMP threads to themselves. The team comes back, at the cost of starting
its workers again (a few hundred microseconds), if the thread computes again."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

__all__ = ["openmp_library", "release_thread_pool"]

_OMP_PAUSE_SOFT = 1  # omp_pause_soft: free the threads, keep what the next region needs
_NAMES = ("libgomp", "libiomp", "libomp")


def _loaded_paths() -> list[str]:
    """Paths of the shared libraries this process has mapped (Linux; empty elsewhere)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return list(dict.fromkeys(line.split(maxsplit=5)[-1] for line in lines
                              if line.count(" ") >= 5 and "/" in line))


@functools.cache
def openmp_library() -> ctypes.CDLL | None:
    """The OpenMP runtime torch runs on, when it is loaded and has ``omp_pause_resource_all``;
    None otherwise. Found by path, not by symbol: torch loads it privately, and other packages
    bring copies of their own (scikit-learn's libgomp), whose pools are not torch's."""
    import torch

    home = os.path.dirname(torch.__file__) + os.sep
    found = [p for p in _loaded_paths() if os.path.basename(p).startswith(_NAMES)]
    # torch's own first, then a system one; other wheels' copies (in site-packages) last
    for path in sorted(found, key=lambda p: (not p.startswith(home), "site-packages" in p)):
        try:
            lib = ctypes.CDLL(path)  # the copy already loaded: same file, same handle
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            lib.omp_pause_resource_all.restype = ctypes.c_int
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            return lib
    return None


def release_thread_pool() -> bool:
    """End the calling thread's OpenMP team, if it has one (its idle workers exit). True when
    the runtime accepted (also with no team to end); False with no OpenMP 5 runtime or inside
    a parallel region, which it refuses. Safe from any thread: it touches only the caller's
    own team."""
    lib = openmp_library()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
