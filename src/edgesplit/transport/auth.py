"""The optional bearer token: where it is read from, how it travels, how it is compared."""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable
from pathlib import Path

from edgesplit.errors import ConfigError, option

__all__ = ["TOKEN_ENV", "bearer_metadata", "read_secret", "read_token", "token_matches"]

TOKEN_ENV = "EDGESPLIT_TOKEN"


def read_secret(value: str | None, path: str | Path | None, *, env: str, what: str,
                flags: tuple[str, str], carrier: str, inner_spaces: bool = True
                ) -> str | None:
    """A secret from exactly one place: ``value``, a file holding it (one line; a command
    line is visible to every user in ``ps``), or else the environment variable ``env``. None
    when none is given. ``what`` names it in messages, ``flags`` the two options that give
    it, ``carrier`` what it travels in (why it must be printable ASCII; ``inner_spaces``:
    whether it may hold spaces inside)."""
    if value is not None and path is not None:
        raise ConfigError(f"give the {what} once: {flags[0]} or {flags[1]}, not both")
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"{what} file {str(file)!r} does not exist")
        value = file.read_text().strip()
        if not value:
            raise ConfigError(f"{what} file {str(file)!r} is empty")
    elif value is None:
        value = os.environ.get(env) or None
    if value is not None and (not value.isascii() or not value.isprintable()
                              or value != value.strip()
                              or (not inner_spaces and " " in value)):
        spaces = "surrounding spaces" if inner_spaces else "spaces"
        raise ConfigError(f"a {what} is printable ASCII without {spaces} (it travels in "
                          f"{carrier})")
    return value


def read_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    """The bearer token from exactly one place: ``token``, a file holding it, or else the
    environment variable ``EDGESPLIT_TOKEN`` (:func:`read_secret`). None when none is
    given."""
    return read_secret(token, token_file, env=TOKEN_ENV, what="token",
                       flags=(option("token"), option("token_file")),
                       carrier="a gRPC metadata header")


def bearer_metadata(token: str | None) -> list[tuple[str, str]]:
    """The call metadata a client sends: the token as ``authorization: Bearer ...``."""
    return [("authorization", f"Bearer {token}")] if token else []


def token_matches(metadata: Iterable[tuple[str, str | bytes]], token: str) -> bool:
    """Whether a call's metadata carries ``token``, compared in constant time (the comparison
    must not tell an attacker how much of a guess was right)."""
    sent = dict(metadata).get("authorization", "")
    raw = sent if isinstance(sent, bytes) else sent.encode()
    return hmac.compare_digest(raw, f"Bearer {token}".encode())
