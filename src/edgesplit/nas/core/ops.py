"""Candidate operations of a searchable layer: the MBConv block, the identity skip, and
:class:`OpSpec`, the JSON-friendly description a search space and an architecture are made of.

Two rules keep every candidate well defined at every layer (JMSNAS section IV-A does not say
what a shortcut means where the shape changes):

- a *shortcut* (residual add) exists only where the layer keeps the shape (stride 1 and
  ``in_ch == out_ch``); asking for one elsewhere is a :class:`~edgesplit.errors.ConfigError`,
  not silently dropped, because a dropped shortcut would make ``mb3_e6_sc`` and ``mb3_e6`` two
  names (two supernet paths with their own weights and probabilities) for one network;
- *identity* is only allowed where the layer keeps the shape, so the first layer of a stage
  that downsamples or widens is never skippable (as in ProxylessNAS).

:func:`legal_ops` filters a candidate list down to what a layer of a given shape accepts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError

__all__ = [
    "JMSNAS_CANDIDATES",
    "MBConv",
    "OpKind",
    "OpSpec",
    "build_op",
    "keeps_shape",
    "legal_ops",
]

OpKind = Literal["mbconv", "identity"]

_NAME = re.compile(r"^mb(?P<kernel>\d+)_e(?P<expand>\d+)(?P<sc>_sc)?$")


def keeps_shape(in_ch: int, out_ch: int, stride: int) -> bool:
    """Whether a layer's output has its input's shape: where shortcuts and identity are legal."""
    return stride == 1 and in_ch == out_ch


@dataclass(frozen=True)
class OpSpec:
    """One candidate operation: an MBConv (``kernel`` x ``kernel`` depthwise, ``expand`` times
    wider in the middle, optional residual ``shortcut``) or the ``identity`` skip.

    Validates itself on construction; ``name`` (``mb5_e3_sc``, ``identity``) is the short form
    architectures are written with, and :meth:`parse` reads it back.
    """

    kind: OpKind
    kernel: int = 0
    expand: int = 0
    shortcut: bool = False

    def __post_init__(self) -> None:
        if self.kind == "identity":
            if (self.kernel, self.expand, self.shortcut) != (0, 0, False):
                raise ConfigError("an identity op takes no kernel, expand or shortcut: "
                                  "write OpSpec('identity')")
        elif self.kind == "mbconv":
            if not (isinstance(self.kernel, int) and self.kernel >= 1 and self.kernel % 2 == 1):
                raise ConfigError(f"MBConv kernel={self.kernel!r} must be an odd positive "
                                  "integer (3, 5, 7) so that padding keeps the size")
            if not (isinstance(self.expand, int) and self.expand >= 1):
                raise ConfigError(f"MBConv expand={self.expand!r} must be an integer >= 1")
        else:
            raise ConfigError(f"op kind {self.kind!r} is unknown; use 'mbconv' or 'identity'")

    @property
    def name(self) -> str:
        """Short readable name: ``mb3_e6_sc`` (kernel 3, expansion 6, shortcut), ``identity``."""
        if self.kind == "identity":
            return "identity"
        return f"mb{self.kernel}_e{self.expand}" + ("_sc" if self.shortcut else "")

    @property
    def is_identity(self) -> bool:
        return self.kind == "identity"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> OpSpec:
        """The op a short name stands for; inverse of :attr:`name`."""
        if name == "identity":
            return cls("identity")
        match = _NAME.match(name) if isinstance(name, str) else None
        if match is None:
            raise ConfigError(f"op name {name!r} is not 'identity' or 'mb<kernel>_e<expand>' "
                              "with an optional '_sc' (e.g. 'mb3_e6_sc', 'mb5_e3')")
        return cls("mbconv", int(match["kernel"]), int(match["expand"]), bool(match["sc"]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpSpec:
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"op {dict(data)!r} is not a valid OpSpec: {exc}; expected keys "
                              "kind, kernel, expand, shortcut") from None

    def legal_at(self, in_ch: int, out_ch: int, stride: int) -> str | None:
        """Why this op cannot sit at a layer of this shape, or None when it can."""
        if keeps_shape(in_ch, out_ch, stride):
            return None
        if self.is_identity:
            return "identity cannot change the shape"
        if self.shortcut:
            return "a shortcut needs stride 1 and equal input and output channels"
        return None

    def macs(self, in_ch: int, out_ch: int, stride: int, height: int, width: int) -> int:
        """Multiply-accumulates of one image through this op (what largest/smallest rank by)."""
        if self.is_identity:
            return 0
        hidden = in_ch * self.expand
        out_hw = _out_size(height, stride) * _out_size(width, stride)
        expand = in_ch * hidden * height * width if self.expand != 1 else 0
        return expand + hidden * self.kernel ** 2 * out_hw + hidden * out_ch * out_hw

    def build(self, in_ch: int, out_ch: int, stride: int) -> nn.Module:
        """The module for this op at a layer of this shape (see :func:`build_op`)."""
        return build_op(self, in_ch, out_ch, stride)


def _out_size(size: int, stride: int) -> int:
    return (size + stride - 1) // stride  # padding kernel // 2 with an odd kernel


# JMSNAS section IV-A: MBConv kernel 3/5/7 x expansion 3/6, each with or without shortcut, and
# identity: 13 candidates. Ordered from cheap to expensive, shortcut variant after plain.
JMSNAS_CANDIDATES: tuple[OpSpec, ...] = (
    OpSpec("identity"),
    *(OpSpec("mbconv", k, e, sc) for k in (3, 5, 7) for e in (3, 6) for sc in (False, True)),
)


def legal_ops(ops: Iterable[OpSpec], in_ch: int, out_ch: int, stride: int) -> tuple[OpSpec, ...]:
    """The ops of ``ops`` that a layer of this shape accepts, in their order."""
    return tuple(op for op in ops if op.legal_at(in_ch, out_ch, stride) is None)


def build_op(spec: OpSpec, in_ch: int, out_ch: int, stride: int) -> nn.Module:
    """An :class:`MBConv` or ``nn.Identity`` for ``spec``; an illegal op is a ConfigError."""
    reason = spec.legal_at(in_ch, out_ch, stride)
    if reason is not None:
        legal = legal_ops(JMSNAS_CANDIDATES, in_ch, out_ch, stride)
        raise ConfigError(f"op {spec.name} cannot map {in_ch} to {out_ch} channels with stride "
                          f"{stride}: {reason}; choose one of {[o.name for o in legal]}")
    if spec.is_identity:
        return nn.Identity()
    return MBConv(in_ch, out_ch, spec.kernel, spec.expand, stride, spec.shortcut)


class MBConv(nn.Module):
    """Mobile inverted bottleneck (MobileNetV2): 1x1 expand + BN + ReLU6, ``kernel`` x
    ``kernel`` depthwise (stride here) + BN + ReLU6, 1x1 project + BN, plus the input when
    ``shortcut``.

    Convolutions and batch-norms are flat attributes (``expand``, ``expand_bn``...) rather than
    nested Sequentials, so a captured LayerGraph names its layers ``layers.3.depthwise``, not
    ``layers.3.conv.1.0``. ``expand=1`` drops the expand convolution, as MobileNetV2 does.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel: int, expand: int, stride: int,
                 shortcut: bool) -> None:
        super().__init__()
        OpSpec("mbconv", kernel, expand, shortcut)  # validates kernel and expand
        if shortcut and not keeps_shape(in_ch, out_ch, stride):
            raise ConfigError(f"MBConv({in_ch}->{out_ch}, stride {stride}) cannot have a "
                              "shortcut: the residual add needs stride 1 and equal channels; "
                              "pass shortcut=False")
        if stride not in (1, 2):
            raise ConfigError(f"MBConv stride={stride!r} must be 1 or 2")
        hidden = in_ch * expand
        self.shortcut = shortcut
        self.expand: nn.Conv2d | None = None
        self.expand_bn: nn.BatchNorm2d | None = None
        if expand != 1:
            self.expand = nn.Conv2d(in_ch, hidden, 1, bias=False)
            self.expand_bn = nn.BatchNorm2d(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden,
                                   bias=False)
        self.depthwise_bn = nn.BatchNorm2d(hidden)
        self.project = nn.Conv2d(hidden, out_ch, 1, bias=False)
        self.project_bn = nn.BatchNorm2d(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if self.expand is not None and self.expand_bn is not None:
            y = F.relu6(self.expand_bn(self.expand(y)))
        y = F.relu6(self.depthwise_bn(self.depthwise(y)))
        y = self.project_bn(self.project(y))
        return x + y if self.shortcut else y
