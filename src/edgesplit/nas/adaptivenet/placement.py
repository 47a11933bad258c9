"""Beyond the paper: choose the subnet together with its edge-cloud split.

AdaptiveNet's latency is one device's. Here a subnet's latency is the best plan over an
edge, a link and a cloud, split at a block boundary: ``T(N', k) = sum edge(b_1..b_k) +
transfer(boundary k) + sum cloud(b_k+1..b_n)``, minimised over k for each candidate. Branch
costs come from the same estimators and the same cost table as every plan (each branch and
the side layers are captured once), so the search and the Plan of the chosen subnet agree. The
side layers (an attention mask's) run on the edge unless everything runs on the cloud; side
tensors a cloud branch reads cross the link with the boundary tensor.

:func:`plan_subnet` turns the winner into a validated :class:`~edgesplit.plan.Plan` through
``make_plan`` (the shared cost model), split where the search split it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from edgesplit.graph import LayerGraph, capture
from edgesplit.graph.capture import export_model
from edgesplit.hardware import serialize_ms
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet
from edgesplit.plan import Plan
from edgesplit.plan.assemble import one_way_latency_ms
from edgesplit.plan.cost import CostTable, EdgeCloudSetting
from edgesplit.plan.planners import make_plan

__all__ = ["JointLatency", "JointTable", "SplitChoice", "plan_subnet"]


class _Alone(nn.Module):
    """A graph module returning a tuple, as a module capture takes (one output: unwrapped)."""

    def __init__(self, gm: nn.Module) -> None:
        super().__init__()
        self.gm = gm

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out = tuple(self.gm(*tensors))
        return out[0] if len(out) == 1 else out


def _ms(module: nn.Module, tensors: tuple[torch.Tensor, ...], setting: EdgeCloudSetting,
        name: str) -> tuple[float, float]:
    costs = CostTable.build(capture(_Alone(module), tensors, name=name), setting)
    return sum(costs.edge_ms.values()), sum(costs.cloud_ms.values())


@dataclass(frozen=True)
class SplitChoice:
    """A subnet's best split: ``edge_blocks`` branches on the edge, and the predicted time."""

    edge_blocks: int
    edge_ms: float
    transfer_ms: float
    cloud_ms: float
    rtt_ms: float

    @property
    def total_ms(self) -> float:
        return self.edge_ms + self.transfer_ms + self.cloud_ms + self.rtt_ms


class JointLatency:
    """Predicted plan latency of every subnet of ``supernet`` in ``setting`` (batch of
    ``example_inputs``). ``predict(arch)`` is in seconds, like a block latency table's."""

    def __init__(self, supernet: ElasticSupernet, setting: EdgeCloudSetting,
                 example_inputs: Sequence[torch.Tensor]) -> None:
        self.supernet = supernet
        self.setting = setting
        inputs = tuple(example_inputs)
        with torch.no_grad():
            side = supernet.side_tensors(*inputs)
            starts = [inputs[0]]
            for name in supernet.space.original:
                starts.append(supernet.branch(name)(starts[-1], side))
        self.edge_ms: dict[str, float] = {}
        self.cloud_ms: dict[str, float] = {}
        self.reads: dict[str, tuple[str, ...]] = {}
        for branch in supernet.space.branches:
            block = supernet.branch(branch.name)
            tensors = tuple(starts[branch.start] if n == block.main else side[n]
                            for n in block.inputs)
            self.edge_ms[branch.name], self.cloud_ms[branch.name] = _ms(
                block.gm, tensors, setting, branch.name)
            self.reads[branch.name] = block.side_inputs
        self.side_edge_ms = 0.0
        if supernet.side.gm is not None:
            # priced inside a whole subnet, as the plan captures it (captured alone, the side
            # layers fuse differently)
            whole = capture(supernet.subnet(supernet.space.original), inputs, name="side")
            costs = CostTable.build(whole, setting)
            self.side_edge_ms = sum(costs.edge_ms[layer.name] for layer in whole.layers
                                    if layer.module_path.split(".")[0] == "side")
        link = setting.link
        raw = dict(zip(supernet.side.input_names, inputs, strict=True))
        # each tensor's link time plus its encode on the sender and decode on the receiver,
        # as the plan prices it (a raw float input is quantized to input_bits to cross)
        self.side_up_ms = {n: (link.transfer_ms(_raw_bytes(raw[n], setting.input_bits))
                               + self._codec(raw[n], raw=True)) if n in raw
                           else link.transfer_ms(_bytes(t)) + self._codec(t)
                           for n, t in side.items() if n != supernet.main_input}
        self.boundary_ms = [link.transfer_ms(_bytes(t)) + self._codec(t) for t in starts]
        self.input_ms = sum(link.transfer_ms(_raw_bytes(x, setting.input_bits))
                            + self._codec(x, raw=True) for x in inputs)
        self.result_down_ms = link.transfer_ms(_bytes(starts[-1]), direction="down") \
            + serialize_ms(setting.cloud, setting.edge, _bytes(starts[-1]))

    def _codec(self, x: torch.Tensor, raw: bool = False) -> float:
        """Encoding ``x`` on the edge and decoding it on the cloud (``raw``: a model input)."""
        quantized = raw and x.is_floating_point() and self.setting.input_bits <= 8
        return serialize_ms(self.setting.edge, self.setting.cloud, _bytes(x), quantized)

    def split(self, arch: Sequence[str]) -> SplitChoice:
        """The best cut of subnet ``arch`` (ties: more on the edge)."""
        arch = self.supernet.space.check(arch)
        best: SplitChoice | None = None
        for k in range(len(arch), -1, -1):
            choice = self.at(arch, k)
            if best is None or choice.total_ms < best.total_ms - 1e-12:
                best = choice
        assert best is not None
        return best

    def at(self, arch: Sequence[str], k: int) -> SplitChoice:
        """Subnet ``arch`` with its first ``k`` branches on the edge."""
        link, n = self.setting.link, len(arch)
        edge = sum(self.edge_ms[b] for b in arch[:k])
        cloud = sum(self.cloud_ms[b] for b in arch[k:])
        up = 0.0
        if k == 0:
            up = self.input_ms
        elif k < n:
            position = self.supernet.space.by_name[arch[k]].start
            needed = {t for b in arch[k:] for t in self.reads[b]}
            up = self.boundary_ms[position] + sum(self.side_up_ms[t] for t in needed)
            edge += self.side_edge_ms
        else:
            edge += self.side_edge_ms
            if self.setting.result_at == "cloud":
                up = self.boundary_ms[-1]
        down = self.result_down_ms if k < n and self.setting.result_at == "edge" else 0.0
        rtt = one_way_latency_ms(link, up > 0) + one_way_latency_ms(link, down > 0)
        return SplitChoice(k, edge, up + down, cloud, rtt)

    def predict(self, arch: Sequence[str]) -> float:
        """Seconds of the best plan of ``arch``."""
        return self.split(arch).total_ms / 1000.0

    def table(self) -> JointTable:
        """A block latency table the search can steer by (see :class:`JointTable`)."""
        space = self.supernet.space
        cut = self.split(space.original).edge_blocks  # a block boundary of the original

        def part(name: str) -> float:
            b = space.by_name[name]
            if b.end <= cut:
                return self.edge_ms[name]
            if b.start >= cut:
                return self.cloud_ms[name]
            return max(self.edge_ms[name], self.cloud_ms[name])

        parts = {b.name: part(b.name) for b in space.branches}
        fixed = self.at(space.original, cut).total_ms - sum(parts[n] for n in space.original)
        return JointTable(space, {n: ms / 1000 for n, ms in parts.items()}, max(fixed, 0) / 1000,
                          batch=1, model=str(self.supernet.meta.get("model", "")),
                          measurement={"kind": "joint", "cut_after_blocks": cut},
                          joint=self)


@dataclass(frozen=True)
class JointTable(BlockLatencyTable):
    """An additive table for steering NearbyInit / NearbyMutate, exact where it scores.

    Its entries price every branch on the side of the pretrained model's best cut (a branch
    spanning the cut at its slower side) plus that cut's transfer, which is exact for subnets
    keeping that cut; ``predict`` is the joint latency itself (each subnet at its own best
    cut, never more than the entries' sum for a subnet that does not span the cut)."""

    joint: JointLatency | None = field(default=None, compare=False, repr=False)

    def predict(self, arch: Sequence[str]) -> float:
        assert self.joint is not None
        return self.joint.predict(arch)


def _bytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def _raw_bytes(x: torch.Tensor, input_bits: int) -> int:
    """A raw model input's bytes on the wire, as ``plan.cost.wire_size`` prices it."""
    if x.is_floating_point() and input_bits < 32:
        return -(-x.numel() * input_bits // 8)
    return x.numel() * x.element_size()


def plan_subnet(supernet: ElasticSupernet, arch: Sequence[str], setting: EdgeCloudSetting,
                example_inputs: Sequence[torch.Tensor], *, edge_blocks: int,
                model_path: str | Path | None = None) -> tuple[LayerGraph, Plan]:
    """Capture subnet ``arch`` and plan it with its first ``edge_blocks`` branches (and, when
    that is more than none, the side layers) on the edge. With ``model_path`` the subnet is
    exported there first (``torch.export``) and the plan names that file, so `edgesplit
    serve` can run it."""
    arch = supernet.space.check(arch)
    subnet, example = supernet.subnet(arch).eval(), tuple(example_inputs)
    if model_path is not None:
        torch.export.save(export_model(subnet, example, name="subnet"), str(model_path))
        graph = capture(str(model_path))
    else:
        graph = capture(subnet, example, name="subnet")
    edge = set()
    for layer in graph.layers:
        top = layer.module_path.split(".")
        on_edge = edge_blocks > 0 and (top[0] == "side" or (top[0] == "blocks"
                                                           and int(top[1]) < edge_blocks))
        if on_edge:
            edge.add(layer.name)
    costs = CostTable.build(graph, setting)
    edge_set = frozenset(graph.ancestors_closure(edge)) if edge else frozenset()
    source = str(model_path) if model_path is not None else "subnet"
    return graph, make_plan(costs, edge_set, method="adaptivenet", source=source)
