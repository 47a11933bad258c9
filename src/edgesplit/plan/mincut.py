"""Minimum s-t cut over a layer DAG (DADS, QDMP): the edge part that minimises
edge compute + transfer + cloud compute, with multi-reader tensors sent once.

Flow network (source side = edge): per layer v, s->v costs its cloud time (paid if v is on the
cloud) and v->t its edge time (paid if on the edge). Per tensor x produced by p, p->x costs its
transfer and x->c is infinite for every reader c, so x is sent once if any reader is on the
cloud. c->p is infinite for every dependency, so the edge part is always a down-set. Solved with
scipy's maximum flow (integer capacities, rescaled), the cut read off the residual graph.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from edgesplit.graph import INPUT, OUTPUT
from edgesplit.plan.cost import CostTable

__all__ = ["min_cut_edge_set"]

_INF = 2**31 - 1
_BUDGET = 2**29  # total finite capacity after scaling, far below the infinite sentinel


def min_cut_edge_set(costs: CostTable, *, forced_edge: Iterable[str] = (),
                     weight_penalty_ms_per_byte: float = 0.0) -> frozenset[str]:
    """The edge layers of a minimum cut, ignoring the round trip (added by the caller).

    ``weight_penalty_ms_per_byte`` adds a Lagrangian price on edge weight bytes (used to meet a
    memory limit)."""
    graph = costs.graph
    names = [layer.name for layer in graph.layers]
    index = {name: i + 2 for i, name in enumerate(names)}  # 0: source (edge), 1: sink (cloud)
    tensors = list(graph.tensors.values())
    tensor_node = {t.name: len(names) + 2 + i for i, t in enumerate(tensors)}
    edges: list[tuple[int, int, float | None]] = []  # None = infinite
    result_on_cloud = costs.setting.result_at == "cloud"
    for layer in graph.layers:
        v = index[layer.name]
        cloud = costs.cloud_ms[layer.name] + sum(
            costs.down_ms.get(t, 0.0) for t in layer.outputs if t in costs.down_ms
            and not result_on_cloud)
        edge = costs.edge_ms[layer.name] + weight_penalty_ms_per_byte * layer.param_bytes
        edges += [(0, v, cloud), (v, 1, edge)]
    for name in forced_edge:
        edges.append((0, index[name], None))
    for tensor in tensors:
        x = tensor_node[tensor.name]
        p = 0 if tensor.producer == INPUT else index[tensor.producer]
        edges.append((p, x, costs.up_ms[tensor.name]))
        for consumer in tensor.consumers:
            if consumer == OUTPUT:
                if result_on_cloud:
                    edges.append((x, 1, None))
                continue
            edges.append((x, index[consumer], None))
            if p != 0:
                edges.append((index[consumer], p, None))
    return frozenset(names[i - 2] for i in _source_side(edges, len(names) + len(tensors) + 2)
                     if 2 <= i < len(names) + 2)


def _source_side(edges: list[tuple[int, int, float | None]], n: int) -> np.ndarray:
    # imported here: every process that loads a plan imports this package, and scipy is 23 MiB
    # of a stage process's resident set that only planning uses (measured)
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    finite = sum(c for _, _, c in edges if c is not None and c > 0)
    scale = _BUDGET / finite if finite > 0 else 1.0
    caps: dict[tuple[int, int], int] = {}
    for u, v, c in edges:
        cap = _INF if c is None else round(c * scale)
        caps[(u, v)] = min(_INF, caps.get((u, v), 0) + cap)
    rows, cols = zip(*caps, strict=True) if caps else ((), ())
    matrix = csr_array((np.fromiter(caps.values(), dtype=np.int32), (rows, cols)), shape=(n, n))
    flow = maximum_flow(matrix, 0, 1).flow
    # Residual capacity: cap - flow on forward arcs, plus flow on reverse arcs.
    residual = csr_array(matrix - flow)
    residual.data[residual.data < 0] = 0
    residual.eliminate_zeros()
    reach = breadth_first_order(residual, 0, directed=True, return_predecessors=False)
    return reach
