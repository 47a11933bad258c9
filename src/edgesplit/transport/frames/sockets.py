"""What both ends of the data plane do to a socket besides framing: bound its sends and
receives by kernel timeouts, the time left to a deadline, closing it, and TLS contexts.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time


def _bound(sock: socket.socket, seconds: float | None) -> None:
    """Bound each send and receive on ``sock`` by ``seconds`` (None: no bound). A plain socket
    stays blocking with kernel timeouts (a Python timeout would poll before every call);
    TLS keeps Python's."""
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(seconds)
        return
    if seconds is None:
        value = struct.pack("ll", 0, 0)  # no timeout
    else:
        whole = int(seconds)
        value = struct.pack("ll", whole, max(1, int((seconds - whole) * 1e6)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already shut down by the peer
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()



def _context(protocol: int, chain: tuple[bytes, bytes] | None = None,
             ca: bytes | None = None) -> ssl.SSLContext:
    import tempfile
    from pathlib import Path

    context = ssl.SSLContext(protocol)
    if ca is not None:
        context.load_verify_locations(cadata=ca.decode())
    if chain is not None:
        with tempfile.TemporaryDirectory() as tmp:  # ssl reads a key pair from files only
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(chain[0])
            key.write_bytes(chain[1])
            key.chmod(0o600)
            context.load_cert_chain(cert, key)
    return context
