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
           "read_secret", "read_token", "sent_bearer", "throttled", "token_matches"]

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


def sent_bearer(metadata: Iterable[tuple[str, str | bytes]]) -> bytes:
    """The ``authorization`` value a call's metadata carries (empty when none), as bytes."""
    sent = dict(metadata).get("authorization", "")
    return sent if isinstance(sent, bytes) else sent.encode()


def token_matches(metadata: Iterable[tuple[str, str | bytes]], token: str) -> bool:
    """Whether a call's metadata carries ``token``, compared in constant time (the comparison
    must not tell an attacker how much of a guess was right)."""
    return hmac.compare_digest(sent_bearer(metadata), f"Bearer {token}".encode())


def peer_host(peer: str) -> str:
    """The host of a peer as gRPC (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) or the data plane
    (``tcp:1.2.3.4:5``) names it: the part failed attempts are counted by."""
    kind, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if kind in ("ipv4", "ipv6", "tcp") else peer
    return host.strip("[]") or peer


class AuthThrottle:
    """Failed token checks counted so that guessing stays slow and a right token goes through,
    even from an address a guesser shares.

    Keying: a failure counts against its caller's *host* (:func:`peer_host`: the address,
    never the port, as a guesser opens connections at will) and against the *bucket* the
    credential it sent falls in: one of ``spread`` per host, chosen by a hash keyed with a
    secret of this throttle's own, so that nobody can tell offline which tokens share a
    bucket. Each (host, bucket) is a token bucket: ``burst`` failures at once, then one every
    ``interval_s``; a call whose (host, bucket) is empty is refused without its token being
    compared. A caller (gRPC, the data plane, an HTTP API) calls :meth:`check` with the host
    and the credential exactly as sent (the whole ``Authorization`` value), or
    :meth:`wait_s` before comparing and :meth:`failed` after a mismatch, with the same two.

    What it guarantees, per host (with the defaults: 16 buckets of 10, one back a second):

    * guesses: at most ``spread * burst`` tokens are compared at once and ``spread /
      interval_s`` a second after that (160, then 16 a second); every other wrong token is
      refused uncompared. A right token that is never refused would make every answer an
      oracle: here it is refused whenever its own bucket is empty, like any guess in it.
    * the right token: its bucket empties only by wrong tokens that fall in it. A guesser
      does not know which bucket that is (knowing it is knowing a hash of the token), so
      its guesses land there at ``1 / spread`` of its rate, and the bucket empties only
      while the host sends wrong tokens at about ``spread / interval_s`` a second or faster
      -- the rate that already gets it the most guesses the throttle allows. Simulated with
      the defaults, a right token each second from a host sending 3 or 8 wrong tokens a
      second was never refused in five hours; at 12 a second 0.1 % of the time, at 16 4 %,
      at 32 73 %. For the same bound on guesses nothing can do better for a client that
      shares an address with a faster guesser and has only the token to tell it apart:
      refusing it less often would answer more guesses.

    Successes release nothing: a bucket refilled by the right token would tell a guesser
    which bucket the token is in. At most ``max_peers`` (host, bucket) pairs are remembered,
    the least recently failed forgotten first. ``spread=1`` keys by host alone (a guesser
    then locks out the right token from its address after ``burst`` failures)."""

    def __init__(self, burst: int = 10, interval_s: float = 1.0, max_peers: int = 4096,
                 clock: Callable[[], float] = time.monotonic, spread: int = 16) -> None:
        if burst < 1 or interval_s <= 0 or max_peers < 1 or spread < 1:
            raise ConfigError(f"an auth throttle needs burst, max_peers and spread of at least "
                              f"1 and a positive interval_s; got burst={burst}, interval_s="
                              f"{interval_s}, max_peers={max_peers}, spread={spread}")
        self.burst, self.interval_s, self.max_peers = burst, interval_s, max_peers
        self.spread = spread
        self._clock = clock
        self._secret = os.urandom(16)  # per throttle: which tokens share a bucket is unknowable
        self._peers: OrderedDict[tuple[str, int], tuple[float, float]] = OrderedDict()
        self._failing: dict[str, int] = {}  # buckets remembered per host: the fast path
        self._lock = threading.Lock()

    def key(self, host: str, sent: str | bytes = b"") -> tuple[str, int]:
        """What a failure of ``sent`` from ``host`` counts against: the host and the bucket
        ``sent`` (the credential as the caller sent it) falls in."""
        raw = sent.encode() if isinstance(sent, str) else sent
        digest = hmac.digest(self._secret, raw, "sha256")
        return host, int.from_bytes(digest[:8], "big") % self.spread

    def _tokens(self, key: tuple[str, int], now: float) -> float:
        tokens, then = self._peers.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - then) / self.interval_s)

    def wait_s(self, host: str, sent: str | bytes = b"") -> float:
        """Seconds until ``sent`` from ``host`` may be compared (0: now). One dictionary
        look-up for a host that never failed."""
        if host not in self._failing:
            return 0.0
        key = self.key(host, sent)
        with self._lock:
            if key not in self._peers:
                return 0.0
            return max(0.0, (1.0 - self._tokens(key, self._clock())) * self.interval_s)

    def failed(self, host: str, sent: str | bytes = b"") -> None:
        """Count one failed check of ``sent`` by ``host``."""
        key = self.key(host, sent)
        with self._lock:
            now = self._clock()
            if key not in self._peers:
                self._failing[host] = self._failing.get(host, 0) + 1
            self._peers[key] = (self._tokens(key, now) - 1.0, now)
            self._peers.move_to_end(key)
            while len(self._peers) > self.max_peers:
                self._forget(self._peers.popitem(last=False)[0][0])

    def _forget(self, host: str) -> None:
        left = self._failing[host] - 1
        if left:
            self._failing[host] = left
        else:
            del self._failing[host]

    def check(self, host: str, sent: str | bytes, expected: str | bytes) -> str | None:
        """The whole check of a credential: None when ``sent`` is ``expected`` (compared in
        constant time), else why the call is refused (UNAUTHENTICATED): throttled, with
        ``sent`` left uncompared, or wrong, and then counted."""
        wait = self.wait_s(host, sent)
        if wait > 0:
            return throttled(host, wait)
        raw = sent.encode() if isinstance(sent, str) else sent
        right = expected.encode() if isinstance(expected, str) else expected
        if hmac.compare_digest(raw, right):
            return None
        self.failed(host, sent)
        return WRONG_TOKEN


def throttled(host: str, wait: float) -> str:
    """Why a call from ``host``, throttled for ``wait`` more seconds, was refused."""
    return (f"too many failed token attempts from {host}: wait {wait:.1f} s, then give the "
            "right token (give both sides the same token)")
