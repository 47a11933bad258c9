"""Which candidate paths of a searchable layer run: the state every mixed op shares.

A layer holds R candidate ops; which of them run is state on the module, not an argument of
``forward``, so a supernet stays an ordinary ``nn.Module`` that any training loop can call:

- ``active=(i,)``, no gates: only candidate ``i`` runs (a weight step on one sampled
  architecture; memory as for one network);
- ``active=(i, j)`` with ``gates`` of shape (2,): the output is
  ``gates[0] * op_i(x) + gates[1] * op_j(x)``, JMSNAS's architecture step (section IV-A) with
  the binary gates of :mod:`edgesplit.nas.jmsnas.binary_gates`. Both paths run even where a gate is
  0, because dL/dg_j needs op_j(x): memory is 2x a single network, not Rx.

Subclasses say how candidate ``i`` runs (:meth:`PathChoice.run_path`) and what its weights are
as a plain op's state dict (:meth:`PathChoice.candidate_state`), which is how a supernet
extracts a standalone network.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.nas.core.ops import OpSpec

__all__ = ["PathChoice"]


class PathChoice(nn.Module):
    """The candidate ``specs`` of one layer and the paths that run; path 0 until
    :meth:`set_paths` is called."""

    def __init__(self, ops: Sequence[OpSpec]) -> None:
        super().__init__()
        self.specs = tuple(ops)
        self.active: tuple[int, ...] = (0,)
        self.gates: torch.Tensor | None = None

    def set_paths(self, active: Sequence[int], gates: torch.Tensor | None = None) -> None:
        """Run the candidates ``active``; more than one needs ``gates`` (one weight per path)."""
        active = tuple(int(i) for i in active)
        if not active or len(set(active)) != len(active):
            raise ConfigError(f"active paths {active} must be distinct and at least one")
        if not all(0 <= i < len(self.specs) for i in active):
            raise ConfigError(f"active paths {active} out of range: this layer has "
                              f"{len(self.specs)} candidates (0..{len(self.specs) - 1})")
        if gates is None and len(active) > 1:
            raise ConfigError(f"{len(active)} active paths need gates: a tensor of shape "
                              f"({len(active)},) weighting each path's output")
        if gates is not None and tuple(gates.shape) != (len(active),):
            raise ConfigError(f"gates of shape {tuple(gates.shape)} do not match "
                              f"{len(active)} active paths")
        self.active, self.gates = active, gates

    def run_path(self, index: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def candidate_state(self, index: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gates is None:
            return self.run_path(self.active[0], x)
        out = self.gates[0] * self.run_path(self.active[0], x)
        for gate, i in zip(self.gates[1:], self.active[1:], strict=True):
            out = out + gate * self.run_path(i, x)
        return out

    def extra_repr(self) -> str:
        return f"active={[self.specs[i].name for i in self.active]}, gated={self.gates is not None}"
