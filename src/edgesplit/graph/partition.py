"""Cut a set of layers out of the captured program as a runnable module.

The mechanics behind profiling single layers and (later) executing a plan: a ``Partition`` takes
exactly the tensors that enter the set of layers and returns exactly those that leave it.
Deciding *which* layers go together is the planners' business, not this module's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node

from edgesplit.errors import GraphError
from edgesplit.graph.ir import INPUT, OUTPUT

if TYPE_CHECKING:
    from edgesplit.graph.ir import Layer, LayerGraph

__all__ = ["Partition", "copy_layer", "extract_partition", "record_tensors"]


@dataclass
class Partition:
    """A runnable piece of the program: ``module(*inputs) -> tuple(outputs)`` by tensor name."""

    layers: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    module: GraphModule

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.module(*tensors)

    def run(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run on named tensors; returns the named outputs."""
        missing = [name for name in self.inputs if name not in values]
        if missing:
            raise GraphError(f"partition needs tensor(s) {', '.join(missing)} that were not given")
        return dict(zip(self.outputs, self.module(*(values[n] for n in self.inputs)), strict=True))


def extract_partition(graph: LayerGraph, layers: Iterable[str]) -> Partition:
    """The layers ``layers`` (any set, not only a down-set) as a module over their boundary.

    Inputs are the tensors the set reads from outside (model inputs or other layers' outputs),
    in first-use order; outputs are the tensors of the set that something outside reads (other
    layers or the model output), in topological order.
    """
    if graph.program is None:
        raise GraphError("this LayerGraph has no program to extract from (capture it again)")
    chosen = {graph.layer(name).name for name in layers}
    order = [layer for layer in graph.layers if layer.name in chosen]
    inputs = list(dict.fromkeys(t for layer in order for t in layer.inputs
                                if graph.tensors[t].producer not in chosen))
    outputs = [t for layer in order for t in layer.outputs
               if any(c == OUTPUT or c not in chosen for c in graph.tensors[t].consumers)]
    fx_nodes = {n.name: n for n in graph.program.graph.nodes}
    new = Graph()
    env: dict[Node, Node] = {}
    for name in inputs:
        placeholder = new.placeholder(name)
        placeholder.meta = dict(fx_nodes[name].meta)
        env[fx_nodes[name]] = placeholder
    for layer in order:
        copy_layer(layer, fx_nodes, new, env)
    new.output(tuple(env[fx_nodes[t]] for t in outputs))
    module = GraphModule(graph.program, new, class_name="Partition")
    return Partition(tuple(layer.name for layer in order), tuple(inputs), tuple(outputs), module)


def copy_layer(layer: Layer, fx_nodes: dict[str, Node], new: Graph, env: dict[Node, Node]
               ) -> None:
    """Copy one layer's FX nodes (and the weights they read) into ``new``; ``env`` maps the
    program's nodes to their copies and must already hold the layer's inputs."""
    for name in layer.nodes:
        node = fx_nodes[name]
        for arg in node.all_input_nodes:
            if arg.op == "get_attr" and arg not in env:
                env[arg] = new.node_copy(arg)
        env[node] = new.node_copy(node, lambda n: env[n])


class _Recorder(Interpreter):
    def __init__(self, module: GraphModule, keep: set[str]) -> None:
        super().__init__(module)
        self.keep = keep
        self.values: dict[str, Any] = {}

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if n.name in self.keep:
            self.values[n.name] = value
        return value


def record_tensors(graph: LayerGraph, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run the whole program once and return every tensor of the LayerGraph by name (the inputs
    each layer needs when it is run on its own)."""
    if graph.program is None:
        raise GraphError("this LayerGraph has no program to run (capture it again)")
    args = inputs or graph.example_inputs
    recorder = _Recorder(graph.program, set(graph.tensors))
    with torch.no_grad():
        recorder.run(*args)
    values = recorder.values
    for name, tensor in zip(graph.inputs, args, strict=False):
        values.setdefault(name, tensor)
    missing = [t for t, info in graph.tensors.items() if info.producer != INPUT and t not in values]
    if missing:
        raise GraphError(f"running the program did not produce tensor(s) {missing[:3]}")
    return values
