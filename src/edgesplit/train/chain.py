"""Split any traceable ``nn.Module`` into a chain of trainable modules at its single-tensor cuts.

Why not the LayerGraph's partitions: the captured program is an *inference* program (exported
in eval mode, weights unlifted into frozen copies, batch-norm on running statistics, folded in
the optimised graph), so :func:`edgesplit.graph.partition.extract_partition` gives modules that
cannot train. Here the model's own ``forward`` is traced with ``torch.fx`` (no example input
needed), treating the model's direct children as leaves, so each chain element calls the
model's own submodules: parameters and buffers are the model's, shared (an optimizer or a weight
merge addresses them as before), and batch-norm trains in train mode.

A cut is a position in the traced node order where exactly one value crosses, as
``LayerGraph.single_tensor_cuts()`` does for captured layers; a residual connection between
children therefore stays inside one element. An element that is just one child called on the
previous element's output *is* that child (so the chain of a model whose forward calls its
children in turn is those children); any other element is a ``GraphModule`` over the same
submodules.

Tracing records one path through ``forward``: a branch on ``self.training`` or on a
configuration value is fixed as it was when :func:`chain_from_trace` ran (in the model's current
mode), and a branch on the data cannot be traced at all (ConfigError).
"""

from __future__ import annotations

import torch
from torch import fx, nn

from edgesplit.errors import ConfigError

__all__ = ["capturable", "chain_from_trace"]

_IO_OPS = ("placeholder", "output", "get_attr")  # not computation: never a cut position


class _ChildrenAsLeaves(fx.Tracer):
    """Stops at the children of the model and of the ``expanded`` modules: the chain's
    granularity is the model's own."""

    def __init__(self, expanded: frozenset[str]) -> None:
        super().__init__()
        self.expanded = expanded

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.expanded:
            return False
        parent = module_qualified_name.rpartition(".")[0]
        return parent == "" or parent in self.expanded \
            or super().is_leaf_module(m, module_qualified_name)


def chain_from_trace(model: nn.Module) -> list[nn.Module]:
    """The chain of ``model``: modules whose application in turn equals ``model(x)`` (forward
    and backward), cut wherever exactly one tensor crosses. Raises ConfigError when the model
    cannot be traced, does not take one tensor to one tensor, or has no cut.

    The cuts are between the model's children; while only one element holds parameters (a
    wrapper around the real network) the children it calls are traced into as well."""
    expanded: frozenset[str] = frozenset()
    chain, inside = _chain(model, _trace(model, expanded))
    while len(inside) == 1 and (deeper := expanded | inside[0]) != expanded:
        try:
            more = _chain(model, _trace(model, deeper))
        except ConfigError:  # the wrapped network itself cannot be traced: keep the wrapper
            break
        expanded, (chain, inside) = deeper, more
    if len(chain) < 2:
        raise ConfigError(f"cannot split {type(model).__name__} for training: no single tensor "
                          "crosses between its operations, so there is no cut to train across")
    _check_unshared(model, chain)
    return chain


def _check_unshared(model: nn.Module, chain: list[nn.Module]) -> None:
    """Each parameter in one element: a cut between two users of a tied weight would leave
    it on both sides, trained apart."""
    owner: dict[int, int] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for i, element in enumerate(chain):
        for p in element.parameters():
            if owner.setdefault(id(p), i) != i:
                raise ConfigError(
                    f"cannot split {type(model).__name__} for training: parameter "
                    f"{names.get(id(p), '?')!r} is used by chain elements {owner[id(p)]} and "
                    f"{i} (a module called twice or a tied weight); pass an nn.Sequential or "
                    "a module with a layers() method that keeps its users together")


def _chain(model: nn.Module, graph: fx.Graph) -> tuple[list[nn.Module], list[frozenset[str]]]:
    """The elements, and for each element holding parameters the submodules it calls."""
    nodes = [n for n in graph.nodes if n.op not in _IO_OPS]
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    if len(inputs) != 1 or not isinstance(output.args[0], fx.Node) or not nodes:
        raise ConfigError(f"cannot split {type(model).__name__} for training: its forward must "
                          "take one tensor and return one tensor")
    chain, inside, start, source = [], [], 0, inputs[0]
    for k, crossing in _cuts(inputs[0], nodes, output):
        segment = nodes[start:k + 1]
        chain.append(_element(model, graph, segment, source, crossing))
        if any(True for _ in chain[-1].parameters()):
            inside.append(frozenset(n.target for n in segment if n.op == "call_module"))
        start, source = k + 1, crossing
    return chain, inside


def _trace(model: nn.Module, expanded: frozenset[str]) -> fx.Graph:
    try:
        return _ChildrenAsLeaves(expanded).trace(model)
    except Exception as exc:  # fx raises many types (TraceError, TypeError, ...)
        raise ConfigError(f"cannot split {type(model).__name__} for training: torch.fx cannot "
                          f"trace its forward ({type(exc).__name__}: {exc}); pass an "
                          "nn.Sequential or a module with a layers() method") from exc


def _cuts(source: fx.Node, nodes: list[fx.Node], output: fx.Node
          ) -> list[tuple[int, fx.Node]]:
    """(position, crossing value) of every single-value cut, the last node always included."""
    position = {n: i for i, n in enumerate(nodes)}
    last_use = {n: max((position.get(u, len(nodes)) for u in n.users), default=-1)
                for n in (source, *nodes)}
    cuts: list[tuple[int, fx.Node]] = []
    live = {source}  # the input stays live while a later node reads it
    result = output.args[0]
    assert isinstance(result, fx.Node)  # checked by the caller
    for k, node in enumerate(nodes):
        live = {n for n in (*live, node) if last_use[n] > k}
        if k == len(nodes) - 1 or len(live) == 1:
            cuts.append((k, result if k == len(nodes) - 1 else next(iter(live))))
    return cuts


def _element(model: nn.Module, graph: fx.Graph, segment: list[fx.Node], source: fx.Node,
             result: fx.Node) -> nn.Module:
    """The segment as a module from ``source`` to ``result``: the child itself when the segment
    is one call of it, else a GraphModule sharing the model's submodules."""
    only = segment[0]
    if (len(segment) == 1 and only is result and only.op == "call_module"
            and only.args == (source,) and not only.kwargs):
        return model.get_submodule(str(only.target))
    new = fx.Graph()
    env = {source: new.placeholder("x")}
    for node in segment:
        for arg in node.all_input_nodes:
            if arg.op == "get_attr" and arg not in env:  # weights used outside a child
                env[arg] = new.node_copy(arg)
        env[node] = new.node_copy(node, lambda n: env[n])
    new.output(env[result])
    return fx.GraphModule(model, new, class_name="ChainElement")


class _Named(nn.Module):
    """Calls ``element``; exists because torch.export gives the operations of a bare
    GraphModule no module path, and graph cuts are found by the chain index in that path."""

    def __init__(self, element: nn.Module) -> None:
        super().__init__()
        self.element = element

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.element(x)


def capturable(chain: list[nn.Module]) -> nn.Sequential:
    """The chain as one ``nn.Sequential`` over the same modules, to capture: every layer of
    element i then has a module path starting with ``i`` (see ``graph_cut_for_chain``)."""
    return nn.Sequential(*(_Named(e) if isinstance(e, fx.GraphModule) else e for e in chain))
