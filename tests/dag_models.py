"""Small DAG models for property tests: random graphs of convolutions, skip adds and
concatenations, with several consumers per tensor and several outputs; and the hand-computed
inverted-residual block of tests/graph/test_cuts_memory.py (conftest's ``block_graph``)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

C = 4  # channels everywhere, so any two tensors can be added or concatenated


class SpecDAG(nn.Module):
    """``spec`` is a list of (op, a, b): node i reads earlier nodes a and b (node 0 is the
    input). Ops: conv (3x3 + relu on a), add (a + b), cat (concat a, b then 1x1 conv back to C).
    Every node nobody reads is a model output."""

    def __init__(self, spec: list[tuple[str, int, int]], bn: bool = False) -> None:
        super().__init__()
        self.spec = spec
        self.convs = nn.ModuleDict()
        for i, (op, _, _) in enumerate(spec, start=1):
            if op == "conv":
                layers = [nn.Conv2d(C, C, 3, padding=1, bias=not bn)]
                layers += [nn.BatchNorm2d(C)] if bn else []
                self.convs[str(i)] = nn.Sequential(*layers, nn.ReLU())
            elif op == "cat":
                self.convs[str(i)] = nn.Conv2d(2 * C, C, 1)
        read = {a for _, a, _ in spec} | {b for op, _, b in spec if op != "conv"}
        self.outputs = [i for i in range(1, len(spec) + 1) if i not in read] or [len(spec)]

    def forward(self, x: torch.Tensor):
        values = [x]
        for i, (op, a, b) in enumerate(self.spec, start=1):
            if op == "conv":
                values.append(self.convs[str(i)](values[a]))
            elif op == "add":
                values.append(values[a] + values[b])
            else:
                values.append(self.convs[str(i)](torch.cat([values[a], values[b]], dim=1)))
        return tuple(values[i] for i in self.outputs)


@st.composite
def dag_specs(draw, min_nodes: int = 2, max_nodes: int = 7):
    n = draw(st.integers(min_nodes, max_nodes))
    spec = []
    for i in range(1, n + 1):
        op = draw(st.sampled_from(["conv", "conv", "add", "cat"]))
        a = draw(st.integers(0, i - 1))
        b = draw(st.integers(0, i - 1))
        spec.append((op, a, b))
    return spec


def example_input() -> torch.Tensor:
    return torch.randn(1, C, 6, 6, generator=torch.Generator().manual_seed(1))


class InvertedResidual(nn.Module):
    """A stem conv and a MobileNetV2 block whose skip connection keeps the stem's output alive
    while the depthwise conv runs (AUTO-SPLIT Fig. 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.expand = nn.Conv2d(4, 8, 1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.project = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        a = self.stem(x)
        return self.project(torch.relu(self.dw(torch.relu(self.expand(a))))) + a
