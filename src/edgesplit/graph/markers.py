"""Split points marked in a model's code: ``x = split_point(x, "after_encoder")``.

As ``torch.distributed.pipelining``'s ``pipe_split()`` does (``torch/distributed/pipelining/
_IR.py``), the marker is a custom operator that ``torch.export`` keeps: ``edgesplit::split_point
(Tensor x, str name) -> ()`` computes nothing, returns nothing and is registered as having a
side effect, so neither export nor dead-code elimination drops it. It takes the marked tensor
as its argument, which says *which* value the split point is; :func:`split_point` hands the
tensor itself back, so in eager mode a marker costs one empty operator call and changes no
value.

:func:`edgesplit.graph.capture` removes the operators again (:func:`strip_split_points`, after
the passes, which therefore keep the marked value: batch-norm does not fold over it) and writes
each name onto the node of its tensor (``node.meta["edgesplit_split_points"]``). Fusion ends a
layer at a marked tensor and the LayerGraph offers each name as a split point
(``LayerGraph.split_points``, ``resolve_split_point``).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from edgesplit.errors import ConfigError

__all__ = ["DEFAULT_NAME", "MARKS", "split_point", "split_point_names", "strip_split_points"]

DEFAULT_NAME = "split_point"  # an unnamed marker's name (then split_point_1, split_point_2 ...)
MARKS = "edgesplit_split_points"  # node.meta key: the split point names of that node's value
_NAMES = "edgesplit_split_point_names"  # GraphModule.meta key: every name, in graph order

torch.library.define("edgesplit::split_point", "(Tensor x, str name) -> ()")


@torch.library.impl("edgesplit::split_point", "CompositeExplicitAutograd")
def _split_point(x: torch.Tensor, name: str) -> None:
    return None


@torch.library.register_fake("edgesplit::split_point")
def _split_point_fake(x: torch.Tensor, name: str) -> None:
    return None


_OP = torch.ops.edgesplit.split_point.default
torch.fx.node.has_side_effect(_OP)  # export and eliminate_dead_code keep it


def split_point(x: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Mark ``x`` as a split point of the model and return it unchanged (the same object).

    Write it in a forward, ``x = split_point(x, "after_encoder")``: a captured model offers the
    cut there under that name (``--split-after after_encoder``, ``split_layers(["after_encoder"
    ])``), and the cut sends ``x``. Unnamed markers are called ``split_point``, ``split_point_1``
    ..., and a name met again (a marked block run twice) gets ``_1``, ``_2`` ... in the order
    the program runs them; ``edgesplit inspect`` lists them.
    """
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"split_point marks one tensor, got {type(x).__name__}: mark each "
                          "tensor of it (a cut after several markers sends them all)")
    if name is not None and (not isinstance(name, str) or not name.strip() or "," in name
                             or name != name.strip()):
        raise ConfigError(f"split_point name {name!r} must be a non-empty string without "
                          "commas or surrounding spaces (it is given to --split-after, "
                          "comma-separated)")
    _OP(x, name or "")
    return x


def _is_marker(node: Node) -> bool:
    return node.op == "call_function" and node.target is _OP


def strip_split_points(gm: GraphModule) -> list[str]:
    """Remove every marker from ``gm``, in place, and return their names in graph order.

    Each name (unnamed: :data:`DEFAULT_NAME`; a repeated one with ``_1``, ``_2`` ...) is added
    to ``meta[MARKS]`` of the node the marker took, and the list is kept in
    ``gm.meta`` (see :func:`split_point_names`). Values only a marker read are then dead and
    removed with it.
    """
    names: list[str] = []
    for node in list(gm.graph.nodes):
        if not _is_marker(node):
            continue
        marked, given = node.args[0], node.args[1] if len(node.args) > 1 else ""
        base = str(given or DEFAULT_NAME)
        name, i = base, 0
        while name in names:
            i += 1
            name = f"{base}_{i}"
        names.append(name)
        if isinstance(marked, Node):
            marked.meta[MARKS] = [*marked.meta.get(MARKS, ()), name]
        gm.graph.erase_node(node)
    if names:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    gm.meta[_NAMES] = names
    return names


def split_point_names(gm: GraphModule) -> list[str]:
    """The names :func:`strip_split_points` found in ``gm``, in graph order."""
    return list(gm.meta.get(_NAMES, ()))
