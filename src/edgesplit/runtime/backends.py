"""Backends: what runs a device's partition. One small protocol, a registry of them.

A backend prepares a step once (export, compile, open a session) and then runs it on tensors
by name. It may keep state per client session (an LLM's KV cache): :meth:`Backend.new_state`
makes one, the server keeps it per session (call metadata ``edgesplit-session``) and hands it
back to every :meth:`Backend.run` of that session. Stateless backends return None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from edgesplit.registry import Registry

if TYPE_CHECKING:
    from edgesplit.runtime.program import DeviceStep

__all__ = ["BACKENDS", "Backend", "OnnxRuntimeBackend", "TorchBackend", "get_backend"]


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
BACKENDS.register("onnxruntime", OnnxRuntimeBackend)


def get_backend(name: str) -> Backend:
    """A new backend of the registered kind ``name`` (did-you-mean error when unknown)."""
    return BACKENDS.get(name)()
