"""What every runtime server is told the same way, :class:`ServeOptions`, and what a client
is told about calling its server, :class:`CallOptions`.

The partition server (:func:`~edgesplit.runtime.server.partition_server`) and an LLM stage
(:func:`~edgesplit.llm.stage.server.llm_stage_server`) take one ``ServeOptions`` and hand
it to their :class:`~edgesplit.runtime.shell.ServingShell`: the token and TLS its callers
need, the connection limits, how many calls it serves at once, how long a call waits for
the next device, its data plane and how it reaches the next device's, and whether its links
are shaped to the plan's. The command line builds one from the serve commands' shared flags
(``cli/_app.py:serve_options``), each field from the flags named there once.

A client (the split-training device, :class:`~edgesplit.train.remote.RemoteSplitTrainer`;
the split LLM's first stage, :class:`~edgesplit.llm.generate.client.LLMClient`) takes one
``CallOptions``: the token and TLS its server wants, each call's deadline, and how often a
call that failed on the way is sent again.

This module imports nothing heavy (no gRPC, no torch): the command line reads it while it
builds its commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from edgesplit.errors import ConfigError

if TYPE_CHECKING:
    from edgesplit.transport.limits import ConnectionLimits
    from edgesplit.transport.tls import TlsFiles

__all__ = ["CallOptions", "ServeOptions"]


@dataclass(frozen=True)
class ServeOptions:
    """How a server serves, whatever it serves.

    ``token``: the bearer token every call must carry (None: none). ``tls``: the server's
    certificate and key, and the CA it trusts to reach the next device (None: plain TCP).
    ``limits``: how long idle or slow callers may hold a connection and the memory frames
    still arriving may hold (None: :class:`~edgesplit.transport.limits.ConnectionLimits`'
    defaults). ``max_workers``: calls served at once, over gRPC and the data plane together
    (None: the server's own default). ``next_timeout_s``: the longest a call waits for a
    worker or the next device when its caller set no deadline. ``data_port``: the data
    plane's port (0: any free one; None: no data plane). ``data_plane``: how the next device
    is called (``auto``: its data plane where it offers one). ``shape``: sends and replies
    take the plan's link time."""

    token: str | None = None
    tls: TlsFiles | None = None
    limits: ConnectionLimits | None = None
    max_workers: int | None = None
    next_timeout_s: float = 60.0
    data_port: int | None = 0
    data_plane: Literal["auto", "grpc", "tcp"] = "auto"
    shape: bool = False

    def workers(self, default: int) -> int:
        """``max_workers``, or the server's ``default`` where none was given."""
        return default if self.max_workers is None else self.max_workers


@dataclass(frozen=True)
class CallOptions:
    """How a client calls its server, whatever it asks of it.

    ``token``: the bearer token its calls carry (None: none). ``tls``: the CA it trusts (and
    the name it expects) to reach the server over TLS (None: plain TCP). ``timeout_s``: each
    call's deadline. ``retries``: how many times a call that failed on the way (UNAVAILABLE,
    DEADLINE_EXCEEDED) is sent again, with a backoff doubling from ``retry_backoff_s``
    (None: the client's own default, :meth:`tries`)."""

    token: str | None = None
    tls: TlsFiles | None = None
    timeout_s: float = 60.0
    retries: int | None = None
    retry_backoff_s: float = 0.2

    def __post_init__(self) -> None:
        retries = self.retries
        if (retries is not None and (isinstance(retries, bool) or not isinstance(retries, int)
                                    or retries < 0)) or not self.retry_backoff_s >= 0:
            raise ConfigError(f"retries must be a whole number >= 0 and retry_backoff_s >= 0 "
                              f"seconds, got {retries!r} and {self.retry_backoff_s!r}")

    def tries(self, default: int) -> int:
        """``retries``, or the client's ``default`` where none was given."""
        return default if self.retries is None else self.retries
