"""Collaborative (split) training between an end device and an edge server, as in L2S:
the context features of partition points (``features``) and the split trainer (``split``)."""

from edgesplit.train.features import (
    FEATURE_NAMES,
    FEATURE_UNITS,
    default_label_bytes,
    feature_matrix,
    layer_type,
    partition_features,
)
from edgesplit.train.split import (
    OptimizerFactory,
    SplitTrainer,
    StepStats,
    SyncReport,
    as_chain,
    graph_cut_for_chain,
    tensor_bytes,
)

__all__ = [
    "FEATURE_NAMES",
    "FEATURE_UNITS",
    "OptimizerFactory",
    "SplitTrainer",
    "StepStats",
    "SyncReport",
    "as_chain",
    "default_label_bytes",
    "feature_matrix",
    "graph_cut_for_chain",
    "layer_type",
    "partition_features",
    "tensor_bytes",
]
