"""The optional bearer token: where it is read from, how it travels, how it is compared."""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable
from pathlib import Path

from edgesplit.errors import ConfigError, option

__all__ = ["TOKEN_ENV", "bearer_metadata", "read_token", "token_matches"]

TOKEN_ENV = "EDGESPLIT_TOKEN"


def read_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    """The bearer token from exactly one place: ``token``, a file holding it (one line; a
    command line is visible to every user in ``ps``), or else the environment variable
    ``EDGESPLIT_TOKEN``. None when none is given."""
    if token is not None and token_file is not None:
        raise ConfigError(f"give the token once: {option('token')} or {option('token_file')}, "
                          "not both")
    if token_file is not None:
        path = Path(token_file)
        if not path.is_file():
            raise ConfigError(f"token file {str(path)!r} does not exist")
        token = path.read_text().strip()
        if not token:
            raise ConfigError(f"token file {str(path)!r} is empty")
    elif token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is not None and (not token.isascii() or not token.isprintable()
                              or token != token.strip()):
        raise ConfigError("a token is printable ASCII without surrounding spaces (it travels "
                          "in a gRPC metadata header)")
    return token


def bearer_metadata(token: str | None) -> list[tuple[str, str]]:
    """The call metadata a client sends: the token as ``authorization: Bearer ...``."""
    return [("authorization", f"Bearer {token}")] if token else []


def token_matches(metadata: Iterable[tuple[str, str | bytes]], token: str) -> bool:
    """Whether a call's metadata carries ``token``, compared in constant time (the comparison
    must not tell an attacker how much of a guess was right)."""
    sent = dict(metadata).get("authorization", "")
    raw = sent if isinstance(sent, bytes) else sent.encode()
    return hmac.compare_digest(raw, f"Bearer {token}".encode())
