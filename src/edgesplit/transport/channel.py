"""Client channels and the options both ends of a connection share."""

from __future__ import annotations

import grpc

from edgesplit.transport.tls import TlsFiles

__all__ = ["MAX_BACKOFF_S", "channel_options", "open_channel", "server_options"]

MAX_BACKOFF_S = 5.0  # the longest wait between two retries (the backoff doubles up to it)


def channel_options(limit: int) -> list[tuple[str, int]]:
    """Message limit both ways, and a reconnect backoff short enough for client retries."""
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
            # gRPC's own reconnect backoff grows to 120 s, which would outlast --retries
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", int(MAX_BACKOFF_S * 1000))]


def server_options(limit: int) -> list[tuple[str, int]]:
    # SO_REUSEPORT (gRPC's default on Linux) would let a second server bind the same port and
    # silently take a share of the connections: "port in use" must fire instead
    return [*channel_options(limit), ("grpc.so_reuseport", 0)]


def open_channel(address: str, limit: int, tls: TlsFiles | None) -> grpc.Channel:
    """A client channel with our message limit and reconnect backoff, TLS when ``tls.ca``
    (checking the certificate against ``tls.server_name`` when given, else the address's
    host)."""
    if tls is not None and tls.ca is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=tls.ca)
        options: list[tuple[str, int | str]] = [*channel_options(limit)]
        if tls.server_name is not None:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        return grpc.secure_channel(address, creds, options=options)
    return grpc.insecure_channel(address, options=channel_options(limit))
