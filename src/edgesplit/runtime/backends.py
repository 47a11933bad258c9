"""Backends: what runs a device's partition. One small protocol, a registry of them.

A backend prepares a step once (export, compile, open a session) and then runs it on tensors
by name. It may keep state per client session (an LLM's KV cache): :meth:`Backend.new_state`
makes one, the server keeps it per session (call metadata ``edgesplit-session``) and hands it
back to every :meth:`Backend.run` of that session. Stateless backends return None.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch.fx import GraphModule

from edgesplit.registry import Registry
from edgesplit.runtime.traced import TracedRunner

if TYPE_CHECKING:
    from edgesplit.runtime.program import DeviceStep

__all__ = ["BACKENDS", "Backend", "OnnxRuntimeBackend", "TorchBackend", "TorchScriptBackend",
           "get_backend"]


@runtime_checkable
class Backend(Protocol):
    """Runs device steps. ``prepare`` once per step, before any ``run``."""

    name: str

    def prepare(self, step: DeviceStep, example: Mapping[str, torch.Tensor]) -> None:
        """Get ``step`` ready to run (``example``: every tensor of one run, for shapes)."""

    def new_state(self, step: DeviceStep) -> Any:
        """A fresh per-session state for ``step``, or None when the backend keeps none."""

    def run(self, step: DeviceStep, values: Mapping[str, torch.Tensor], state: Any
            ) -> dict[str, torch.Tensor]:
        """The partition's outputs by name, from its inputs in ``values``."""


class TorchBackend:
    """The captured PyTorch program, as is."""

    name = "torch"

    def prepare(self, step: DeviceStep, example: Mapping[str, torch.Tensor]) -> None:
        pass  # the partition is already a module

    def new_state(self, step: DeviceStep) -> None:
        return None

    def run(self, step: DeviceStep, values: Mapping[str, torch.Tensor], state: Any
            ) -> dict[str, torch.Tensor]:
        assert step.partition is not None
        with torch.no_grad():
            return step.partition.run(dict(values))


class TorchScriptBackend(TorchBackend):
    """The captured PyTorch program; a partition called again and again with the same input
    shapes runs as a checked TorchScript trace of itself (:mod:`edgesplit.runtime.traced`:
    the same operators without an interpreter-lock hand-off at each)."""

    name = "torchscript"

    def __init__(self) -> None:
        # per partition module: a batching server's freed-batch copy is another module
        self._runners: weakref.WeakKeyDictionary[GraphModule, TracedRunner] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def run(self, step: DeviceStep, values: Mapping[str, torch.Tensor], state: Any
            ) -> dict[str, torch.Tensor]:
        partition = step.partition
        assert partition is not None
        if any(name not in values for name in partition.inputs):
            return super().run(step, values, state)  # which says what is missing
        with torch.no_grad():
            out = self.runner(partition.module)(*(values[n] for n in partition.inputs))
        return dict(zip(partition.outputs, out, strict=True))

    def runner(self, module: GraphModule) -> TracedRunner:
        """``module``'s runner (made at its first call)."""
        runner = self._runners.get(module)
        if runner is None:
            with self._lock:
                runner = self._runners.setdefault(module, TracedRunner(module))
        return runner


class OnnxRuntimeBackend:
    """Each partition exported to ONNX and run by ONNX Runtime on the CPU."""

    name = "onnxruntime"

    def prepare(self, step: DeviceStep, example: Mapping[str, torch.Tensor]) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = 3
        step.session = ort.InferenceSession(step.to_onnx(dict(example)), options,
                                            providers=["CPUExecutionProvider"])

    def new_state(self, step: DeviceStep) -> None:
        return None

    def run(self, step: DeviceStep, values: Mapping[str, torch.Tensor], state: Any
            ) -> dict[str, torch.Tensor]:
        assert step.partition is not None and step.session is not None
        feeds = {t: values[t].numpy() for t in step.partition.inputs}
        outs = step.session.run(list(step.partition.outputs), feeds)  # type: ignore[attr-defined]
        return {t: torch.from_numpy(o) for t, o in zip(step.partition.outputs, outs, strict=True)}


BACKENDS: Registry[type[Backend]] = Registry("backend", label="Runtime backends")
BACKENDS.register("torch", TorchBackend)
BACKENDS.register("torchscript", TorchScriptBackend)
BACKENDS.register("onnxruntime", OnnxRuntimeBackend)


def get_backend(name: str) -> Backend:
    """A new backend of the registered kind ``name`` (did-you-mean error when unknown)."""
    return BACKENDS.get(name)()
