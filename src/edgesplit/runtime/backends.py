"""Backends: what runs a device's partition. One small protocol, a registry of them.

A backend prepares a step once (export, compile, open a session) and then runs it on tensors
by name. It may keep state per client session (an LLM's KV cache): :meth:`Backend.new_state`
makes one, the server keeps it per session (call metadata ``edgesplit-session``) and hands it
back to every :meth:`Backend.run` of that session. Stateless backends return None.

A backend computes on one torch device (``--torch-device``, :mod:`edgesplit.hardware.accelerator`):
the torch backends move the partition there when they prepare it, and each run's inputs there
and its outputs back to the CPU, where the wire encodes them; ONNX Runtime picks the matching
execution provider.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch.fx import GraphModule

from edgesplit.hardware.accelerator import AcceleratorError, to_device
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
    device: torch.device

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
    device = torch.device("cpu")  # a subclass that skips __init__ computes on the CPU

    def __init__(self, device: torch.device | None = None) -> None:
        if device is not None:
            self.device = device

    def prepare(self, step: DeviceStep, example: Mapping[str, torch.Tensor]) -> None:
        assert step.partition is not None  # the partition is already a module
        if self.device.type != "cpu":
            # a copy: the partition shares its weights with the captured program, which stays
            # on the CPU as the unsplit reference (PlanProgram.unsplit)
            module = copy.deepcopy(step.partition.module).to(self.device)
            step.partition = dataclasses.replace(step.partition, module=module)

    def new_state(self, step: DeviceStep) -> None:
        return None

    def run(self, step: DeviceStep, values: Mapping[str, torch.Tensor], state: Any
            ) -> dict[str, torch.Tensor]:
        assert step.partition is not None
        with torch.no_grad():
            out = step.partition.run(self._inputs(values))
        return self._outputs(out)

    def _inputs(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(values) if self.device.type == "cpu" else to_device(values, self.device)

    def _outputs(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return out if self.device.type == "cpu" else to_device(out, torch.device("cpu"))


class TorchScriptBackend(TorchBackend):
    """The captured PyTorch program; a partition called again and again with the same input
    shapes runs as a checked TorchScript trace of itself (:mod:`edgesplit.runtime.traced`:
    the same operators without an interpreter-lock hand-off at each)."""

    name = "torchscript"

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__(device)
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
        inputs = self._inputs({n: values[n] for n in partition.inputs})
        with torch.no_grad():
            out = self.runner(partition.module)(*inputs.values())
        return self._outputs(dict(zip(partition.outputs, out, strict=True)))

    def runner(self, module: GraphModule) -> TracedRunner:
        """``module``'s runner (made at its first call)."""
        runner = self._runners.get(module)
        if runner is None:
            with self._lock:
                runner = self._runners.setdefault(module, TracedRunner(module))
        return runner


class OnnxRuntimeBackend:
    """Each partition exported to ONNX and run by ONNX Runtime: its CPU provider, or on
    ``cuda:N`` its CUDA provider (the ``onnxruntime-gpu`` package), the CPU taking what CUDA
    cannot run. Inputs and outputs stay in host memory (ONNX Runtime copies them)."""

    name = "onnxruntime"

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.providers = _onnx_providers(self.device)

    def prepare(self, step: DeviceStep, example: Mapping[str, torch.Tensor]) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = 3
        step.session = ort.InferenceSession(step.to_onnx(dict(example)), options,
                                            providers=self.providers)

    def new_state(self, step: DeviceStep) -> None:
        return None

    def run(self, step: DeviceStep, values: Mapping[str, torch.Tensor], state: Any
            ) -> dict[str, torch.Tensor]:
        assert step.partition is not None and step.session is not None
        feeds = {t: values[t].numpy() for t in step.partition.inputs}
        outs = step.session.run(list(step.partition.outputs), feeds)  # type: ignore[attr-defined]
        return {t: torch.from_numpy(o) for t, o in zip(step.partition.outputs, outs, strict=True)}


def _onnx_providers(device: torch.device) -> list[Any]:
    """ONNX Runtime's execution providers for ``device``, checked against those installed."""
    if device.type == "cpu":
        return ["CPUExecutionProvider"]
    import onnxruntime as ort

    if device.type != "cuda" or "CUDAExecutionProvider" not in ort.get_available_providers():
        raise AcceleratorError(f"the onnxruntime backend cannot compute on {device}: this "
                               f"ONNX Runtime has {', '.join(ort.get_available_providers())} "
                               "(for CUDA: pip install onnxruntime-gpu), or use --backend "
                               "torch")
    return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]


# a backend kind: made with the torch device it computes on, or with none for the CPU
BackendKind = Callable[..., Backend]
BACKENDS: Registry[BackendKind] = Registry("backend", label="Runtime backends")
BACKENDS.register("torch", TorchBackend)
BACKENDS.register("torchscript", TorchScriptBackend)
BACKENDS.register("onnxruntime", OnnxRuntimeBackend)


def get_backend(name: str, device: torch.device | None = None) -> Backend:
    """A new backend of the registered kind ``name`` computing on ``device`` (None or the CPU:
    made without one, so a kind registered before devices existed, taking no argument, still
    works; see :func:`edgesplit.hardware.accelerator.torch_device`); did-you-mean error when
    unknown."""
    kind = BACKENDS.get(name)
    return kind(device) if device is not None and device.type != "cpu" else kind()
