"""Collaborative (split) training between an end device and an edge server, as in L2S:
the split trainer (``split``, in-process; ``remote``, over gRPC between two processes), the
context features of partition points (``features``), the online learners (``bandit``:
LinUCB, LinUCB-E) and their modes (``modes``), the privacy analysis (``privacy``), the
trace-driven simulator (``simulator``, ``l2s``) and the real run (``session``)."""

from edgesplit.train.bandit import LinUCB, LinUCBE, forced_sampling_rounds
from edgesplit.train.chain import capturable, chain_from_trace
from edgesplit.train.features import (
    FEATURE_NAMES,
    FEATURE_UNITS,
    default_label_bytes,
    feature_matrix,
    layer_type,
    partition_features,
)
from edgesplit.train.l2s import POLICIES, compare_policies
from edgesplit.train.modes import AdaptiveL2S, ModeConfig
from edgesplit.train.privacy import analyse_privacy, kl_per_cut, privacy_point
from edgesplit.train.remote import (
    Emulation,
    RemoteSplitTrainer,
    TrainOptions,
    training_server,
)
from edgesplit.train.session import TrainSplitConfig, run_split_training, train_split
from edgesplit.train.simulator import BandwidthTrace, simulate, training_costs
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
    "POLICIES",
    "AdaptiveL2S",
    "BandwidthTrace",
    "Emulation",
    "LinUCB",
    "LinUCBE",
    "ModeConfig",
    "OptimizerFactory",
    "RemoteSplitTrainer",
    "SplitTrainer",
    "StepStats",
    "SyncReport",
    "TrainOptions",
    "TrainSplitConfig",
    "analyse_privacy",
    "as_chain",
    "capturable",
    "chain_from_trace",
    "compare_policies",
    "default_label_bytes",
    "feature_matrix",
    "forced_sampling_rounds",
    "graph_cut_for_chain",
    "kl_per_cut",
    "layer_type",
    "partition_features",
    "privacy_point",
    "run_split_training",
    "simulate",
    "tensor_bytes",
    "train_split",
    "training_costs",
    "training_server",
]
