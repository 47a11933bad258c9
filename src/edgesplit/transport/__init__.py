"""What inference (``runtime``) and training (``train``) share to talk gRPC: TLS files and
their check, the bearer token, channel and server options, the server base with health and
graceful stop, request errors with their status codes, and deadline checks.

This layer sits below ``runtime`` and ``train`` and imports neither.
"""

from edgesplit.transport.auth import TOKEN_ENV, bearer_metadata, read_token, token_matches
from edgesplit.transport.channel import MAX_BACKOFF_S, channel_options, open_channel, server_options
from edgesplit.transport.deadline import check_alive, deadline_of, remaining_timeout
from edgesplit.transport.errors import BadRequest, abort_for, answer, explain, invalid
from edgesplit.transport.loopback import LoopbackChannel, LoopbackContext, LoopbackError
from edgesplit.transport.server import GrpcServer, serve_forever
from edgesplit.transport.shaping import LinkShaper
from edgesplit.transport.tls import TlsFiles, check_tls_pair

__all__ = [
           "MAX_BACKOFF_S",
           "TOKEN_ENV",
           "BadRequest",
           "GrpcServer",
           "LinkShaper",
           "LoopbackChannel",
           "LoopbackContext",
           "LoopbackError",
           "TlsFiles",
           "abort_for",
           "answer",
           "bearer_metadata",
           "channel_options",
           "check_alive",
           "check_tls_pair",
           "deadline_of",
           "explain",
           "invalid",
           "open_channel",
           "read_token",
           "remaining_timeout",
           "serve_forever",
           "server_options",
           "token_matches",
]
