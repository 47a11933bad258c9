"""Rewrite passes on the unlifted, functional ATen graph of an exported program.

Each pass takes a ``torch.fx.GraphModule`` whose nodes carry ``meta['val']`` (as
``ExportedProgram.module()`` produces), rewrites it in place and keeps the program's numerical
behaviour: after any pass, running the module gives the same outputs as before (up to float
rounding for batch-norm folding).
"""

from __future__ import annotations

from typing import Any, TypeGuard, cast

import torch
from torch._ops import OpOverload
from torch.fx import GraphModule, Node
from torch.fx.node import Argument

from edgesplit.graph.ops import OpCategory, op_category, op_name

__all__ = ["fold_batchnorm", "fold_constants", "free_batch", "remove_unused_attributes",
           "strip_checks"]

# Operators kept by export only to check the input at run time; they produce no tensor.
_CHECK_OPS = {"_assert_tensor_metadata", "_assert_async", "sym_constrain_range",
              "sym_constrain_range_for_size", "_assert_scalar", "_functional_assert_async"}


def strip_checks(gm: GraphModule) -> GraphModule:
    """Drop export's run-time guard calls and assertion nodes (they compute nothing)."""
    graph = gm.graph
    for node in list(graph.nodes):
        is_guard = node.op == "call_module" and str(node.target).startswith("_guards")
        is_check = node.op == "call_function" and op_name(node) in _CHECK_OPS
        if (is_guard or is_check) and not node.users:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm


def _attr(gm: GraphModule, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _new_attr(gm: GraphModule, hint: str, value: torch.Tensor) -> str:
    name = _new_attr_name(gm, hint)
    gm.register_buffer(name, value.detach().clone())
    return name


def fold_constants(gm: GraphModule) -> GraphModule:
    """Evaluate nodes that depend on no model input and store their results as constants.

    Mask construction, position ids and weight transposes are not layers an inference engine runs
    per request; leaving them in would add spurious sources to the layer graph.
    """
    graph = gm.graph
    values: dict[Node, Any] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            values[node] = _attr(gm, str(node.target))
        elif node.op == "call_function" and all(a in values for a in node.all_input_nodes):
            if "rand" in op_name(node):  # never freeze randomness
                continue
            args = torch.fx.node.map_arg(node.args, lambda a: values[a])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: values[a])
            with torch.no_grad():
                values[node] = node.target(*args, **kwargs)
    for node, value in values.items():
        if node.op == "get_attr" or not isinstance(value, torch.Tensor):
            continue
        if not any(user not in values for user in node.users):
            continue  # only used by other folded nodes
        with graph.inserting_before(node):
            const = graph.get_attr(_new_attr(gm, node.name, value))
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return remove_unused_attributes(gm)


def _is_get_attr(arg: object) -> TypeGuard[Node]:
    return isinstance(arg, Node) and arg.op == "get_attr"


def _arg(node: Node, name: str) -> Argument:
    """Argument ``name`` of an ATen call, positional or keyword (the batch-norm variants put
    ``eps`` at different positions)."""
    if name in node.kwargs:
        return node.kwargs[name]
    target = cast("OpOverload", node.target)  # ATen calls only
    for i, arg in enumerate(target._schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) else arg.default_value
    raise KeyError(name)


def _fold_one_batchnorm(gm: GraphModule, bn: Node) -> bool:
    producer = bn.args[0]
    if not (isinstance(producer, Node) and len(producer.users) == 1):
        return False
    name = op_name(producer)
    if name not in {"conv1d", "conv2d", "conv3d", "linear"}:
        return False
    weight_node = producer.args[1]
    raw_bias = producer.args[2] if len(producer.args) > 2 else None
    bias_node = raw_bias if _is_get_attr(raw_bias) else None
    gamma, beta, mean, var = (_arg(bn, key) for key in ("weight", "bias", "running_mean",
                                                         "running_var"))
    eps = _arg(bn, "eps")
    if not (_is_get_attr(weight_node) and _is_get_attr(mean) and _is_get_attr(var)):
        return False
    if raw_bias is not None and bias_node is None:  # a bias computed at run time
        return False
    if not isinstance(eps, (int, float)):
        return False
    weight = _attr(gm, str(weight_node.target))
    out_channels = weight.shape[0]
    out_val = producer.meta.get("val")
    # Linear layers fold only when BN normalises their feature dim (2-d output).
    if name == "linear" and (out_val is None or out_val.dim() != 2):
        return False
    running_var = _attr(gm, str(var.target))
    if running_var.numel() != out_channels:
        return False
    running_mean = _attr(gm, str(mean.target))
    g = _attr(gm, str(gamma.target)) if isinstance(gamma, Node) else torch.ones_like(running_var)
    b = _attr(gm, str(beta.target)) if isinstance(beta, Node) else torch.zeros_like(running_var)
    bias = (_attr(gm, str(bias_node.target)) if bias_node is not None
            else torch.zeros_like(running_var))
    with torch.no_grad():
        scale = g / torch.sqrt(running_var + eps)
        new_w = weight * scale.reshape(-1, *([1] * (weight.dim() - 1)))
        new_b = (bias - running_mean) * scale + b
    graph = gm.graph
    w_target, b_target = _folded_targets(gm, producer, weight_node, bias_node)
    _set_attr(gm, w_target, new_w)
    _set_attr(gm, b_target, new_b)
    with graph.inserting_before(producer):
        w_node = graph.get_attr(w_target)
        b_node = graph.get_attr(b_target)
    w_node.meta = dict(weight_node.meta)
    b_node.meta = {"val": out_val.new_empty(out_channels) if out_val is not None else None}
    args = list(producer.args) + [None] * (3 - len(producer.args))
    args[1], args[2] = w_node, b_node
    producer.args = tuple(args)
    producer.meta["edgesplit_folded"] = [*producer.meta.get("edgesplit_folded", ()), "batch_norm"]
    # The no-training op returns (out, mean, invstd); the plain op returns the output itself.
    if op_name(bn) == "batch_norm" and isinstance(bn.meta.get("val"), (list, tuple)):
        for user in list(bn.users):
            user.replace_all_uses_with(producer)
            graph.erase_node(user)
    bn.replace_all_uses_with(producer)
    graph.erase_node(bn)
    return True


def _folded_targets(gm: GraphModule, producer: Node, weight: Node, bias: Node | None
                    ) -> tuple[str, str]:
    """Where the folded weight and bias go: over the layer's own attributes (so names stay
    ``conv.weight``/``conv.bias``) unless another node reads them too."""
    readers = {t: 0 for t in (str(weight.target), str(bias.target) if bias else "")}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target) in readers:
            readers[str(node.target)] += len(node.users)
    w_target = str(weight.target)
    if readers[w_target] != 1:
        return (_new_attr_name(gm, w_target + "_bnfold"),
                _new_attr_name(gm, w_target + "_bnfold_bias"))
    if bias is not None:
        b_target = str(bias.target)
        if readers[b_target] == 1:
            return w_target, b_target
        return w_target, _new_attr_name(gm, b_target + "_bnfold")
    b_target = w_target.rsplit(".", 1)[0] + ".bias" if "." in w_target else "bias"
    return w_target, b_target if not _has_attr(gm, b_target) else _new_attr_name(gm, b_target)


def _has_attr(gm: GraphModule, target: str) -> bool:
    try:
        _attr(gm, target)
        return True
    except AttributeError:
        return False


def _new_attr_name(gm: GraphModule, hint: str) -> str:
    base = "_es_" + hint.replace(".", "_")
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name


def _set_attr(gm: GraphModule, target: str, value: torch.Tensor) -> None:
    owner_path, _, leaf = target.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    if leaf in owner._buffers:
        del owner._buffers[leaf]
    # Folded weights stay parameters (frozen), so later passes treat them as weights.
    owner._parameters.pop(leaf, None)
    owner.register_parameter(leaf, torch.nn.Parameter(value.detach().clone(), requires_grad=False))


def fold_batchnorm(gm: GraphModule) -> GraphModule:
    """Fold inference-mode batch-norm into the preceding convolution or linear layer.

    W' = W * gamma / sqrt(var + eps) per output channel; b' = (b - mean) * gamma / sqrt(var + eps)
    + beta. Only batch-norms whose producer feeds nothing else are folded.
    """
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and op_category(node) is OpCategory.BATCHNORM:
            _fold_one_batchnorm(gm, node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return remove_unused_attributes(gm)


def remove_unused_attributes(gm: GraphModule) -> GraphModule:
    """Delete parameters and buffers no ``get_attr`` node reads any more (memory, and honest
    parameter counts after folding)."""
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_parameters()) + list(gm.named_buffers()):
        if name in used:
            continue
        owner_path, _, leaf = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        delattr(owner, leaf)
    return gm


_SHAPED = (torch.ops.aten.view.default, torch.ops.aten.reshape.default,
           torch.ops.aten.expand.default, torch.ops.aten._unsafe_view.default)


def free_batch(gm: GraphModule, batch: int) -> int:
    """Let ``gm`` (captured at batch size ``batch``) run at any batch size, in place.

    torch.export bakes the example's batch size into ``view`` / ``reshape`` / ``expand``
    shapes; each shape whose first entry is ``batch`` gets its input's own size 0 instead. The
    caller checks the result against the captured model (a model that moves the batch out of
    dimension 0 before such a reshape is not batch-first, and is refused there). Returns how
    many shapes were rewritten.
    """
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SHAPED or len(node.args) < 2:
            continue
        shape = node.args[1]
        if not isinstance(shape, (list, tuple)) or len(shape) < 2 or shape[0] != batch:
            continue
        with gm.graph.inserting_before(node):
            size = gm.graph.call_function(torch.ops.aten.sym_size.int, (node.args[0], 0))
        node.args = (node.args[0], [size, *shape[1:]], *node.args[2:])
        count += 1
    if count:
        gm.recompile()
    return count
