"""The weight-sharing supernet of a search space (ProxylessNAS style) and its mixed ops.

Every searchable layer is a :class:`MixedOp` holding all R candidate modules, each with its own
weights. Which of them run is state on the MixedOp, not an argument of ``forward``, so the
supernet stays an ordinary ``nn.Module`` that any training loop can call:

- ``active=(i,)``, no gates: only candidate ``i`` runs (a weight step on one sampled
  architecture; memory as for one network). :meth:`Supernet.set_arch` sets this everywhere.
- ``active=(i, j)`` with ``gates`` a tensor of shape (2,): the output is
  ``gates[0] * op_i(x) + gates[1] * op_j(x)``. This is the seam for JMSNAS's architecture step
  (section IV-A): sample two paths from the softmax of alpha, pass one-hot binary gates built
  as a leaf tensor with ``requires_grad=True``, back-propagate, and ``gates.grad`` holds
  dL/dg for the two paths, from which Lemma 1 gives dL/dalpha. Both paths run even where a
  gate is 0, because dL/dg_j needs op_j(x). Memory is 2x a single network, not R x.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.nas.network import ArchNet, ChainFrame, init_weights
from edgesplit.nas.ops import OpSpec
from edgesplit.nas.space import Arch, SearchSpace

__all__ = ["MixedOp", "Supernet"]


class MixedOp(nn.Module):
    """The R candidate ops of one layer; ``active`` (and ``gates``) choose what ``forward`` runs.

    Until :meth:`set_paths` is called, path 0 is active.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int, ops: Sequence[OpSpec]) -> None:
        super().__init__()
        self.specs = tuple(ops)
        self.candidates = nn.ModuleList(op.build(in_ch, out_ch, stride) for op in self.specs)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gates is None:
            return self.candidates[self.active[0]](x)
        out = self.gates[0] * self.candidates[self.active[0]](x)
        for gate, i in zip(self.gates[1:], self.active[1:], strict=True):
            out = out + gate * self.candidates[i](x)
        return out

    def extra_repr(self) -> str:
        return f"active={[self.specs[i].name for i in self.active]}, gated={self.gates is not None}"


class Supernet(ChainFrame):
    """All architectures of ``space`` in one module with shared stem and head.

    ``set_arch(arch)`` makes ``forward`` the network of ``arch``; ``extract(arch)`` copies that
    network out as a standalone :class:`ArchNet` whose output equals the supernet's.

    ``channels_last`` keeps weights and activations in NHWC: depthwise convolutions, most of
    an MBConv's time, train about twice as fast that way on CPU. Extracted networks are
    contiguous (NCHW) either way, as export and the runtime expect.
    """

    def __init__(self, space: SearchSpace, *, channels_last: bool = True) -> None:
        super().__init__(space)
        self.layers = nn.ModuleList(
            MixedOp(space.in_channels(i), layer.out_channels, layer.stride, layer.ops)
            for i, layer in enumerate(space.layers))
        init_weights(self)
        self.channels_last = channels_last
        if channels_last:
            # Module.to accepts memory_format at run time; torch's overloads omit it.
            self.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return super().forward_stem(x)

    @property
    def mixed_ops(self) -> list[MixedOp]:
        """The searchable layers in order (for samplers that set paths layer by layer)."""
        return [m for m in self.layers if isinstance(m, MixedOp)]

    def set_arch(self, arch: Arch) -> None:
        """Run exactly the ops of ``arch`` (one path per layer, no gates)."""
        for mixed, index in zip(self.mixed_ops, self.space.arch_indices(arch), strict=True):
            mixed.set_paths((index,))

    @property
    def arch(self) -> Arch:
        """The architecture forward currently runs; an error while any layer is gated."""
        if any(m.gates is not None for m in self.mixed_ops):
            raise ConfigError("the supernet runs gated multi-path layers, not one architecture; "
                              "call set_arch first")
        return self.space.arch_from_indices([m.active[0] for m in self.mixed_ops])

    def forward_layers(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def extract(self, arch: Arch | None = None) -> ArchNet:
        """A standalone network of ``arch`` (default: the current one) with copies of this
        supernet's weights, in this supernet's train/eval mode."""
        arch = self.arch if arch is None else arch
        indices = self.space.arch_indices(arch)
        state = {k: v for k, v in self.state_dict().items() if not k.startswith("layers.")}
        for i, (mixed, index) in enumerate(zip(self.mixed_ops, indices, strict=True)):
            for key, value in mixed.candidates[index].state_dict().items():
                state[f"layers.{i}.{key}"] = value
        return ArchNet.from_state_dict(self.space, arch, state).train(self.training)
