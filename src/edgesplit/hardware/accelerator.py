"""Which torch device this process computes on: ``--torch-device cpu | cuda[:N] | mps``.

A plan prices V100s, Jetsons and laptop GPUs; the runtime, the profiler and the trainers run
their tensors wherever ``--torch-device`` says. The wire stays on the CPU: what crosses a link
is encoded from host memory, so a step moves its inputs to the device and its outputs back
(:func:`to_device`), and a caller sees CPU tensors whatever computed them.

:func:`torch_device` checks the name against what this machine has *before* any model is
loaded, so ``--torch-device cuda`` on a machine without CUDA is one line, not a traceback after
a minute of capture.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch

from edgesplit.errors import ConfigError

__all__ = ["AcceleratorError", "accelerators", "device_of", "synchronize", "to_device",
           "torch_device"]

class AcceleratorError(ConfigError):
    """``--torch-device`` names a device this machine does not have."""


def accelerators() -> list[str]:
    """The torch devices this machine can compute on, CPU first (``cuda:0``, ... , ``mps``)."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def torch_device(spec: str | torch.device | None) -> torch.device:
    """``spec`` as a torch device this machine has (None: the CPU); AcceleratorError naming
    the devices it does have otherwise. ``cuda`` means the current CUDA device."""
    if spec is None:
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise AcceleratorError(f"--torch-device {str(spec)!r} is not a torch device: give cpu, "
                               "cuda, cuda:N or mps") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        return _cuda(device)
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise AcceleratorError(f"--torch-device mps: this machine has no MPS device "
                                   f"(available: {', '.join(accelerators())})")
        return device
    raise AcceleratorError(f"--torch-device {str(spec)!r}: edgesplit computes on cpu, cuda[:N] "
                           "or mps")


def _cuda(device: torch.device) -> torch.device:
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else \
            f"torch built for CUDA {torch.version.cuda}, but no CUDA device is visible"
        raise AcceleratorError(f"--torch-device {device}: this machine has {build} "
                               f"(available: {', '.join(accelerators())})")
    index = torch.cuda.current_device() if device.index is None else device.index
    if not 0 <= index < torch.cuda.device_count():
        raise AcceleratorError(f"--torch-device {device}: this machine has "
                               f"{torch.cuda.device_count()} CUDA device(s) "
                               f"(available: {', '.join(accelerators())})")
    return torch.device("cuda", index)


def to_device(values: Mapping[str, torch.Tensor], device: torch.device
              ) -> dict[str, torch.Tensor]:
    """``values`` on ``device`` (a tensor already there is not copied). Copies to an
    accelerator are queued (its stream orders them before the kernels that read them); copies
    back to the CPU wait, since the caller reads them at once."""
    queued = device.type != "cpu"
    return {k: v.to(device, non_blocking=queued) if isinstance(v, torch.Tensor) else v
            for k, v in values.items()}


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (timings on an accelerator must: its kernels run
    after the Python call returns). Nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def device_of(module: torch.nn.Module) -> torch.device:
    """Where ``module`` computes: the device of its first parameter, else of its first buffer
    (frozen weights may be buffers), else the CPU. Helpers that feed a model batches read its
    place from the model, so a trainer that moved it needs to tell them nothing."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return torch.device("cpu")
