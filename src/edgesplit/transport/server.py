"""The base every edgesplit gRPC server shares."""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc

from edgesplit.errors import ConfigError, option
from edgesplit.transport.auth import token_matches
from edgesplit.transport.channel import server_options
from edgesplit.transport.loopback import LoopbackChannel, LoopbackServer
from edgesplit.transport.tls import TlsFiles, check_tls_pair

__all__ = ["GrpcServer", "serve_forever"]


class GrpcServer:
    """What every edgesplit gRPC server shares: a thread pool with our message limit, the
    standard health service, listening with or without TLS, graceful stop and the bearer-token
    check. Subclasses call :meth:`_init_grpc` with a function registering their servicer."""

    token: str | None = None
    tls: TlsFiles | None = None

    def _init_grpc(self, add_servicer: Callable[[grpc.Server], None], limit: int,
                   max_workers: int) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc

        self._add_servicer, self._limit = add_servicer, limit
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                                   options=server_options(limit))
        add_servicer(self._server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.port: int | None = None

    def loopback_channel(self) -> LoopbackChannel:
        """A channel that calls this server's servicer in-process (no socket, no
        :meth:`start` needed): what tests and single-process runs use."""
        collector = LoopbackServer()
        self._add_servicer(collector)  # type: ignore[arg-type]  # it takes what the stub adds
        return LoopbackChannel(collector.handlers, self._limit)

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port (0 = any free port); returns the port."""
        address = f"{host}:{port}"
        try:
            tls = self.tls
            if tls is not None and (tls.cert is not None or tls.key is not None):
                check_tls_pair(tls)  # both present from here on
                assert tls.key is not None and tls.cert is not None
                creds = grpc.ssl_server_credentials([(tls.key, tls.cert)])
                self.port = self._server.add_secure_port(address, creds)
            else:
                self.port = self._server.add_insecure_port(address)
        except RuntimeError:  # grpc's "Failed to bind to address" (no port number returned)
            self.port = 0
        if not self.port:
            raise ConfigError(f"cannot listen on {address}: the port is in use (another server?) "
                              f"or the host is not a local address; pick another {option('port')}")
        self._server.start()
        return self.port

    def stop(self, grace_s: float = 5.0) -> None:
        """Finish requests in flight (up to ``grace_s``), refuse new ones."""
        from grpc_health.v1 import health_pb2

        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._server.stop(grace_s).wait()

    def wait(self) -> None:
        self._server.wait_for_termination()

    def check_token(self, context: grpc.ServicerContext) -> None:
        if self.token is not None and not token_matches(context.invocation_metadata(),
                                                        self.token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "missing or wrong bearer token (give both sides the same token)")


def serve_forever(server: GrpcServer) -> None:  # pragma: no cover - exercised via the CLI
    """Block until SIGINT/SIGTERM, then stop gracefully."""
    import signal
    import threading

    from edgesplit.hardware.threads import release_thread_pool

    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    # this thread loaded the model and now only waits: its OpenMP team would otherwise make
    # libgomp throttle the team of the thread that computes (hardware/threads.py)
    release_thread_pool()
    # a timed wait: the kernel may deliver the signal to another of the process's threads, and
    # Python runs its handler only when the main thread runs bytecode; an untimed wait on a
    # lock never returns then (a served process once ignored SIGTERM this way)
    while not done.wait(0.25):
        pass
    server.stop()
