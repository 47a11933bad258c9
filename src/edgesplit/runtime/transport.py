"""gRPC transport for split inference, by its historical name: the server per device
(:class:`~edgesplit.runtime.server.PartitionServer`, in :mod:`edgesplit.runtime.server`), the
client that runs device 0 and drives the chain
(:class:`~edgesplit.runtime.client.ChainClient`, in :mod:`edgesplit.runtime.client`), and what
both read from the plan (:mod:`edgesplit.runtime.planned`). This module only re-exports their
public names, so that imports from it keep working; new code imports from those modules.
"""

from __future__ import annotations

from edgesplit.runtime.client import (
    ChainClient,
    Reply,
    RequestResult,
    address_name,
    connect,
    explain_failure,
)
from edgesplit.runtime.planned import (
    JOIN_KEY,
    SESSION_KEY,
    decode_planned,
    max_message_bytes,
    plan_device,
)
from edgesplit.runtime.server import DEFAULT_MAX_BATCH, MAX_SESSIONS, PartitionServer
from edgesplit.transport import (
    TOKEN_ENV,
    GrpcServer,
    TlsFiles,
    check_tls_pair,
    open_channel,
    read_token,
    serve_forever,
)

__all__ = [
    "DEFAULT_MAX_BATCH",
    "JOIN_KEY",
    "MAX_SESSIONS",
    "SESSION_KEY",
    "TOKEN_ENV",
    "ChainClient",
    "GrpcServer",
    "PartitionServer",
    "Reply",
    "RequestResult",
    "TlsFiles",
    "address_name",
    "check_tls_pair",
    "connect",
    "decode_planned",
    "explain_failure",
    "max_message_bytes",
    "open_channel",
    "plan_device",
    "read_token",
    "serve_forever",
]
