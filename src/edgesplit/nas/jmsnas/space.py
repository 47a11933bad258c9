"""A search space as data (:class:`SearchSpace`) and an architecture in it (:class:`Arch`).

A space is a fixed chain: stem conv -> N searchable layers -> head (1x1 conv, pooling,
linear). Each searchable layer fixes its output channels and stride and lists the candidate
ops it allows; an architecture picks one op per layer. Both are frozen, validate themselves,
and round-trip through plain dicts / JSON so that a searched network can be saved and rebuilt
without the code that searched it.

Validation follows the op rules of :mod:`edgesplit.nas.core.ops`: a layer that changes the shape may
not allow identity or a shortcut op. :meth:`SearchSpace.from_stages` builds a MobileNetV2-style
space and applies those rules for you.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from edgesplit.errors import ConfigError
from edgesplit.nas.core.ops import JMSNAS_CANDIDATES, OpSpec, keeps_shape, legal_ops

if TYPE_CHECKING:
    from edgesplit.nas.jmsnas.sampler import SpaceBreeder

__all__ = [
    "Arch",
    "FixedArch",
    "HeadSpec",
    "LayerSpec",
    "SearchSpace",
    "StemSpec",
    "fixed_arch",
]

FixedArch = Literal["largest", "smallest", "mobilenetv2"]


def _positive(what: str, value: Any) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"{what}={value!r} must be a positive integer")


def _stride(what: str, value: Any) -> None:
    if value not in (1, 2) or isinstance(value, bool):
        raise ConfigError(f"{what}={value!r} must be 1 or 2")


@dataclass(frozen=True)
class StemSpec:
    """The fixed first convolution: ``kernel`` x ``kernel``, stride ``stride``, + BN + ReLU6."""

    out_channels: int
    kernel: int = 3
    stride: int = 1

    def __post_init__(self) -> None:
        _positive("stem out_channels", self.out_channels)
        _positive("stem kernel", self.kernel)
        if self.kernel % 2 == 0:
            raise ConfigError(f"stem kernel={self.kernel} must be odd so padding keeps the size")
        _stride("stem stride", self.stride)


@dataclass(frozen=True)
class HeadSpec:
    """The fixed classifier: a 1x1 conv to ``channels`` + BN + ReLU6 (none when 0), global
    average pooling, and a linear layer to the space's classes."""

    channels: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.channels, int) and self.channels >= 0):
            raise ConfigError(f"head channels={self.channels!r} must be an integer >= 0 "
                              "(0: no 1x1 conv before pooling)")


@dataclass(frozen=True)
class LayerSpec:
    """One searchable layer: its output channels, its stride, and the ops it allows."""

    out_channels: int
    stride: int
    ops: tuple[OpSpec, ...]

    def __post_init__(self) -> None:
        _positive("layer out_channels", self.out_channels)
        _stride("layer stride", self.stride)
        object.__setattr__(self, "ops", tuple(self.ops))
        if not self.ops:
            raise ConfigError("a searchable layer must allow at least one op")
        names = [op.name for op in self.ops]
        if len(set(names)) != len(names):
            raise ConfigError(f"a searchable layer lists an op twice: {names}")

    @property
    def op_names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops)


@dataclass(frozen=True)
class SearchSpace:
    """Input shape (C, H, W), classes, stem, searchable layers and head of a chain network.

    Construction checks every layer's ops against the shape it sees (identity and shortcut
    only where the layer keeps the shape) and that the image does not shrink below 1x1.
    """

    name: str
    input_shape: tuple[int, int, int]
    num_classes: int
    stem: StemSpec
    layers: tuple[LayerSpec, ...]
    head: HeadSpec = field(default_factory=HeadSpec)

    def for_data(self, sample_shape: tuple[int, ...], num_classes: int) -> SearchSpace:
        """This space for data of ``sample_shape`` (C, H, W) and ``num_classes`` classes: the
        same stem, layers and head taking that input and predicting that many classes (named
        ``<name>@CxHxW/K``), or this space itself when it already does. A network is built for
        the data as it is; nothing converts the data to fit the space."""
        shape = tuple(int(d) for d in sample_shape)
        if len(shape) != 3:
            raise ConfigError(f"space {self.name!r} takes images (channels, height, width); "
                              f"the data's samples are {shape}")
        if shape == self.input_shape and num_classes == self.num_classes:
            return self
        c, h, w = shape
        return replace(self, name=f"{self.name}@{c}x{h}x{w}/{num_classes}",
                       input_shape=(c, h, w), num_classes=num_classes)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))
        object.__setattr__(self, "layers", tuple(self.layers))
        if len(self.input_shape) != 3:
            raise ConfigError(f"space {self.name!r}: input_shape={self.input_shape!r} must be "
                              "(channels, height, width)")
        for what, value in zip(("channels", "height", "width"), self.input_shape, strict=True):
            _positive(f"space {self.name!r} input {what}", value)
        _positive(f"space {self.name!r} num_classes", self.num_classes)
        if not self.layers:
            raise ConfigError(f"space {self.name!r} has no searchable layers")
        for i, layer in enumerate(self.layers):
            in_ch = self.in_channels(i)
            for op in layer.ops:
                reason = op.legal_at(in_ch, layer.out_channels, layer.stride)
                if reason is not None:
                    legal = legal_ops(layer.ops, in_ch, layer.out_channels, layer.stride)
                    raise ConfigError(
                        f"space {self.name!r} layer {i} ({self._describe(i)}) allows "
                        f"{op.name}, but {reason}; allow only {[o.name for o in legal]} "
                        "(SearchSpace.from_stages filters the candidates for you)")

    # -- shapes ------------------------------------------------------------------------------

    def in_channels(self, index: int) -> int:
        """Channels entering searchable layer ``index``."""
        return self.stem.out_channels if index == 0 else self.layers[index - 1].out_channels

    def in_size(self, index: int) -> tuple[int, int]:
        """(height, width) entering searchable layer ``index``."""
        h, w = self.input_shape[1:]
        for stride in [self.stem.stride] + [l.stride for l in self.layers[:index]]:
            h, w = (h + stride - 1) // stride, (w + stride - 1) // stride
        return h, w

    @property
    def out_channels(self) -> int:
        """Channels leaving the last searchable layer (entering the head)."""
        return self.layers[-1].out_channels

    def skippable(self, index: int) -> bool:
        """Whether layer ``index`` keeps the shape (identity and shortcuts may sit there)."""
        layer = self.layers[index]
        return keeps_shape(self.in_channels(index), layer.out_channels, layer.stride)

    def _describe(self, index: int) -> str:
        layer = self.layers[index]
        return f"{self.in_channels(index)}->{layer.out_channels} ch, stride {layer.stride}"

    @property
    def size(self) -> int:
        """Number of architectures in the space."""
        total = 1
        for layer in self.layers:
            total *= len(layer.ops)
        return total

    # -- architectures -----------------------------------------------------------------------

    def validate(self, arch: Arch) -> Arch:
        """``arch`` if it fits this space; else a ConfigError naming the layer and allowed ops."""
        if len(arch.ops) != len(self.layers):
            raise ConfigError(f"architecture has {len(arch.ops)} ops but space {self.name!r} has "
                              f"{len(self.layers)} searchable layers: give one op per layer")
        for i, (op, layer) in enumerate(zip(arch.ops, self.layers, strict=True)):
            if op not in layer.ops:
                raise ConfigError(f"layer {i} of space {self.name!r} ({self._describe(i)}) "
                                  f"does not allow {op.name}; allowed: {', '.join(layer.op_names)}")
        return arch

    def op_index(self, layer: int, op: OpSpec) -> int:
        """Position of ``op`` among layer ``layer``'s allowed ops (its supernet path)."""
        try:
            return self.layers[layer].ops.index(op)
        except ValueError:
            raise ConfigError(f"layer {layer} of space {self.name!r} does not allow {op.name}; "
                              f"allowed: {', '.join(self.layers[layer].op_names)}") from None

    def arch_from_indices(self, indices: Sequence[int]) -> Arch:
        """The architecture choosing ``layers[i].ops[indices[i]]`` at each layer."""
        if len(indices) != len(self.layers):
            raise ConfigError(f"got {len(indices)} op indices for {len(self.layers)} layers")
        return Arch(tuple(l.ops[int(j)] for l, j in zip(self.layers, indices, strict=True)))

    def arch_indices(self, arch: Arch) -> tuple[int, ...]:
        """Inverse of :meth:`arch_from_indices`."""
        return tuple(self.op_index(i, op) for i, op in enumerate(self.validate(arch).ops))

    def fixed_arch(self, kind: FixedArch) -> Arch:
        """A reference architecture: see :func:`fixed_arch`."""
        return fixed_arch(self, kind)

    def breeder(self) -> SpaceBreeder:
        """What an evolutionary search breeds this space with (:mod:`.sampler`)."""
        from edgesplit.nas.jmsnas.sampler import SpaceBreeder

        return SpaceBreeder(self)

    # -- serialisation -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict; ops are written by their short names."""
        return {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "stem": {"out_channels": self.stem.out_channels, "kernel": self.stem.kernel,
                     "stride": self.stem.stride},
            "layers": [{"out_channels": l.out_channels, "stride": l.stride,
                        "ops": list(l.op_names)} for l in self.layers],
            "head": {"channels": self.head.channels},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """Inverse of :meth:`to_dict`; malformed data is a ConfigError."""
        try:
            layers = tuple(LayerSpec(l["out_channels"], l["stride"],
                                     tuple(OpSpec.parse(n) for n in l["ops"]))
                           for l in data["layers"])
            return cls(data["name"], tuple(data["input_shape"]), data["num_classes"],
                       StemSpec(**data["stem"]), layers, HeadSpec(**data.get("head", {})))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"search space data is malformed ({type(exc).__name__}: {exc}); "
                              "write it with SearchSpace.to_dict") from None

    @classmethod
    def from_stages(cls, name: str, input_shape: tuple[int, int, int], num_classes: int, *,
                    stem: StemSpec, stages: Sequence[tuple[int, int, int]],
                    head: HeadSpec | None = None,
                    candidates: Sequence[OpSpec] = JMSNAS_CANDIDATES) -> SearchSpace:
        """A MobileNetV2-style space: ``stages`` lists (out_channels, layers, stride); the stride
        applies to a stage's first layer. Each layer allows the ``candidates`` legal at its
        shape, so a stage's first layer loses identity and shortcuts where it changes shape."""
        layers: list[LayerSpec] = []
        in_ch = stem.out_channels
        for out_ch, count, stride in stages:
            _positive("stage layer count", count)
            for j in range(count):
                s = stride if j == 0 else 1
                layers.append(LayerSpec(out_ch, s, legal_ops(candidates, in_ch, out_ch, s)))
                in_ch = out_ch
        return cls(name, input_shape, num_classes, stem, tuple(layers), head or HeadSpec())


@dataclass(frozen=True)
class Arch:
    """One op per searchable layer. Hashable, so a search can cache scores by architecture.

    Independent of any space (so mutation and crossover are plain tuple work); check it
    against one with :meth:`SearchSpace.validate`.
    """

    ops: tuple[OpSpec, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        if not all(isinstance(op, OpSpec) for op in self.ops):
            raise ConfigError("Arch ops must be OpSpec values; build one from names with "
                              "Arch.from_names([...])")

    @classmethod
    def from_names(cls, names: Sequence[str]) -> Arch:
        if isinstance(names, str):
            raise ConfigError("Arch.from_names takes a list of op names, not one string")
        return cls(tuple(OpSpec.parse(n) for n in names))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops)

    @property
    def depth(self) -> int:
        """Layers that compute something (identity layers skipped)."""
        return sum(not op.is_identity for op in self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __str__(self) -> str:
        return " ".join(self.names)

    def to_dict(self) -> dict[str, Any]:
        return {"ops": list(self.names)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Arch:
        if not isinstance(data, Mapping) or not isinstance(data.get("ops"), list):
            raise ConfigError(f"architecture data {data!r} must be {{'ops': [op names...]}}")
        return cls.from_names(data["ops"])

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Arch:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"architecture JSON is malformed: {exc}") from None
        return cls.from_dict(data)


def fixed_arch(space: SearchSpace, kind: FixedArch) -> Arch:
    """A reference architecture of ``space``.

    ``largest``/``smallest``: the op with the most/fewest multiply-accumulates at each layer
    (ties: a shortcut beats none for largest, loses for smallest); ``mobilenetv2``: the
    MobileNetV2 baseline, ``mb3_e6`` with its shortcut wherever the layer keeps the shape.
    """
    if kind not in get_args(FixedArch):
        raise ConfigError(f"fixed architecture {kind!r} is unknown; choose one of "
                          f"{', '.join(get_args(FixedArch))}")
    if kind == "mobilenetv2":
        return space.validate(Arch(tuple(
            OpSpec("mbconv", 3, 6, space.skippable(i)) for i in range(len(space.layers)))))
    sign = 1 if kind == "largest" else -1
    ops = []
    for i, layer in enumerate(space.layers):
        shape = (space.in_channels(i), layer.out_channels, layer.stride, *space.in_size(i))

        def size(op: OpSpec, shape: tuple[int, ...] = shape) -> tuple[int, int]:
            return sign * op.macs(*shape), sign * op.shortcut

        ops.append(max(layer.ops, key=size))
    return Arch(tuple(ops))
