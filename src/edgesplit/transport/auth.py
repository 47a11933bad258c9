"""The optional bearer token: where it is read from, how it travels, how it is compared."""

from __future__ import annotations

import hmac
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from edgesplit.errors import ConfigError, option

__all__ = ["TOKEN_ENV", "WRONG_TOKEN", "AuthThrottle", "bearer_metadata", "peer_host",
           "read_secret", "read_token", "throttled", "token_matches"]

WRONG_TOKEN = "missing or wrong bearer token (give both sides the same token)"

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


def peer_host(peer: str) -> str:
    """The host of a peer as gRPC (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) or the data plane
    (``tcp:1.2.3.4:5``) names it: the part failed attempts are counted by."""
    kind, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if kind in ("ipv4", "ipv6", "tcp") else peer
    return host.strip("[]") or peer


class AuthThrottle:
    """Failed token checks counted per peer host, as a token bucket: a host may fail
    ``burst`` times at once and then once every ``interval_s``; while its bucket is empty,
    its calls are refused without their token being compared, so that guessing runs at most
    at that rate (a client that sends the right token never fails, and is never slowed). At
    most ``max_peers`` hosts are remembered, the least recently failed forgotten first."""

    def __init__(self, burst: int = 10, interval_s: float = 1.0, max_peers: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.interval_s, self.max_peers = burst, interval_s, max_peers
        self._clock = clock
        self._peers: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when
        self._lock = threading.Lock()

    def _tokens(self, host: str, now: float) -> float:
        tokens, then = self._peers.get(host, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - then) / self.interval_s)

    def wait_s(self, host: str) -> float:
        """Seconds until ``host`` may try a token again (0: now). One dictionary look-up for
        a host that never failed."""
        if host not in self._peers:
            return 0.0
        with self._lock:
            now = self._clock()
            return max(0.0, (1.0 - self._tokens(host, now)) * self.interval_s)

    def failed(self, host: str) -> None:
        """Count one failed check by ``host``."""
        with self._lock:
            now = self._clock()
            self._peers[host] = (self._tokens(host, now) - 1.0, now)
            self._peers.move_to_end(host)
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)


def throttled(host: str, wait: float) -> str:
    """Why a call from ``host``, throttled for ``wait`` more seconds, was refused."""
    return (f"too many failed token attempts from {host}: wait {wait:.1f} s, then give the "
            "right token (give both sides the same token)")
