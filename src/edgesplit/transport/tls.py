"""TLS material for a server or a client, and the check that a certificate fits its key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgesplit.errors import ConfigError, option

__all__ = ["TlsFiles", "check_tls_pair"]


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate and key, or what a client trusts. ``server_name``: the name
    the client checks the server's certificate against instead of the host it dials (a
    server reached by IP whose certificate names a host); every client, gRPC and data
    plane, checks the same name."""

    cert: bytes | None = None  # server: certificate chain (PEM)
    key: bytes | None = None  # server: private key (PEM)
    ca: bytes | None = None  # client: root certificate to trust (PEM)
    server_name: str | None = None  # client: the name the server's certificate must carry

    def __post_init__(self) -> None:
        if self.server_name is not None and self.ca is None:
            flag = option("server_name", flag="--tls-server-name")
            raise ConfigError(f"{flag} says which name the server's certificate must carry: "
                              f"give the CA that signed it too ({option('ca', flag='--tls-ca')})")
        if self.server_name is not None and not self.server_name.strip():
            raise ConfigError(f"{option('server_name', flag='--tls-server-name')} is empty: "
                              "give the host name the server's certificate is for")


def check_tls_pair(tls: TlsFiles) -> None:
    """Refuse a server certificate and key that are missing, unreadable or do not belong
    together, with a message saying which (gRPC itself only says "Failed to bind")."""
    import ssl
    import tempfile

    cert_opt, key_opt = option("cert", flag="--tls-cert"), option("key", flag="--tls-key")
    if tls.cert is None or tls.key is None:
        raise ConfigError("TLS needs both a certificate and its private key "
                          f"({cert_opt} and {key_opt})")
    with tempfile.TemporaryDirectory() as tmp:  # ssl reads PEM from files only
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert.write_bytes(tls.cert)
        key.write_bytes(tls.key)
        key.chmod(0o600)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            reason = "they do not belong together" if "mismatch" in str(exc) else \
                "they are not a PEM certificate and private key"
            raise ConfigError(f"TLS certificate and key refused: {reason} ({exc.reason or exc}); "
                              f"pass {cert_opt} and {key_opt} of the same key pair") from None
