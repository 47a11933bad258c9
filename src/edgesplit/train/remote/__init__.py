"""Real two-process split training over gRPC, as in L2S (paper 002, Sec. III-A and IV-C): the
end device (:class:`RemoteSplitTrainer`) trains the chain elements up to the cut, the edge
server (:func:`training_server`, a :class:`TrainHandler` on the serving shell) the rest, and
the two sync their copies of the model by the policy the device chose.

- ``protocol``: what both sides agree on (version, fingerprint, cut shapes, message limit,
  the weight-sync rule) and the checks on every tensor that arrives;
- ``replica``: one side's copy of the chain, its optimizer and sync state, and taking an
  update back;
- ``sessions``: what a session keeps: sequence numbers and repeated requests;
- ``server``: the server's handler, its one session at a time, and ``serve_training``;
- ``client``: the device, told how it trains (:class:`TrainOptions`), what it emulates
  (:class:`Emulation`) and how it calls the server
  (:class:`~edgesplit.runtime.options.CallOptions`).
"""

from edgesplit.train.remote.client import (
    Emulation,
    RemoteSplitTrainer,
    RoundStats,
    SyncResult,
    TrainOptions,
)
from edgesplit.train.remote.protocol import (
    DEFAULT_MAX_BATCH,
    PROTOCOL_VERSION,
    SYNC_POLICIES,
    ChainShapes,
    chain_shapes,
    model_fingerprint,
    train_message_bytes,
)
from edgesplit.train.remote.server import (
    TrainHandler,
    serve_training,
    training_server,
    untrained_model,
)
from edgesplit.train.remote.sessions import SESSION_TIMEOUT_S

__all__ = ["DEFAULT_MAX_BATCH", "PROTOCOL_VERSION", "SESSION_TIMEOUT_S", "SYNC_POLICIES",
           "ChainShapes", "Emulation", "RemoteSplitTrainer", "RoundStats", "SyncResult",
           "TrainHandler", "TrainOptions", "chain_shapes", "model_fingerprint",
           "serve_training", "train_message_bytes", "training_server", "untrained_model"]
