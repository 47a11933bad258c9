"""Group the FX nodes of a prepared program into layers, and build the LayerGraph from them.

Rules (the ones inference engines such as TensorRT or TVM apply):
- a view operator (reshape, slicing, eval-mode dropout...) joins the layer that produced its
  input: it computes nothing;
- in the optimised graph, an element-wise operator whose inputs all come from one layer joins
  that layer (activation fusion; also whole element-wise chains such as GPT-2's tanh-GELU and
  batch-norms that could not be folded into a convolution), unless it enters a module the
  layer is not in that computes something (see below);
- in the optimised graph, a constant pad read only by a convolution joins the convolution;
- everything else starts a layer of its own;
- a value marked as a split point (``split_point(x, name)``, :mod:`edgesplit.graph.markers`)
  ends its layer: nothing after it joins that layer, so the marked value is the layer's output
  and a cut can send it. A view or element-wise operator that would have joined it starts a
  prologue instead, which the next non-fusable operator reading only that prologue joins
  (``flatten`` after a marked encoder output runs with the ``linear`` that reads it), so a
  marker changes the layers only where it sits inside what would have been one kernel.

Module boundaries: a cut after a module (``LayerGraph.split_layers``) must send that module's
output only. Without a rule, the first element-wise ops of the *next* module would fuse into
the module's last layer: a Llama block's residual add took the next RMSNorm's ``to`` and
``pow(2)``, so a cut after the block sent the residual stream and its square. So an
element-wise operator does not join a layer whose first node is outside a module the operator
is in, when that module also holds a non-fusable operator (a "computing" module such as an
RMSNorm or a decoder block). It starts a *prologue* layer instead, which the module's first
non-fusable operator reading only that layer then joins (``pow -> mean``: a reduction with an
element-wise prologue, one kernel as before). An activation module (``nn.ReLU``, GELU) holds
only element-wise ops, so it still fuses into the convolution or linear before it.

A node joins a layer only if *all* its non-constant inputs are in that layer, so every layer is
convex and is entered only through its first node: ordering layers by their first node is a
topological order.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.fx import GraphModule, Node

from edgesplit.errors import CaptureError
from edgesplit.graph.ir import INPUT, OUTPUT, Layer, LayerGraph, OutputLeaf, TensorInfo
from edgesplit.graph.markers import MARKS, split_point_names
from edgesplit.graph.ops import OpCategory, op_category, op_class, op_cost, op_name, tensor_meta

__all__ = ["build_layer_graph", "group_nodes"]

_CONVS = {"conv1d", "conv2d", "conv3d", "convolution"}


def _is_op(node: Node) -> bool:
    return node.op in ("call_function", "call_module")


def _category(node: Node) -> OpCategory:
    return op_category(node) if node.op == "call_function" else OpCategory.COMPUTE


def _fusable(node: Node, optimize: bool) -> bool:
    category = _category(node)
    if category is OpCategory.VIEW:
        return True
    return optimize and category in (OpCategory.ELEMENTWISE, OpCategory.BATCHNORM)


def group_nodes(gm: GraphModule, *, optimize: bool = True) -> list[list[Node]]:
    """Partition the operator nodes of ``gm`` into layers, in topological order."""
    groups: list[list[Node]] = []
    group_of: dict[Node, int] = {}
    computing = _computing_modules(gm, optimize)
    prologues: set[int] = set()  # element-wise layers started at a module boundary
    ended: set[int] = set()  # layers that end at a split point: nothing joins them
    after_mark: set[int] = set()  # prologues started after one: the next op takes them
    for node in gm.graph.nodes:
        if not _is_op(node):
            continue
        inputs = [a for a in node.all_input_nodes if a.op != "get_attr"]
        sources = {group_of.get(a, -1) for a in inputs}  # -1: a model input
        source = next(iter(sources)) if len(sources) == 1 and -1 not in sources else None
        target: int | None = None
        starts_prologue = False
        if _fusable(node, optimize) and source is not None:
            if source in ended or (_category(node) is not OpCategory.VIEW and
                                   _enters_computing(node, groups[source][0], computing)):
                starts_prologue = True
            else:
                target = source
        elif optimize and node.op == "call_function" and op_name(node) in _CONVS:
            target = _pad_prologue(node, groups, group_of)
        if target is None and not _fusable(node, optimize) and source in prologues and \
                (source in after_mark or
                 not _enters_computing(groups[source][0], node, computing)):
            target = source  # the module's first real op takes its element-wise prologue
            prologues.discard(source)
        if target in ended:
            target = None
        if target is None:
            target = len(groups)
            groups.append([])
            if starts_prologue:
                prologues.add(target)
                if source in ended:
                    after_mark.add(target)
        groups[target].append(node)
        group_of[node] = target
        if node.meta.get(MARKS):
            ended.add(target)
    return groups


def _stack(node: Node) -> list[str]:
    """The paths of the modules ``node`` was called in, outermost first."""
    return [path for path, _ in (node.meta.get("nn_module_stack") or {}).values()]


def _computing_modules(gm: GraphModule, optimize: bool) -> frozenset[str]:
    """Modules that hold a non-fusable operator (at any depth): the ones a cut can follow."""
    return frozenset(path for node in gm.graph.nodes
                     if _is_op(node) and not _fusable(node, optimize) for path in _stack(node))


def _enters_computing(node: Node, base: Node, computing: frozenset[str]) -> bool:
    """Whether ``node`` is in a computing module that ``base`` is not in."""
    held = set(_stack(base))
    return any(path in computing and path not in held for path in _stack(node))


def _pad_prologue(conv: Node, groups: list[list[Node]], group_of: dict[Node, int]) -> int | None:
    pad = conv.args[0]
    if not (isinstance(pad, Node) and pad in group_of and _category(pad) is OpCategory.PAD):
        return None
    g = group_of[pad]
    return g if groups[g] == [pad] and len(pad.users) == 1 else None


def _anchor(nodes: list[Node]) -> Node:
    for wanted in (OpCategory.COMPUTE, OpCategory.BATCHNORM, OpCategory.ELEMENTWISE):
        for node in nodes:
            if _category(node) is wanted:
                return node
    return nodes[0]


def _module_of(node: Node, strip: str) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, mtype = list(stack.values())[-1]
    if strip and path.startswith(strip):
        path = path[len(strip):]
    elif strip and path == strip.rstrip("."):
        path = ""
    mtype = mtype if isinstance(mtype, str) else getattr(mtype, "__name__", str(mtype))
    return path, mtype.rsplit(".", 1)[-1]


class _Namer:
    """Module path for the main op of a leaf module (``layer4.0.conv3``), else ``path.op``."""

    def __init__(self, nodes: list[Node], strip: str) -> None:
        paths = {_module_of(n, strip)[0] for n in nodes}
        # Every proper prefix of a path has a submodule below it, so it is not a leaf.
        self._parents = {p[:i] for p in paths for i, ch in enumerate(p) if ch == "."}
        self._used: set[str] = set()

    def name(self, path: str, op: str) -> str:
        leaf = path and path not in self._parents
        base = path if leaf and path not in self._used else (f"{path}.{op}" if path else op)
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name


def _tensor_info(node: Node, producer: str, consumers: list[str]) -> TensorInfo:
    val = node.meta.get("val")
    values = val if isinstance(val, (list, tuple)) else [val]
    metas = [m for m in map(tensor_meta, values) if m is not None]
    if len(metas) == 1:
        shape, dtype = metas[0].shape, str(metas[0].dtype).replace("torch.", "")
    else:  # a tuple value crossing as a whole (rare: higher-order ops)
        shape, dtype = (), "tuple"
    elements = sum(m.numel for m in metas)
    nbytes = sum(m.numel * m.dtype.itemsize for m in metas)
    return TensorInfo(node.name, shape, dtype, elements, nbytes, producer, tuple(consumers))


def _attributes(gm: GraphModule) -> dict[str, torch.Tensor]:
    return {**dict(gm.named_parameters()), **dict(gm.named_buffers())}


def build_layer_graph(gm: GraphModule, *, model: str, optimize: bool,
                      example_inputs: tuple[torch.Tensor, ...] = (),
                      strip_prefix: str = "") -> LayerGraph:
    """Group ``gm``'s nodes into layers, annotate costs, and assemble the LayerGraph."""
    groups = group_nodes(gm, optimize=optimize)
    attrs = _attributes(gm)
    namer = _Namer([n for g in groups for n in g], strip_prefix)
    layer_of: dict[Node, str] = {}
    drafts = []
    for nodes in groups:
        anchor = _anchor(nodes)
        path, mtype = _module_of(anchor, strip_prefix)
        name = namer.name(path, op_name(anchor) if anchor.op == "call_function" else "module")
        for node in nodes:
            layer_of[node] = name
        # the anchor's module first, then every other module a node of the layer ran in
        paths = tuple(dict.fromkeys([path, *filter(None, (_module_of(n, strip_prefix)[0]
                                                          for n in nodes))]))
        drafts.append((name, anchor, nodes, paths, mtype))

    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    graph_outputs = [a for a in output_node.all_input_nodes if a.op != "get_attr"]
    consumers: dict[Node, list[str]] = defaultdict(list)
    for node, name in layer_of.items():
        for arg in node.all_input_nodes:
            if arg.op != "get_attr" and layer_of.get(arg) != name and name not in consumers[arg]:
                consumers[arg].append(name)
    for node in graph_outputs:
        consumers[node].append(OUTPUT)

    tensors: dict[str, TensorInfo] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        tensors[node.name] = _tensor_info(node, INPUT, consumers.get(node, []))
    layers = []
    for index, (name, anchor, nodes, paths, mtype) in enumerate(drafts):
        layers.append(_make_layer(index, name, anchor, nodes, paths, mtype, layer_of, consumers,
                                  attrs, tensors))
    numel = {k: v.numel() for k, v in attrs.items()}
    nbytes = {k: v.numel() * v.element_size() for k, v in attrs.items()}
    return LayerGraph(
        model=model,
        layers=layers,
        tensors=tensors,
        inputs=tuple(n.name for n in placeholders),
        outputs=tuple(n.name for n in graph_outputs),
        optimized=optimize,
        program=gm,
        example_inputs=example_inputs,
        attribute_numel=numel,
        attribute_bytes=nbytes,
        output_leaves=_output_leaves(output_node),
        out_spec=_out_spec(gm),
        split_points=_split_points(gm, tensors, model),
    )


def _split_points(gm: GraphModule, tensors: dict[str, TensorInfo], model: str
                  ) -> dict[str, str]:
    """Split point name -> the tensor it marks, in graph order; CaptureError for a marker
    whose value is no tensor between layers any more."""
    found = {name: node.name for node in gm.graph.nodes if node.name in tensors
             for name in node.meta.get(MARKS, ())}
    lost = [name for name in split_point_names(gm) if name not in found]
    if lost:
        raise CaptureError(
            f"split point {lost[0]!r} of {model} marks a value that does not depend on the "
            "model's inputs (it was folded into a constant) or that nothing reads: mark a "
            "tensor the model computes from its inputs and goes on to use")
    return {name: found[name] for name in split_point_names(gm)}


def _output_leaves(output_node: Node) -> tuple[OutputLeaf, ...]:
    """The output node's flat arguments: the leaves of the model's output tree, in order."""
    args = output_node.args[0] if output_node.args else ()
    flat = args if isinstance(args, (tuple, list)) else (args,)
    leaves = []
    for arg in flat:
        if not isinstance(arg, Node):
            leaves.append(OutputLeaf("constant", arg))
        elif arg.op == "get_attr":
            leaves.append(OutputLeaf("attribute", str(arg.target)))
        else:
            leaves.append(OutputLeaf("tensor", arg.name))
    return tuple(leaves)


def _out_spec(gm: GraphModule):
    """The pytree spec ``gm``'s forward rebuilds its result with (the exported program's
    ``call_spec.out_spec``); None for a graph that returns its flat tuple."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    return info.out_spec if info is not None else None


def _make_layer(index, name, anchor, nodes, paths, mtype, layer_of, consumers, attrs, tensors
                ) -> Layer:
    inputs: list[str] = []
    param_names: list[str] = []
    macs = flops = 0
    fused: list[str] = []
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg.op == "get_attr":
                if str(arg.target) not in param_names:
                    param_names.append(str(arg.target))
            elif layer_of.get(arg) != name and arg.name not in inputs:
                inputs.append(arg.name)
        cost = op_cost(node) if node.op == "call_function" else None
        node.meta["edgesplit_cost"] = cost
        node.meta["edgesplit_layer"] = name
        if cost is not None:
            macs, flops = macs + cost.macs, flops + cost.flops
        if node is anchor:
            fused.extend(node.meta.get("edgesplit_folded", ()))
        elif _category(node) is not OpCategory.VIEW and op_name(node) not in fused:
            fused.append(op_name(node))
    outputs = [n for n in nodes if any(c != name for c in consumers.get(n, []))]
    for node in outputs:
        tensors[node.name] = _tensor_info(node, name, consumers[node])
    params = [attrs[p] for p in param_names if p in attrs]
    return Layer(
        index=index,
        name=name,
        op=op_name(anchor) if anchor.op == "call_function" else str(anchor.target),
        op_class=op_class(anchor) if anchor.op == "call_function" else "other",
        fused=tuple(fused),
        inputs=tuple(inputs),
        outputs=tuple(n.name for n in outputs),
        macs=macs,
        flops=flops,
        params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        param_names=tuple(param_names),
        nodes=tuple(n.name for n in nodes),
        module_path=paths[0],
        module_type=mtype,
        modules=paths,
    )
