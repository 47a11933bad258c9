"""The LayerGraph IR: a model as a DAG of layers (after inference-graph optimisation) and the
tensors that flow between them.

A *layer* is a group of FX nodes of the captured program that an inference engine would run as
one kernel (a convolution with its folded batch-norm and fused activation, say). A *tensor* is a
value produced by one layer (or the model input) and read by other layers (or the model output):
exactly the values that can cross a cut. Every layer keeps the names of its FX nodes, so any
set of layers maps back to a sub-program of ``LayerGraph.program``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import networkx as nx

from edgesplit.errors import GraphError

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule

    from edgesplit.graph.cuts import Cut
    from edgesplit.graph.memory import MemoryReport

__all__ = [
    "INPUT",
    "OUTPUT",
    "SCHEMA_VERSION",
    "Layer",
    "LayerGraph",
    "OutputLeaf",
    "TensorInfo",
]

INPUT = "input"  # producer of the model's inputs
OUTPUT = "output"  # consumer of the model's outputs
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TensorInfo:
    """A value that flows between layers. ``bytes`` is at the tensor's own dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    elements: int
    bytes: int
    producer: str
    consumers: tuple[str, ...]

    def bytes_at(self, bits: int) -> int:
        """Size when each element is stored in ``bits`` bits, packed densely."""
        return math.ceil(self.elements * bits / 8)


@dataclass(frozen=True)
class Layer:
    """One fused layer. Costs are for one call at the captured input shape."""

    index: int
    name: str
    op: str
    op_class: str  # coarse class for latency models (graph.ops.op_class)
    fused: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    macs: int
    flops: int
    params: int
    param_bytes: int
    param_names: tuple[str, ...]
    nodes: tuple[str, ...]
    module_path: str
    module_type: str
    # The module paths of all its FX nodes, ``module_path`` first: a layer also ends the modules
    # whose only ops fused into it (a ReLU module after the convolution it fused into).
    modules: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """The op with its fused epilogue, e.g. ``conv2d+relu``."""
        return "+".join((self.op, *self.fused))


@dataclass(frozen=True)
class OutputLeaf:
    """One leaf of what the model returns, in the order of its output tree.

    ``kind`` is ``tensor`` (``value`` names a tensor of ``LayerGraph.outputs``: computed by a
    layer, or a model input returned as is), ``attribute`` (a weight or folded constant the
    model returns: ``value`` is its name on the program) or ``constant`` (``value`` itself:
    None, a number, a string that torch.export kept in the output).
    """

    kind: str
    value: Any


@dataclass
class LayerGraph:
    """Layers in topological order, the tensors between them, and the program they came from."""

    model: str
    layers: list[Layer]
    tensors: dict[str, TensorInfo]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    optimized: bool
    program: GraphModule | None = field(default=None, repr=False, compare=False)
    example_inputs: tuple[torch.Tensor, ...] = field(default=(), repr=False, compare=False)
    # Weights, buffers and folded constants by attribute name: layers may share them (tied
    # embeddings), so memory queries take the union over a set of layers.
    attribute_numel: dict[str, int] = field(default_factory=dict, repr=False)
    attribute_bytes: dict[str, int] = field(default_factory=dict, repr=False)
    # The model's output as torch.export saw it: the flat leaves and the pytree spec that
    # rebuilds the dict / tuple / nested structure from them (None: a flat tuple).
    output_leaves: tuple[OutputLeaf, ...] = field(default=(), repr=False)
    out_spec: Any = field(default=None, repr=False, compare=False)
    # Split points marked in the model's code (``split_point(x, name)``): name -> the tensor
    # it marks, in the order the program computes them.
    split_points: dict[str, str] = field(default_factory=dict)

    # ---- lookups -------------------------------------------------------------------------
    @cached_property
    def _by_name(self) -> dict[str, Layer]:
        return {layer.name: layer for layer in self.layers}

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def layer(self, name: str) -> Layer:
        """The layer called ``name``; an unknown name raises GraphError with close matches."""
        try:
            return self._by_name[name]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(name, self._by_name, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise GraphError(f"no layer named {name!r} in {self.model}.{hint}") from None

    def index_of(self, name: str) -> int:
        return self.layer(name).index

    @property
    def total_macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    @property
    def total_flops(self) -> int:
        return sum(layer.flops for layer in self.layers)

    @property
    def total_params(self) -> int:
        return sum(self.attribute_numel.values())

    @property
    def total_param_bytes(self) -> int:
        return sum(self.attribute_bytes.values())

    # ---- structure -----------------------------------------------------------------------
    @cached_property
    def _predecessors(self) -> dict[str, tuple[str, ...]]:
        index = {layer.name: layer.index for layer in self.layers}
        result = {}
        for layer in self.layers:
            preds = {self.tensors[t].producer for t in layer.inputs} - {INPUT}
            result[layer.name] = tuple(sorted(preds, key=index.__getitem__))
        return result

    def predecessors(self, name: str) -> list[str]:
        """Layers whose outputs ``name`` reads (not the model input), in topological order."""
        return list(self._predecessors[self.layer(name).name])

    def successors(self, name: str) -> list[str]:
        succ = {c for t in self.layer(name).outputs for c in self.tensors[t].consumers}
        succ.discard(OUTPUT)
        return sorted(succ, key=self.index_of)

    def to_networkx(self) -> nx.DiGraph[str]:
        """Layer-level DAG with ``input``/``output`` terminals; edges carry ``tensor``/``bytes``
        (several tensors between the same pair of layers are summed)."""
        g: nx.DiGraph[str] = nx.DiGraph()
        g.add_node(INPUT)
        g.add_nodes_from(layer.name for layer in self.layers)
        g.add_node(OUTPUT)
        for tensor in self.tensors.values():
            for consumer in tensor.consumers:
                if g.has_edge(tensor.producer, consumer):
                    g[tensor.producer][consumer]["bytes"] += tensor.bytes
                    g[tensor.producer][consumer]["tensors"].append(tensor.name)
                else:
                    g.add_edge(tensor.producer, consumer, bytes=tensor.bytes, tensors=[tensor.name])
        return g

    def ancestors_closure(self, names: Iterable[str]) -> list[str]:
        """The smallest down-set containing ``names``: them and everything they depend on."""
        seen: set[str] = set()
        stack = [self.layer(n).name for n in names]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            stack.extend(self.predecessors(name))
        return sorted(seen, key=self.index_of)

    # ---- split points --------------------------------------------------------------------
    @cached_property
    def _module_layers(self) -> dict[str, tuple[str, ...]]:
        """Layers by module path, for every module at or above a module one of their nodes
        ran in (``a.b.c`` counts for ``a``, ``a.b`` and ``a.b.c``), in topological order."""
        found: dict[str, dict[str, None]] = {}  # ordered sets
        for layer in self.layers:
            for path in layer.modules or (layer.module_path,):
                parts = path.split(".") if path else []
                for i in range(1, len(parts) + 1):
                    found.setdefault(".".join(parts[:i]), {})[layer.name] = None
        return {path: tuple(names) for path, names in found.items()}

    def resolve_split_point(self, name: str) -> list[str]:
        """The layers a split point ``name`` stands for, in topological order.

        The rule, in this order:

        1. the name of a split point marked in the model's code (``split_point(x, name)``,
           :attr:`split_points`) is the layer that computes the marked tensor, which fusion
           ends there: a cut after it sends that tensor. A marker on a model input stands for
           no layer (the cut before the first one);
        2. a layer name (``edgesplit inspect`` lists them) is that layer, as it always was;
        3. otherwise a module path (``model.layers.1``, ``resnet.encoder.stages.1``, as
           ``named_modules`` spells it, less the built-ins' wrapper prefix) is every layer with
           an operator of that module or of a module under it (a path in :attr:`Layer.modules`
           equal to it or starting with it and a dot: ``layers.1`` never takes
           ``layers.10``). A cut after them sends the module's output; a cut falls between
           layers, so after a convolution module is after the activation fused into it;
        4. otherwise GraphError, naming close layer names, module paths and split points, and
           listing the marked split points.

        A marked name wins over a layer or module of the same name (the marker was written to
        name exactly that cut), and a layer name over a module path; only a leaf module's first
        layer is named after its path, so the two differ only for a leaf module of several
        layers.
        """
        if name in self.split_points:
            producer = self.tensors[self.split_points[name]].producer
            return [] if producer == INPUT else [producer]
        if name in self._by_name:
            return [name]
        if name in self._module_layers:
            return list(self._module_layers[name])
        raise GraphError(self._unknown_split_point(name))

    def split_layers(self, names: Iterable[str]) -> list[str]:
        """The edge part of a split after ``names`` (layer names or module paths, see
        :meth:`resolve_split_point`): them and everything they depend on, in topological
        order. What ``--split-after``, the manual planner and the privacy layer use."""
        return self.ancestors_closure([layer for name in names
                                       for layer in self.resolve_split_point(name)])

    @cached_property
    def _module_ends(self) -> dict[str, list[str]]:
        """Module paths by their last layer (those a name resolves to as a module)."""
        ends: dict[str, list[str]] = {}
        for path, names in self._module_layers.items():
            if path not in self._by_name or names == (path,):
                ends.setdefault(names[-1], []).append(path)
        return ends

    def modules_ending_at(self, name: str) -> list[str]:
        """The module paths whose split (:meth:`split_layers`) is exactly the layers of the
        topological order up to layer ``name``, i.e. the cut after ``name``: outermost
        first, empty where no module ends there. ``inspect`` marks cut points with them."""
        count = self.index_of(name) + 1
        found = [path for path in self._module_ends.get(name, [])
                 if len(self.ancestors_closure(self._module_layers[path])) == count]
        return sorted(found, key=lambda path: (path.count("."), path))

    def _unknown_split_point(self, name: str) -> str:
        import difflib

        groups = []
        for kind, names in (("split point", self.split_points), ("layer", self._by_name),
                            ("module", [m for m in self._module_layers if m not in self._by_name])):
            close = difflib.get_close_matches(name, names, n=3)
            if close:
                score = difflib.SequenceMatcher(None, name, close[0]).ratio()
                groups.append((-score, f"{kind} {', '.join(close)}"))
        hint = f" Did you mean {' or '.join(text for _, text in sorted(groups))}?" \
            if groups else ""
        marked = (f" Split points marked in the model: {', '.join(self.split_points)}."
                  if self.split_points else "")
        return (f"no layer named {name!r} in {self.model}, and no module at that path or split "
                f"point of that name (`edgesplit inspect` lists layer names, module paths and "
                f"split points).{hint}{marked}")

    def check_down_set(self, names: Iterable[str]) -> frozenset[str]:
        """Validate that ``names`` is closed under predecessors; returns it as a frozenset."""
        edge = frozenset(self.layer(n).name for n in names)
        for name in edge:
            missing = [p for p in self._predecessors[name] if p not in edge]
            if missing:
                raise GraphError(
                    f"layer {name!r} is on the edge but its input from {missing[0]!r} is not: an "
                    "edge part must contain every layer its layers depend on (use "
                    "LayerGraph.ancestors_closure to complete it)."
                )
        return edge

    # ---- outputs ---------------------------------------------------------------------------
    def flat_outputs(self, result: Any) -> tuple[torch.Tensor, ...]:
        """``program``'s result, structured as the model returns it, as the tensors named by
        :attr:`outputs`, in that order (what the runtime sends and compares)."""
        if not self.output_leaves:
            return tuple(result) if isinstance(result, (tuple, list)) else (result,)
        if self.out_spec is not None:
            leaves = self.out_spec.flatten_up_to(result)
        else:
            leaves = list(result) if isinstance(result, (tuple, list)) else [result]
        by_name: dict[str, Any] = {}
        for leaf, value in zip(self.output_leaves, leaves, strict=True):
            if leaf.kind == "tensor":
                by_name.setdefault(leaf.value, value)
        return tuple(by_name[t] for t in self.outputs)

    def structured_outputs(self, outputs: Sequence[torch.Tensor]) -> Any:
        """The model's own output (dict, tuple, nested, with its None and constant leaves)
        rebuilt from the tensors of :attr:`outputs`, e.g. what a split run returned."""
        if len(outputs) != len(self.outputs):
            raise GraphError(f"{self.model} returns {len(self.outputs)} tensor(s) "
                             f"({', '.join(self.outputs)}), got {len(outputs)}")
        values = dict(zip(self.outputs, outputs, strict=True))
        if not self.output_leaves:
            return tuple(outputs)
        leaves = [self._leaf_value(leaf, values) for leaf in self.output_leaves]
        if self.out_spec is not None:
            import torch.utils._pytree as pytree

            return pytree.tree_unflatten(leaves, self.out_spec)
        return leaves[0] if len(leaves) == 1 else tuple(leaves)

    def _leaf_value(self, leaf: OutputLeaf, values: Mapping[str, Any]) -> Any:
        if leaf.kind == "tensor":
            return values[leaf.value]
        if leaf.kind == "attribute":
            obj: Any = self.program
            for part in str(leaf.value).split("."):
                obj = getattr(obj, part)
            return obj
        return leaf.value

    # ---- analyses (see cuts.py and memory.py) --------------------------------------------
    def crossing_tensors(self, edge_layers: Iterable[str], *, include_outputs: bool = True
                         ) -> list[TensorInfo]:
        from edgesplit.graph.cuts import crossing_tensors

        return crossing_tensors(self, edge_layers, include_outputs=include_outputs)

    def crossing_bytes(self, edge_layers: Iterable[str], *, include_outputs: bool = True) -> int:
        """Total bytes of :meth:`crossing_tensors` at their own dtypes."""
        return sum(t.bytes for t in self.crossing_tensors(edge_layers,
                                                          include_outputs=include_outputs))

    def cuts(self) -> list[Cut]:
        from edgesplit.graph.cuts import topological_cuts

        return topological_cuts(self)

    def single_tensor_cuts(self) -> list[Cut]:
        return [cut for cut in self.cuts() if len(cut.tensors) == 1]

    def peak_memory(self, edge_layers: Iterable[str], *,
                    tensor_bytes: Mapping[str, int] | None = None,
                    attribute_bytes: Mapping[str, int] | None = None) -> MemoryReport:
        from edgesplit.graph.memory import peak_memory

        return peak_memory(self, edge_layers, tensor_bytes=tensor_bytes,
                           attribute_bytes=attribute_bytes)

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self, *, with_cuts: bool = True) -> dict[str, Any]:
        """The JSON document of ``edgesplit inspect --json`` (its schema:
        docs/reference/formats.md)."""
        doc: dict[str, Any] = {
            "version": SCHEMA_VERSION,
            "model": self.model,
            "optimized": self.optimized,
            "inputs": [_tensor_dict(self.tensors[t]) for t in self.inputs],
            "outputs": list(self.outputs),
            "totals": {
                "layers": len(self.layers),
                "macs": self.total_macs,
                "flops": self.total_flops,
                "params": self.total_params,
                "param_bytes": self.total_param_bytes,
            },
            "layers": [_layer_dict(layer, self.tensors) for layer in self.layers],
            "tensors": [_tensor_dict(t) for t in self.tensors.values()],
        }
        if with_cuts:
            doc["cuts"] = [{**cut.to_dict(), "modules": self.modules_ending_at(cut.after)
                            if cut.after else []} for cut in self.single_tensor_cuts()]
        doc["split_points"] = [self.describe_split_point(name) for name in self.split_points]
        return doc

    def describe_split_point(self, name: str) -> dict[str, Any]:
        """A split point marked in the model (:attr:`split_points`): ``name``, the ``tensor``
        it marks, the layer a cut there falls ``after`` (None: a model input) and what that cut
        sends (``crossing``, ``crossing_bytes``: :meth:`split_layers` and
        :meth:`crossing_tensors`, so several tensors where the model keeps others live)."""
        layers = self.resolve_split_point(name)
        crossing = self.crossing_tensors(self.split_layers([name]))
        return {"name": name, "tensor": self.split_points[name],
                "after": layers[-1] if layers else None,
                "crossing": [t.name for t in crossing],
                "crossing_bytes": sum(t.bytes for t in crossing)}


def _tensor_dict(t: TensorInfo) -> dict[str, Any]:
    d = asdict(t)
    d["shape"] = list(t.shape)
    d["consumers"] = list(t.consumers)
    return d


def _layer_dict(layer: Layer, tensors: Mapping[str, TensorInfo]) -> dict[str, Any]:
    outs: Sequence[TensorInfo] = [tensors[t] for t in layer.outputs]
    return {
        "index": layer.index,
        "name": layer.name,
        "op": layer.op,
        "op_class": layer.op_class,
        "fused": list(layer.fused),
        "module": layer.module_path,
        "modules": list(layer.modules or (layer.module_path,)),
        "module_type": layer.module_type,
        "macs": layer.macs,
        "flops": layer.flops,
        "params": layer.params,
        "param_bytes": layer.param_bytes,
        "out_shape": list(outs[0].shape) if outs else [],
        "out_elements": sum(t.elements for t in outs),
        "out_bytes": sum(t.bytes for t in outs),
        "out_dtype": outs[0].dtype if outs else None,
        "inputs": list(layer.inputs),
        "outputs": list(layer.outputs),
        "nodes": list(layer.nodes),
    }
