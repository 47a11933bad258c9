"""What edgesplit knows about individual ATen operators: a short name, a fusion category, and
the multiply-accumulate (MAC) and FLOP count of one call given its argument and result shapes.

Counting conventions (the ones behind the published figures such as ResNet-50's 4.1 GMACs):
MACs are counted only for multiply-accumulate operators (convolutions, linear layers, matrix
products, attention); FLOPs are 2 per MAC, plus one per output element for element-wise
operators (a few for transcendental ones), the kernel area per output for pooling, and a small
per-element constant for normalisations and softmax.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

import torch
from torch.fx import Node

__all__ = ["OpCategory", "OpCost", "op_category", "op_class", "op_cost", "op_name", "tensor_meta"]


class OpCategory(str, Enum):
    """How an operator takes part in layer fusion."""

    VIEW = "view"  # no arithmetic: reshapes, slicing, aliasing, eval-mode dropout
    ELEMENTWISE = "elementwise"  # fusable into the producer's kernel (activations, scalar math)
    BATCHNORM = "batchnorm"  # folded into a preceding conv/linear by the optimiser
    PAD = "pad"  # folded into the following convolution's padding
    COMPUTE = "compute"  # everything an engine runs as its own kernel


# Short, stable names for JSON and tables; everything else uses the ATen packet name.
_ALIASES = {
    "_native_batch_norm_legit_no_training": "batch_norm",
    "_native_batch_norm_legit": "batch_norm",
    "native_batch_norm": "batch_norm",
    "native_layer_norm": "layer_norm",
    "scaled_dot_product_attention": "sdpa",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
    "_unsafe_view": "view",
    "constant_pad_nd": "pad",
    "getitem": "getitem",
    "_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "max_pool2d_with_indices": "max_pool2d",
}

_VIEW = {
    "view", "reshape", "_unsafe_view", "flatten", "unflatten", "permute", "transpose", "t",
    "unsqueeze", "squeeze", "expand", "contiguous", "clone", "alias", "detach", "dropout",
    "getitem", "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "lift_fresh_copy", "feature_dropout", "alpha_dropout", "identity",
}
_BATCHNORM = {"batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm"}
_PAD = {"constant_pad_nd", "pad"}
_ELEMENTWISE = {
    "relu", "relu6", "hardtanh", "clamp", "clamp_min", "clamp_max", "gelu", "silu", "sigmoid",
    "tanh", "hardswish", "hardsigmoid", "leaky_relu", "elu", "selu", "celu", "mish", "softplus",
    "prelu", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "pow", "erf", "sin", "cos",
    "add", "sub", "rsub", "mul", "div", "where", "masked_fill", "to", "_to_copy", "type_as",
    "bitwise_not", "logical_not", "eq", "ne", "lt", "le", "gt", "ge", "__and__", "__or__",
}
# FLOPs per output element for element-wise operators that cost more than one.
_ELEMENTWISE_FLOPS = {"gelu": 8, "silu": 4, "sigmoid": 4, "tanh": 4, "hardswish": 3,
                      "hardsigmoid": 2, "mish": 6, "softplus": 4, "erf": 4, "exp": 2,
                      "elu": 3, "selu": 3, "celu": 3}
_NORM_FLOPS = {"layer_norm": 5, "group_norm": 5, "batch_norm": 2, "softmax": 5,
               "log_softmax": 5, "instance_norm": 5, "rms_norm": 4}


def _packet_name(node: Node) -> str:
    target = node.target
    if target is operator.getitem:
        return "getitem"
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(target, "__name__", str(target))


def op_name(node: Node) -> str:
    """Short operator name of an FX ``call_function`` node (``conv2d``, ``add``, ``sdpa``...)."""
    raw = _packet_name(node)
    name = raw.rstrip("_") if raw.endswith("_") and not raw.startswith("_") else raw
    return _ALIASES.get(name, name)


def op_category(node: Node) -> OpCategory:
    """The fusion category of an FX ``call_function`` node."""
    raw = _packet_name(node)
    if raw in _BATCHNORM:
        return OpCategory.BATCHNORM
    if raw in _PAD:
        return OpCategory.PAD
    name = op_name(node)
    if name in _VIEW:
        return OpCategory.VIEW
    if name in _ELEMENTWISE:
        return OpCategory.ELEMENTWISE
    return OpCategory.COMPUTE


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def tensor_meta(value: Any) -> TensorMeta | None:
    """Shape and dtype of a traced value (a FakeTensor in ``node.meta['val']``), else None."""
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(int(s) for s in value.shape), value.dtype)
    return None


def _arg_meta(arg: Any) -> TensorMeta | None:
    if isinstance(arg, Node):
        return tensor_meta(arg.meta.get("val"))
    return tensor_meta(arg)


@dataclass(frozen=True)
class OpCost:
    macs: int
    flops: int


def _out_numel(node: Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return sum(m.numel for m in map(tensor_meta, val) if m is not None)
    meta = tensor_meta(val)
    return meta.numel if meta is not None else 0


def _conv_macs(node: Node) -> int:
    weight = _arg_meta(node.args[1])
    if weight is None:
        return 0
    transposed = op_name(node).startswith("conv_transpose") or (
        op_name(node) in {"convolution", "_convolution"} and bool(node.args[6])
    )
    if transposed:  # each input element scatters into C_out/groups x kernel outputs
        inp = _arg_meta(node.args[0])
        return inp.numel * math.prod(weight.shape[1:]) if inp else 0
    return _out_numel(node) * math.prod(weight.shape[1:])


def _linear_macs(node: Node) -> int:
    weight = _arg_meta(node.args[1])
    return _out_numel(node) * weight.shape[-1] if weight else 0


def _mm_macs(node: Node) -> int:
    # addmm/baddbmm carry the bias first; the reduction dim is the last of the left operand.
    left = node.args[1] if op_name(node) in {"addmm", "baddbmm", "addbmm"} else node.args[0]
    meta = _arg_meta(left)
    if meta is None or not meta.shape:
        return 0
    return _out_numel(node) * meta.shape[-1]


def _sdpa_macs(node: Node) -> int:
    q, k, v = (_arg_meta(a) for a in node.args[:3])
    if q is None or k is None or v is None:
        return 0
    batch = math.prod(q.shape[:-2])
    return batch * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])


def _einsum_macs(node: Node) -> int:
    equation = str(node.args[0]).replace(" ", "")
    if not isinstance(node.args[1], (list, tuple)):
        return 0
    operands = [_arg_meta(a) for a in node.args[1]]
    terms = equation.split("->")[0].split(",")
    if len(terms) != len(operands):
        return 0  # not an equation we can read: count no MACs rather than a truncated product
    sizes: dict[str, int] = {}
    for letters, meta in zip(terms, operands, strict=True):
        if meta is None or "." in letters or len(letters) != len(meta.shape):
            return 0
        sizes.update(zip(letters, meta.shape, strict=True))
    return math.prod(sizes.values())


_MAC_RULES: dict[str, Callable[[Node], int]] = {
    **dict.fromkeys(["conv1d", "conv2d", "conv3d", "convolution", "_convolution",
                     "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"], _conv_macs),
    "linear": _linear_macs,
    **dict.fromkeys(["mm", "addmm", "bmm", "baddbmm", "matmul", "addbmm"], _mm_macs),
    "sdpa": _sdpa_macs,
    "einsum": _einsum_macs,
}


def _pool_flops(node: Node) -> int:
    name = op_name(node)
    if name.startswith("adaptive") or name in {"mean", "sum", "amax", "amin"}:
        inp = _arg_meta(node.args[0])
        return inp.numel if inp else 0
    kernel = node.args[1] if len(node.args) > 1 else 1
    area = (math.prod(kernel) if isinstance(kernel, (list, tuple))
            else int(cast("int", kernel)) ** 2)  # an int (or SymInt) kernel size
    return _out_numel(node) * area


def op_cost(node: Node) -> OpCost:
    """MACs and FLOPs of one call of the operator at ``node`` (0 for view operators)."""
    if node.op != "call_function":
        return OpCost(0, 0)
    name = op_name(node)
    category = op_category(node)
    if category is OpCategory.VIEW:
        return OpCost(0, 0)
    rule = _MAC_RULES.get(name)
    if rule is not None:
        macs = rule(node)
        bias = len(node.args) > 2 and isinstance(node.args[2], Node) and name != "sdpa"
        return OpCost(macs, 2 * macs + (_out_numel(node) if bias else 0))
    out = _out_numel(node)
    if name in _NORM_FLOPS:
        return OpCost(0, _NORM_FLOPS[name] * out)
    if "pool" in name or name in {"mean", "sum", "amax", "amin"}:
        return OpCost(0, _pool_flops(node))
    if category is OpCategory.ELEMENTWISE:
        return OpCost(0, _ELEMENTWISE_FLOPS.get(name, 1) * out)
    return OpCost(0, out if category is not OpCategory.PAD else 0)


_CLASS_BY_NAME = {
    **dict.fromkeys(["linear", "mm", "addmm", "bmm", "baddbmm", "matmul", "addbmm", "einsum"],
                    "matmul"),
    "sdpa": "attention",
    **dict.fromkeys(["layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm",
                     "softmax", "log_softmax"], "norm"),
    **dict.fromkeys(["embedding", "gather", "index", "index_select"], "embedding"),
    **dict.fromkeys(["mean", "sum", "amax", "amin"], "pool"),
}


def op_class(node: Node) -> str:
    """The coarse class latency models distinguish: ``conv``, ``dwconv``, ``matmul``,
    ``attention``, ``pool``, ``norm``, ``elementwise``, ``embedding``, ``view`` or ``other``."""
    name = op_name(node)
    if name in _MAC_RULES and name.startswith(("conv", "_conv")):
        weight = _arg_meta(node.args[1])
        inp = _arg_meta(node.args[0])
        # depthwise: one input channel per group (weight dim 1 == 1) and groups == C_in > 1
        if weight is not None and inp is not None and weight.shape[1] == 1 and inp.shape[1] > 1:
            return "dwconv"
        return "conv"
    if name in _CLASS_BY_NAME:
        return _CLASS_BY_NAME[name]
    if "pool" in name:
        return "pool"
    category = op_category(node)
    if category is OpCategory.VIEW:
        return "view"
    if category in (OpCategory.ELEMENTWISE, OpCategory.BATCHNORM, OpCategory.PAD):
        return "elementwise" if category is not OpCategory.BATCHNORM else "norm"
    return "other"
