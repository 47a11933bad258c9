"""Real two-process split training over gRPC (L2S): still one module, carved up next."""

from edgesplit.train.remote.client import (
    DEFAULT_MAX_BATCH,
    PROTOCOL_VERSION,
    SESSION_TIMEOUT_S,
    SYNC_POLICIES,
    ChainShapes,
    RemoteSplitTrainer,
    RoundStats,
    SyncResult,
    TrainServer,
    _layer_msg,
    _sleep_slowdown,
    chain_shapes,
    model_fingerprint,
    serve_training,
    train_message_bytes,
    untrained_model,
)

__all__ = ["DEFAULT_MAX_BATCH", "PROTOCOL_VERSION", "SESSION_TIMEOUT_S", "SYNC_POLICIES",
           "ChainShapes", "RemoteSplitTrainer", "RoundStats", "SyncResult", "TrainServer",
           "_layer_msg", "_sleep_slowdown", "chain_shapes", "model_fingerprint",
           "serve_training", "train_message_bytes", "untrained_model"]
