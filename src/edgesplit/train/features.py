"""Context features of a partition point for L2S (Learn-to-Split, paper 002, Section IV-A-1).

L2S predicts the *edge training delay* d_p^e (uplink transmission + back-end forward + back-end
backward + downlink transmission) as a linear function theta^T x_p of the features

    x_p = [m_p^c, m_p^f, m_p^a, psi_p^f, psi_p^b, n_p^c, n_p^f, n_p^a]^T

of partition point p (Sec. IV-A-1, "To sum up ..."). Entry by entry, for the back-end part
DNN_p^back (the layers after the cut, run on the edge server):

=====  ===========  ========================================================================
index  name         meaning (unit)
=====  ===========  ========================================================================
0      ``m_c``      MACs of convolutional layers in the back part (count, per captured batch)
1      ``m_f``      MACs of fully-connected layers in the back part (count, per batch)
2      ``m_a``      operations of activation layers in the back part (count, per batch); these
                    layers have no multiply-accumulates, so one operation per FLOP is counted
3      ``psi_f``    intermediate forward result: cut activation + ground-truth labels (bytes)
4      ``psi_b``    intermediate backward gradient at the cut (bytes)
5      ``n_c``      weights of convolutional layers in the back part (parameter count)
6      ``n_f``      weights of fully-connected layers in the back part (parameter count)
7      ``n_a``      weights of activation layers in the back part (parameter count)
=====  ===========  ========================================================================

Weights (``n_*``) are trainable parameters only: batch-norm running statistics are excluded
because the optimizer does not update them. Shared parameters count once per layer using them.

Layer types. The paper distinguishes three: convolution, fully-connected and "activation".
We map ``Layer.op_class`` (graph.ops.op_class) as: ``conv``/``dwconv`` -> convolutional;
``matmul``/``attention`` -> fully-connected (matrix-multiply units); every other class except
``view`` -> activation (element-wise, normalisation, pooling, ...). Capture with
``optimize=False`` for paper fidelity: an optimised graph fuses activations into the preceding
convolution, so their cost is then not counted in ``m_a``.

Partition points. The paper's partition points are positions p = 0..P of a chain of layers
(Sec. III-A), where exactly one intermediate result crosses; we therefore accept only the
single-tensor cuts of ``LayerGraph.cuts()`` (cut index i = after layer i, -1 = before the first
layer, i.e. p = i + 1). Two cuts are special, as in the paper:

* cut -1 (p = 0): the raw input and labels are sent; no layer stays on the device, so no
  gradient is sent back (``psi_b = 0``).
* the last cut (p = P, pure on-device training): the paper defines its feature vector as the
  zero vector (Sec. IV-B-1), since nothing is offloaded.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.graph.ir import Layer, LayerGraph

__all__ = [
    "FEATURE_NAMES",
    "FEATURE_UNITS",
    "default_label_bytes",
    "feature_matrix",
    "layer_type",
    "partition_features",
]

FEATURE_NAMES: tuple[str, ...] = ("m_c", "m_f", "m_a", "psi_f", "psi_b", "n_c", "n_f", "n_a")
FEATURE_UNITS: tuple[str, ...] = ("MACs", "MACs", "ops", "bytes", "bytes", "params", "params",
                                  "params")

_CONV = frozenset({"conv", "dwconv"})
_FC = frozenset({"matmul", "attention"})


def layer_type(layer: Layer) -> str | None:
    """``"conv"``, ``"fc"`` or ``"act"`` (the paper's three types); None for pure views."""
    if layer.op_class in _CONV:
        return "conv"
    if layer.op_class in _FC:
        return "fc"
    return None if layer.op_class == "view" else "act"


def default_label_bytes(graph: LayerGraph) -> int:
    """One int64 class index per sample: the batch is the first dimension of the first input."""
    shape = graph.tensors[graph.inputs[0]].shape
    return 8 * (shape[0] if shape else 1)


def _check_cut(graph: LayerGraph, cut_index: int) -> None:
    n = len(graph.layers)
    if isinstance(cut_index, bool) or not isinstance(cut_index, (int, np.integer)):
        raise ConfigError(f"cut index must be an integer, got {cut_index!r}")
    if not -1 <= cut_index <= n - 1:
        raise ConfigError(f"cut index {cut_index} is out of range for {graph.model}: allowed are "
                          f"-1 (before the first layer) to {n - 1} (after the last layer)")


# Batch-norm statistics are attributes of the graph but no optimizer updates them: not weights.
_NOT_WEIGHTS = frozenset({"running_mean", "running_var", "num_batches_tracked"})


def _weight_count(graph: LayerGraph, layer: Layer) -> int:
    """Trainable weights read by ``layer`` (the paper's n_p: what weight updating touches)."""
    names = [n for n in layer.param_names if n.rsplit(".", 1)[-1] not in _NOT_WEIGHTS]
    if not names and not layer.param_names:
        return layer.params
    return sum(graph.attribute_numel.get(n, 0) for n in names)


def _back_sums(graph: LayerGraph, layers: Iterable[Layer]) -> np.ndarray:
    """[m_c, m_f, m_a, n_c, n_f, n_a] over ``layers``."""
    macs = {"conv": 0, "fc": 0, "act": 0}
    weights = {"conv": 0, "fc": 0, "act": 0}
    for layer in layers:
        kind = layer_type(layer)
        if kind is None:
            continue
        # activation-type layers have no MACs: one FLOP is one unit of their work
        macs[kind] += layer.macs if kind != "act" else max(layer.macs, layer.flops)
        weights[kind] += _weight_count(graph, layer)
    return np.array([macs["conv"], macs["fc"], macs["act"],
                     weights["conv"], weights["fc"], weights["act"]], dtype=np.float64)


def partition_features(graph: LayerGraph, cut_index: int, *, label_bytes: int | None = None,
                       overhead_bytes: int = 0) -> np.ndarray:
    """x_p of the cut after layer ``cut_index`` (float64, shape (8,), order FEATURE_NAMES).

    ``label_bytes`` defaults to one int64 per sample; ``overhead_bytes`` is added to each
    transmitted message (the paper folds packet headers into psi, Sec. III-A).
    """
    _check_cut(graph, cut_index)
    n = len(graph.layers)
    if cut_index == n - 1:  # p = P: pure on-device training, zero context by definition
        return np.zeros(len(FEATURE_NAMES))
    cut = graph.cuts()[cut_index + 1]
    if len(cut.tensors) != 1:
        raise ConfigError(f"cut {cut_index} of {graph.model} is crossed by {len(cut.tensors)} "
                          "tensors; L2S partition points are chain points with one crossing "
                          "tensor (use graph.single_tensor_cuts())")
    labels = default_label_bytes(graph) if label_bytes is None else label_bytes
    activation = cut.tensors[0].bytes
    psi_f = activation + labels + overhead_bytes
    # at p = 0 the device holds no layer, so the server returns no gradient
    psi_b = 0 if cut_index == -1 else activation + overhead_bytes
    sums = _back_sums(graph, graph.layers[cut_index + 1:])
    return np.concatenate([sums[:3], [psi_f, psi_b], sums[3:]])


def feature_matrix(graph: LayerGraph, cuts: Iterable[int] | None = None, *,
                   label_bytes: int | None = None, overhead_bytes: int = 0
                   ) -> dict[int, np.ndarray]:
    """x_p for each cut index in ``cuts`` (default: every single-tensor cut plus the last,
    on-device cut), keyed by cut index in the given order."""
    if cuts is None:
        indices = [c.index for c in graph.single_tensor_cuts()]
        last = len(graph.layers) - 1
        cuts = indices if last in indices else [*indices, last]
    return {int(i): partition_features(graph, i, label_bytes=label_bytes,
                                       overhead_bytes=overhead_bytes) for i in cuts}
