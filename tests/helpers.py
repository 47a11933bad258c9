"""Helpers the tests share, imported by name (``from helpers import perturbed``): tests/ is on
the import path (pyproject's ``pythonpath``), so a test in any sub-folder imports them. They
are not in conftest.py because a sub-folder's conftest.py (tests/llm/, tests/runtime/) takes the
module name ``conftest`` while its tests are collected, so ``from conftest import ...`` would
find that one; conftest.py files hold fixtures only."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from edgesplit.graph import LayerGraph, capture

if TYPE_CHECKING:
    from edgesplit.runtime.shell import ServingShell


@functools.cache
def perturbed(model, scale: float = 0.3, seed: int = 1):
    """``model`` with seeded noise added to every parameter, in place (returned): a tiny LM's
    random initialisation makes greedy decoding repeat one token, which would make token
    equality trivial."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def rgb_folder(root, classes=("cat", "dog", "fox"), per_class: int = 8, size: int = 12):
    """An image folder as a user brings one: a sub-folder of RGB PNGs per class, each class a
    little brighter than the last (seeded); returns ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = (rng.random((size, size, 3)) * 80 + 60 * c).astype(np.uint8)
            Image.fromarray(pixels, "RGB").save(root / name / f"{i}.png")
    return root


def captured(name: str, optimize: bool = True) -> LayerGraph:
    return capture(name, optimize=optimize)


def self_signed(folder):
    """A self-signed certificate for localhost and 127.0.0.1 (the openssl command line):
    (server TlsFiles, client TlsFiles trusting it)."""
    import subprocess

    from edgesplit.transport import TlsFiles

    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return (TlsFiles(cert=cert.read_bytes(), key=key.read_bytes()),
            TlsFiles(ca=cert.read_bytes()))


def write_idx(path, array) -> None:
    """``array`` as a gzipped IDX file of unsigned bytes (the MNIST format)."""
    import gzip

    header = bytes([0, 0, 8, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + array.astype("uint8").tobytes())


def fake_fashion_mnist(root, train: int, test: int, seed: int = 0):
    """A folder in Fashion-MNIST's format (random 28x28 images, labels cycling 0..9), to point
    EDGESPLIT_FASHION_MNIST at; returns ``root``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("t10k", test)):
        write_idx(root / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


class Relay:
    """A TCP relay on 127.0.0.1 that reaches ``port`` *from* ``source`` (another loopback
    address, 127.0.0.2 and up): a gRPC or data-plane client dialling ``address`` is seen by
    the server as a caller on another host, which a client cannot choose itself."""

    def __init__(self, port: int, source: str) -> None:
        import socket
        import threading

        self._port, self._source = port, source
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                inner, _ = self._listener.accept()
            except OSError:
                return  # closed
            outer = socket.create_connection(("127.0.0.1", self._port),
                                             source_address=(self._source, 0))
            for a, b in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        import contextlib
        import socket

        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        for sock in (src, dst):  # either side gone: the relayed connection ends
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        src.close()  # the other pump closes dst

    def close(self) -> None:
        self._listener.close()


def server_for(plan, device: str, **options):
    """A server of ``device`` of ``plan``, not started: a PlanProgram's partition server
    (``runtime.server.partition_server``), an LLM plan's stage server
    (``llm.stage.server.llm_stage_server``). The ``ServeOptions`` fields among ``options``
    (``token``, ``tls``, ``shape``, ``max_workers``, ``data_port``, ...) go to its shell, the
    rest to the assembly (``next_address``, ``max_batch``, ``engine``, ``model``, ...). Leaving
    a ``with`` block stops it at once; ``listening`` starts one on a port."""
    from dataclasses import fields

    from edgesplit.runtime import PlanProgram
    from edgesplit.runtime.options import ServeOptions

    names = {f.name for f in fields(ServeOptions)}
    shell = ServeOptions(**{k: options.pop(k) for k in list(options) if k in names})
    if isinstance(plan, PlanProgram):
        from edgesplit.runtime.server import partition_server

        return partition_server(plan, device, shell, **options)
    from edgesplit.llm.stage.server import llm_stage_server

    return llm_stage_server(plan, device, shell, **options)


def free_port() -> int:
    """A free port on 127.0.0.1 below the kernel's ephemeral range, for a server that binds it
    later (a subprocess's ``--port``) or an address where nobody listens: a port-0 socket (a
    server's data plane, a client) cannot take it between this choice and its use."""
    import random
    import socket
    from pathlib import Path

    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pick = random.SystemRandom()
    for _ in range(100):
        port = pick.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 10000-{low}")


def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0,
               interval_s: float = 0.01) -> bool:
    """Whether ``predicate()`` holds within ``timeout_s``, polled every ``interval_s`` (no guess
    at this machine's speed): true as soon as it does, else its value at the deadline. The test
    asserts it, with its own message: ``assert wait_until(lambda: server.idle), "..."``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval_s)
    return True


@contextlib.contextmanager
def listening(plan, device: str, **options) -> Iterator[tuple[ServingShell, str]]:
    """``server_for(plan, device, **options)`` started on 127.0.0.1 at a free port: yields (the
    server, its ``"127.0.0.1:PORT"`` gRPC address) and stops it at once (no grace) when the
    block ends, however it ends."""
    server = server_for(plan, device, **options)
    address = f"127.0.0.1:{server.start('127.0.0.1', 0)}"
    try:
        yield server, address
    finally:
        server.stop(0)
