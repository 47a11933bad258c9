"""Post-training quantization of an edge part, executed as fake-quant in PyTorch, and the
per-layer distortion tables AUTO-SPLIT allocates bits with (section 3.1: D_i^w, D_i^a).

Weights: asymmetric uniform quantization per output channel. Activations: asymmetric per
tensor, with ranges calibrated on sample inputs. Fake-quant rounds values to the grid and maps
them back to float, so running the program shows the exact numerical effect of the bit-widths;
the cloud part stays at full precision.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule

from edgesplit.errors import ConfigError
from edgesplit.graph import LayerGraph
from edgesplit.graph.partition import record_tensors

__all__ = [
    "DEFAULT_BITS",
    "Calibration",
    "DistortionTable",
    "QuantizableProgram",
    "calibrate",
    "distortion_table",
    "fake_quant_program",
    "fake_quantize",
    "graph_program",
    "quantize_weight",
    "set_tensor_attr",
]

DEFAULT_BITS = (2, 4, 6, 8, 16)


def fake_quantize(x: torch.Tensor, bits: int, lo: torch.Tensor | float,
                  hi: torch.Tensor | float) -> torch.Tensor:
    """Round ``x`` to the 2^bits-level grid spanning [lo, hi] and back to float (>= 16 bits:
    float16 rounding, 32: unchanged)."""
    if bits >= 32:
        return x
    if bits == 16:
        return x.half().to(x.dtype)
    levels = (1 << bits) - 1
    lo_t = torch.as_tensor(lo, dtype=x.dtype)
    hi_t = torch.as_tensor(hi, dtype=x.dtype)
    scale = torch.clamp((hi_t - lo_t) / levels, min=torch.finfo(x.dtype).tiny)
    # one temporary, updated in place: this runs on every activation of every candidate
    q = (x - lo_t).div_(scale).round_().clamp_(0, levels)
    return q.mul_(scale).add_(lo_t)


def quantize_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-output-channel asymmetric fake-quant of a weight (dim 0 is the output channel)."""
    if bits >= 16 or w.dim() == 0:
        return fake_quantize(w, bits, 0.0, 0.0) if bits == 16 else w
    flat = w.reshape(w.shape[0], -1)
    shape = (-1,) + (1,) * (w.dim() - 1)
    lo = flat.min(dim=1).values.reshape(shape)
    hi = flat.max(dim=1).values.reshape(shape)
    return fake_quantize(w, bits, lo, hi)


@dataclass
class Calibration:
    """Observed range of every tensor of a LayerGraph over sample inputs."""

    ranges: dict[str, tuple[float, float]]
    samples: dict[str, list[torch.Tensor]] = field(default_factory=dict, repr=False)


def calibrate(graph: LayerGraph, inputs: Iterable[Sequence[torch.Tensor]], *,
              keep_samples: bool = True) -> Calibration:
    """Run ``graph``'s program on each batch of ``inputs`` and record every tensor's range
    (and, for distortion tables, the tensors themselves)."""
    ranges: dict[str, tuple[float, float]] = {}
    samples: dict[str, list[torch.Tensor]] = {}
    count = 0
    for batch in inputs:
        count += 1
        values = record_tensors(graph, *batch)
        for name, value in values.items():
            if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
                continue
            lo, hi = float(value.min()), float(value.max())
            old = ranges.get(name)
            ranges[name] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
            if keep_samples:
                samples.setdefault(name, []).append(value.detach())
    if count == 0:
        raise ConfigError("calibration needs at least one batch of sample inputs")
    return Calibration(ranges, samples)


def set_tensor_attr(module: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    """Replace the parameter or buffer at dotted ``target`` with ``value`` (frozen)."""
    owner_path, _, leaf = target.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if leaf in owner._parameters:
        owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value


def graph_program(graph: LayerGraph) -> GraphModule:
    """``graph.program``, which quantization needs (a graph loaded without one has none)."""
    if graph.program is None:
        raise ConfigError("the LayerGraph has no program to quantize")
    return graph.program


def fake_quant_program(graph: LayerGraph, bits: Mapping[str, tuple[int, int]],
                       calibration: Calibration) -> GraphModule:
    """A copy of ``graph.program`` where each layer named in ``bits`` (``(w_bits, a_bits)``)
    has fake-quantized weights and fake-quantized outputs; other layers stay float."""
    program = graph_program(graph)
    with warnings.catch_warnings():  # torch's own deprecation noise from copying the spec
        warnings.simplefilter("ignore", FutureWarning)
        program = copy.deepcopy(program)
    nodes = {n.name: n for n in program.graph.nodes}
    for name, (w_bits, a_bits) in bits.items():
        layer = graph.layer(name)
        for target in layer.param_names:
            owner: Any = program
            for part in target.split("."):
                owner = getattr(owner, part)
            if owner.is_floating_point() and owner.dim() >= 2:  # weights, not biases or masks
                set_tensor_attr(program, target, quantize_weight(owner.detach(), w_bits))
        if a_bits >= 32:
            continue
        for tensor in layer.outputs:
            if tensor not in calibration.ranges:
                continue
            lo, hi = calibration.ranges[tensor]
            node = nodes[tensor]
            with program.graph.inserting_after(node):
                quantized = program.graph.call_function(fake_quantize, (node, a_bits, lo, hi))
            node.replace_all_uses_with(quantized, delete_user_cb=lambda u, q=quantized: u is not q)
    program.graph.lint()
    program.recompile()
    return program


@dataclass
class DistortionTable:
    """Mean squared error per layer and bit-width: ``weight[layer][bits]`` over its weights,
    ``activation[layer][bits]`` over its calibrated outputs (AUTO-SPLIT D_i^w, D_i^a)."""

    bits: tuple[int, ...]
    weight: dict[str, dict[int, float]]
    activation: dict[str, dict[int, float]]


def _mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.mean((a.float() - b.float()) ** 2))


def distortion_table(graph: LayerGraph, calibration: Calibration,
                     bits: Sequence[int] = DEFAULT_BITS) -> DistortionTable:
    """D_i^w and D_i^a for every layer and bit-width (computed once; reuse the table)."""
    program = graph_program(graph)
    attrs = {**dict(program.named_parameters()), **dict(program.named_buffers())}
    weight: dict[str, dict[int, float]] = {}
    activation: dict[str, dict[int, float]] = {}
    for layer in graph.layers:
        ws = [attrs[p].detach() for p in layer.param_names
              if p in attrs and attrs[p].is_floating_point() and attrs[p].dim() >= 2]
        weight[layer.name] = {b: (sum(_mse(w, quantize_weight(w, b)) * w.numel() for w in ws)
                                  / max(1, sum(w.numel() for w in ws))) for b in bits}
        outs = [(t, calibration.samples.get(t, [])) for t in layer.outputs]
        activation[layer.name] = {}
        for b in bits:
            errs, n = 0.0, 0
            for tensor, values in outs:
                if tensor not in calibration.ranges:
                    continue
                lo, hi = calibration.ranges[tensor]
                for v in values:
                    errs += _mse(v, fake_quantize(v, b, lo, hi)) * v.numel()
                    n += v.numel()
            activation[layer.name][b] = errs / n if n else 0.0
    return DistortionTable(tuple(bits), weight, activation)


class _FakeQuantOutput(torch.nn.Module):
    """Fake-quant of one tensor at a switchable width (32: pass through)."""

    def __init__(self, lo: float, hi: float) -> None:
        super().__init__()
        self.lo, self.hi, self.bits = lo, hi, 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.bits >= 32 else fake_quantize(x, self.bits, self.lo, self.hi)


class QuantizableProgram:
    """One copy of the program whose layers' bit-widths can be switched without copying again:
    the same numbers as :func:`fake_quant_program` for the same ``bits``, at the cost of a
    forward pass per configuration (quantized weights are computed once per width)."""

    def __init__(self, graph: LayerGraph, calibration: Calibration) -> None:
        program = graph_program(graph)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self.program = copy.deepcopy(program)
        self.graph = graph
        self._outputs: dict[str, list[_FakeQuantOutput]] = {}
        self._weights: dict[str, list[str]] = {}
        self._float: dict[str, torch.Tensor] = {}
        self._cache: dict[tuple[str, int], torch.Tensor] = {}
        self._insert_observers(calibration)

    def _insert_observers(self, calibration: Calibration) -> None:
        nodes = {n.name: n for n in self.program.graph.nodes}
        for layer in self.graph.layers:
            self._weights[layer.name] = [t for t in layer.param_names if self._is_weight(t)]
            mods = []
            for tensor in layer.outputs:
                if tensor not in calibration.ranges:
                    continue
                mod = _FakeQuantOutput(*calibration.ranges[tensor])
                name = f"_es_fq_{tensor}"
                self.program.add_submodule(name, mod)
                node = nodes[tensor]
                with self.program.graph.inserting_after(node):
                    quantized = self.program.graph.call_module(name, (node,))
                node.replace_all_uses_with(quantized,
                                           delete_user_cb=lambda u, q=quantized: u is not q)
                mods.append(mod)
            self._outputs[layer.name] = mods
        self.program.graph.lint()
        self.program.recompile()

    def _is_weight(self, target: str) -> bool:
        value = self._get(target)
        if value.is_floating_point() and value.dim() >= 2:  # weights, not biases or masks
            self._float[target] = value.detach()
            return True
        return False

    def _get(self, target: str) -> torch.Tensor:
        owner: Any = self.program
        for part in target.split("."):
            owner = getattr(owner, part)
        return owner

    def configure(self, bits: Mapping[str, tuple[int, int]]) -> torch.nn.Module:
        """Set every layer to its ``(w_bits, a_bits)`` (layers not named: float)."""
        for layer, mods in self._outputs.items():
            w_bits, a_bits = bits.get(layer, (32, 32))
            for mod in mods:
                mod.bits = a_bits
            for target in self._weights[layer]:
                if w_bits >= 32:
                    value = self._float[target]
                else:
                    key = (target, w_bits)
                    if key not in self._cache:
                        self._cache[key] = quantize_weight(self._float[target], w_bits)
                    value = self._cache[key]
                set_tensor_attr(self.program, target, value)
        return self.program
