"""The supernet of a search space and its mixed ops.

Every searchable layer is a mixed op over its R candidates (which paths run, and the binary
gates of JMSNAS's architecture step, are described in :mod:`edgesplit.nas.jmsnas.paths`). Two kinds:

- ``weights="separate"``: :class:`MixedOp`, one weight set per candidate (ProxylessNAS, and
  JMSNAS's "mixed operation vector with R elements");
- ``weights="shared"``: :class:`~edgesplit.nas.jmsnas.shared.SharedMixedOp`, every MBConv
  candidate of a layer slices one weight set (once-for-all), which trains far faster from
  scratch when paths are sampled uniformly (the measurements are in that module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.nas.core.ops import OpSpec
from edgesplit.nas.jmsnas.network import ArchNet, ChainFrame, init_weights
from edgesplit.nas.jmsnas.paths import PathChoice
from edgesplit.nas.jmsnas.shared import SharedMixedOp
from edgesplit.nas.jmsnas.space import Arch, SearchSpace

__all__ = ["MixedOp", "Supernet"]


class MixedOp(PathChoice):
    """The R candidate ops of one layer, each with its own weights (ProxylessNAS)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, ops: Sequence[OpSpec]) -> None:
        super().__init__(ops)
        self.candidates = nn.ModuleList(op.build(in_ch, out_ch, stride) for op in self.specs)

    def run_path(self, index: int, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.candidates[index](x)
        return out

    def candidate_state(self, index: int) -> dict[str, torch.Tensor]:
        return dict(self.candidates[index].state_dict())


class Supernet(ChainFrame):
    """All architectures of ``space`` in one module with shared stem and head.

    ``set_arch(arch)`` makes ``forward`` the network of ``arch``; ``extract(arch)`` copies that
    network out as a standalone :class:`ArchNet` whose output equals the supernet's.

    ``channels_last`` keeps weights and activations in NHWC: depthwise convolutions, most of
    an MBConv's time, train about twice as fast that way on CPU. Extracted networks are
    contiguous (NCHW) either way, as export and the runtime expect.
    """

    def __init__(self, space: SearchSpace, *, channels_last: bool = True,
                 weights: Literal["separate", "shared"] = "separate") -> None:
        super().__init__(space)
        if weights not in ("separate", "shared"):
            raise ConfigError(f"weights={weights!r}: choose 'separate' (one weight set per "
                              "candidate) or 'shared' (candidates slice one set)")
        kind: type[MixedOp] | type[SharedMixedOp] = (
            MixedOp if weights == "separate" else SharedMixedOp)
        self.weights = weights
        self.layers = nn.ModuleList(
            kind(space.in_channels(i), layer.out_channels, layer.stride, layer.ops)
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
    def mixed_ops(self) -> list[PathChoice]:
        """The searchable layers in order (for samplers that set paths layer by layer)."""
        return [m for m in self.layers if isinstance(m, PathChoice)]

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
            for key, value in mixed.candidate_state(index).items():
                state[f"layers.{i}.{key}"] = value
        return ArchNet.from_state_dict(self.space, arch, state).train(self.training)
