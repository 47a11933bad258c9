"""Run a partition that repeats as one TorchScript graph: the whole forward pass in C++, the
interpreter lock released once instead of at every operator (the ``torchscript`` backend).

Why: a captured partition runs operator by operator from Python, and each operator call
releases the interpreter lock and takes it back. Alone that costs little; in a process where
other threads want the lock (a server's connection threads, several clients in one process)
every operator becomes a hand-off between threads. Measured on digits_cnn's edge part (batch 1,
one torch thread, in a trial): 0.31 ms of CPU per pass with one thread and 0.54 ms each with
eight threads in one process; traced, 0.26 and 0.30 ms, and the eight threads' passes overlap
on two cores.

How, safely: a partition runs eagerly until one input signature (shapes, dtypes, layout) has
come TRACE_AFTER times; then it is traced with those inputs, and the trace is kept only if
tracing raised no TracerWarning (a tensor turned into a Python number, or a branch on data,
would be baked in), every value in its graph has a static shape, and on the inputs it was
traced with and on perturbed ones it gives the eager module's outputs. Calls of any other
signature run eagerly; a signature whose trace did not qualify is never tried again. The trace
runs the same operators, so it answers what the eager module answers.

Not the default: ``torch.jit`` is deprecated in favour of torch.compile (which needs a C
compiler at run time) and torch.export (which this runtime already captures with, and which
still runs operator by operator).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import GraphModule

__all__ = ["TRACE_AFTER", "TracedRunner"]

log = logging.getLogger(__name__)
TRACE_AFTER = 3  # calls of one signature before tracing it (one-off runs never pay a trace)
MAX_TRACES = 4  # signatures traced per partition (a batching server sees a few batch sizes)
CHECK_TOL = 1e-5  # relative to the output's scale: the same operators, rounded the same


class TracedRunner:
    """Calls ``module(*args)``, eagerly or through a verified trace of it (see the module
    docstring). Thread-safe: one thread traces a signature while the others run eagerly."""

    def __init__(self, module: GraphModule) -> None:
        self.module = module
        self.static = _static_shapes(module)
        self._seen: Counter[tuple[Any, ...]] = Counter()
        self._traced: dict[tuple[Any, ...], Any] = {}
        self._refused: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()

    def __call__(self, *args: torch.Tensor) -> Sequence[torch.Tensor]:
        key = _signature(args)
        if key is None:
            return self.module(*args)
        traced = self._traced.get(key)
        if traced is not None:
            return traced(*args)
        if self.static and self._ready(key):
            self._trace(key, args)
        return self.module(*args)

    @property
    def traces(self) -> int:
        """How many signatures run traced."""
        return len(self._traced)

    def _ready(self, key: tuple[Any, ...]) -> bool:
        if key in self._refused or len(self._traced) + len(self._refused) >= MAX_TRACES:
            return False  # the common answer once settled: no lock on every eager call
        with self._lock:
            if key in self._refused or len(self._traced) + len(self._refused) >= MAX_TRACES:
                return False
            self._seen[key] += 1
            if self._seen[key] != TRACE_AFTER:
                return False
            self._refused.add(key)  # until it qualifies: no other thread traces it meanwhile
            return True

    def _trace(self, key: tuple[Any, ...], args: Sequence[torch.Tensor]) -> None:
        try:
            traced = _trace(self.module, args)
        except Exception as exc:  # a graph TorchScript cannot hold: eager it stays
            log.debug("not tracing %s: %s", key, exc)
            return
        if traced is None:
            return
        with self._lock:
            self._traced[key] = traced
            self._refused.discard(key)


def _signature(args: Sequence[Any]) -> tuple[Any, ...] | None:
    if not all(isinstance(a, torch.Tensor) and not a.requires_grad for a in args):
        return None  # training, or something a trace cannot take
    return tuple((tuple(a.shape), a.dtype, a.is_contiguous()) for a in args)


def _static_shapes(module: GraphModule) -> bool:
    """Whether every value in the graph has a fixed shape (no size that depends on the data
    or on a symbol), as captured: only then can a trace at one signature stand for all calls
    of that signature."""
    for node in module.graph.nodes:
        if node.op == "output":
            continue
        val = node.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor):
                if not all(isinstance(d, int) for d in v.shape):
                    return False
            elif v is not None and not isinstance(v, int | float | bool):
                return False  # a symbolic size or something unknown
    return True


def _trace(module: GraphModule, args: Sequence[torch.Tensor]) -> Any:
    """A checked trace of ``module`` at ``args``' signature, or None."""
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        traced = torch.jit.trace(module, tuple(args), check_trace=False)
    if any(issubclass(w.category, torch.jit.TracerWarning) for w in caught):
        return None
    fresh = [_perturbed(a) for a in args]  # a value baked into the trace would show here
    with torch.no_grad():
        for inputs in (list(args), fresh):
            if not _same(module(*inputs), traced(*inputs)):
                return None
    return traced


def _perturbed(x: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point():
        g = torch.Generator().manual_seed(0)
        return x + torch.randn(x.shape, generator=g, dtype=x.dtype) * (x.abs().mean() + 1e-3)
    return x.clone()  # ids, masks: other values might fall outside the model's range


def _same(eager: Any, traced: Any) -> bool:
    a = list(eager) if isinstance(eager, list | tuple) else [eager]
    b = list(traced) if isinstance(traced, list | tuple) else [traced]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            return False
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not x.is_floating_point():
            if not torch.equal(x, y):
                return False
            continue
        scale = float(x.abs().max()) if x.numel() else 0.0
        if not torch.allclose(x, y, rtol=0, atol=CHECK_TOL * (scale + 1)):
            return False
    return True
