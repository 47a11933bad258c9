"""What both ends of a hop read from the plan: the call metadata keys, the largest message
the plan can need, a device's plan name, the links between devices, and decoding a tensor as
the plan says it is. :mod:`edgesplit.runtime.server` and :mod:`edgesplit.runtime.client` (and
the star's and mesh's modules) share them from here.
"""

from __future__ import annotations

import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import Link
from edgesplit.runtime.program import PlanProgram

__all__ = ["JOIN_KEY", "SESSION_KEY", "decode_planned", "link_before", "link_between",
           "max_message_bytes", "plan_device"]

SESSION_KEY = "edgesplit-session"  # call metadata naming the client session (backend state)
# call metadata joining a star's source requests at its sink (one key per client request)
JOIN_KEY = "edgesplit-join"

def max_message_bytes(program: PlanProgram) -> int:
    """The largest message the plan can need: every tensor that may travel, at float32, plus
    headers. Anything larger is refused by gRPC itself (RESOURCE_EXHAUSTED)."""
    names = {t for s in program.steps for t in (*s.receives, *s.sends, *s.returns)}
    tensors = program.graph.tensors
    payload = sum(max(tensors[t].bytes, tensors[t].elements * 4) + 256 for t in names)
    return max(64 * 1024, int(payload * 1.25) + 16 * 1024)


def plan_device(program: PlanProgram, device: str) -> str:
    """The plan's name for ``device``: a plan device's own name (edge, cloud, a hop), or the
    preset it was planned with when exactly one plan device uses that preset."""
    names = [s.name for s in program.steps]
    if device in names:
        return device
    matches = [d.name for d in program.plan.devices if d.device.name == device]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ConfigError(f"{len(matches)} plan devices use {device!r} ({', '.join(matches)}): "
                          "name one of them")
    presets = ", ".join(f"{d.name} ({d.device.name})" for d in program.plan.devices)
    raise ConfigError(f"device {device!r} is not in the plan; its devices are {presets}")


def link_before(program: PlanProgram, device_index: int):
    """The plan's link between device i-1 and i (None for device 0)."""
    if device_index == 0:
        return None
    names = [s.name for s in program.steps]
    return link_between(program, names[device_index - 1], names[device_index])


def link_between(program: PlanProgram, a: str, b: str) -> Link:
    """The plan's link between devices ``a`` and ``b``."""
    for link in program.plan.links:
        if {link.src, link.dst} == {a, b}:
            return link.link
    raise ConfigError(f"the plan has no link between {a!r} and {b!r}")


def decode_planned(program: PlanProgram, name: str, data: bytes | bytearray | memoryview
                   ) -> torch.Tensor:
    """Decode tensor ``name`` of the plan (:meth:`PlanProgram.decode`): any other shape or
    dtype is refused (WireError) before its payload is decompressed or allocated."""
    return program.decode(name, data)

