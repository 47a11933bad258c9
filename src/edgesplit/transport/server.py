"""The base every edgesplit gRPC server shares."""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc

from edgesplit.errors import ConfigError, option
from edgesplit.transport.auth import AuthThrottle, peer_host, sent_bearer
from edgesplit.transport.channel import server_options
from edgesplit.transport.limits import ConnectionLimits
from edgesplit.transport.loopback import LoopbackChannel, LoopbackServer
from edgesplit.transport.tls import TlsFiles, check_tls_pair

__all__ = ["LIGHT_WORKERS", "GrpcServer", "serve_forever"]

T = TypeVar("T")
log = logging.getLogger(__name__)
LIGHT_WORKERS = 4  # threads of their own for health checks and Describe


class GrpcServer:
    """What every edgesplit gRPC server shares: a thread pool with our message limit, the
    standard health service, listening with or without TLS, graceful stop and the bearer-token
    check. Subclasses call :meth:`_init_grpc` with a function registering their servicer.

    Health checks and every service's unary ``Describe`` run on ``LIGHT_WORKERS`` threads of
    their own: they answer while ``max_workers`` requests (or idle streams) hold every
    worker. Failed token checks are throttled per peer host and token bucket
    (:class:`AuthThrottle`), and a stream silent for ``limits.idle_s`` between requests is
    cancelled (:meth:`idle_limited`)."""

    token: str | None = None
    tls: TlsFiles | None = None
    limits: ConnectionLimits = ConnectionLimits()

    def _init_grpc(self, add_servicer: Callable[[grpc.Server], None], limit: int,
                   max_workers: int) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc

        self._add_servicer, self._limit = add_servicer, limit
        self.throttle = AuthThrottle()
        self._idle_watch = _IdleWatch(self.limits.idle_s)
        self._light = futures.ThreadPoolExecutor(max_workers=LIGHT_WORKERS,
                                                 thread_name_prefix="edgesplit-grpc-light")
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                                   options=server_options(limit),
                                   interceptors=[_OwnPool(self._light)])
        add_servicer(self._server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.port: int | None = None

    def loopback_channel(self, peer: str = "loopback") -> LoopbackChannel:
        """A channel that calls this server's servicer in-process (no socket, no
        :meth:`start` needed): what tests and single-process runs use. Its calls come from
        ``peer`` (a test may name another host: ``ipv4:10.0.0.2:5000``)."""
        collector = LoopbackServer()
        self._add_servicer(collector)  # type: ignore[arg-type]  # it takes what the stub adds
        return LoopbackChannel(collector.handlers, self._limit, peer)

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port (0 = any free port); returns the port."""
        address = f"{host}:{port}"
        tls = self.tls
        creds = None
        if tls is not None and (tls.cert is not None or tls.key is not None):
            check_tls_pair(tls)  # both present from here on
            assert tls.key is not None and tls.cert is not None
            creds = grpc.ssl_server_credentials([(tls.key, tls.cert)])
        # gRPC's C core logs a failed bind on stderr itself (``E... add_port.cc] Failed to add
        # port ...``) before returning 0: held back, so our one line below is all a user sees
        with _held_back_stderr() as held:
            try:
                self.port = (self._server.add_insecure_port(address) if creds is None
                             else self._server.add_secure_port(address, creds))
            except RuntimeError:  # grpc's "Failed to bind to address" (no port number returned)
                self.port = 0
            held.keep = bool(self.port)  # failed: our one line below replaces gRPC's log
        if not self.port:
            raise ConfigError(f"cannot listen on {address}: {_bind_failure(held.text)}")
        self._server.start()
        return self.port

    def stop(self, grace_s: float = 5.0) -> None:
        """Finish requests in flight (up to ``grace_s``), refuse new ones."""
        from grpc_health.v1 import health_pb2

        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._server.stop(grace_s).wait()
        self._light.shutdown(wait=False)

    def wait(self) -> None:
        self._server.wait_for_termination()

    def check_token(self, context: grpc.ServicerContext) -> None:
        """Abort the call UNAUTHENTICATED unless it carries the token; one whose host sent
        tokens like it wrong too often lately is refused without its token being compared
        (:class:`AuthThrottle`)."""
        if self.token is None:
            return
        why = self.throttle.check(peer_host(context.peer()),
                                  sent_bearer(context.invocation_metadata()),
                                  f"Bearer {self.token}")
        if why is not None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    def idle_limited(self, requests: Iterable[T], context: grpc.ServicerContext
                     ) -> Iterator[T]:
        """A stream's requests as they come; the call is cancelled (and this ends) when the
        client sends nothing for ``limits.idle_s`` between two (an idle stream would hold a
        worker forever)."""
        watch, it = self._idle_watch, iter(requests)
        while True:
            watch.wait_from(context)
            try:
                request = next(it)
            except (StopIteration, grpc.RpcError):  # the client ended, or the call was cancelled
                return
            finally:
                watch.done(context)
            yield request


def _light(method: str) -> bool:
    return method == "/grpc.health.v1.Health/Check" or method.endswith("/Describe")


class _OwnPool(grpc.ServerInterceptor):
    """Runs the unary health check and ``Describe`` on ``pool`` (gRPC's
    ``experimental_thread_pool`` on a handler's behaviour), every other call on the server's."""

    def __init__(self, pool: futures.ThreadPoolExecutor) -> None:
        self.pool = pool
        self._wrapped: dict[str, tuple[Any, Any]] = {}  # method -> (its handler, wrapped)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming \
                or not _light(details.method):
            return handler
        known = self._wrapped.get(details.method)
        if known is None or known[0] is not handler:
            behaviour = handler.unary_unary

            def run(request: Any, context: grpc.ServicerContext) -> Any:
                return behaviour(request, context)

            run.experimental_thread_pool = self.pool  # type: ignore[attr-defined]
            known = self._wrapped[details.method] = (handler,
                                                     handler._replace(unary_unary=run))
        return known[1]


class _IdleWatch:
    """Cancels the gRPC calls that wait for their client's next message longer than
    ``idle_s``; its thread runs only while some call waits."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._waiting: dict[Any, float] = {}  # context -> when it is cancelled
        self._lock = threading.Lock()
        self._running = False

    def wait_from(self, context: Any) -> None:
        with self._lock:
            self._waiting[context] = time.monotonic() + self.idle_s
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="edgesplit-grpc-idle",
                                 daemon=True).start()

    def done(self, context: Any) -> None:
        with self._lock:
            self._waiting.pop(context, None)

    def _run(self) -> None:
        while True:
            time.sleep(min(self.idle_s / 4, 1.0))
            now = time.monotonic()
            with self._lock:
                expired = [c for c, at in self._waiting.items() if at <= now]
                for context in expired:
                    del self._waiting[context]
                stop = not self._waiting
                if stop:
                    self._running = False
            for context in expired:
                try:
                    context.cancel()
                except Exception:  # a call that ended meanwhile: nothing to cancel
                    log.debug("cancelling an idle call failed", exc_info=True)
            if stop:
                return


class _Held:
    """What :func:`_held_back_stderr` caught: ``text``, and ``keep`` (False: gRPC's own log
    lines in it are dropped rather than written out)."""

    def __init__(self) -> None:
        self.text, self.keep = "", True


# gRPC's C core logs as absl does ("E1127 20:40:18.674275   15207 add_port.cc:83] ..."), and
# its first line in a process may be absl's notice that logging was not initialised
_GRPC_LOG_LINE = re.compile(rb"^(?:[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.-]+:\d+\] |"
                            rb"WARNING: All log messages before absl::InitializeLog)")
_STDERR_LOCK = threading.Lock()  # two servers starting at once must not swap fd 2 crosswise


@contextmanager
def _held_back_stderr() -> Iterator[_Held]:
    """Point file descriptor 2 (where gRPC's C core logs) at a temporary file for the block;
    afterwards the text is in ``held.text`` and written to the real stderr, less gRPC's log
    lines where the block set ``held.keep = False`` (what other threads wrote is never lost).
    Nothing is held back where fd 2 cannot be duplicated."""
    held = _Held()
    with _STDERR_LOCK:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):
            yield held
            return
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield held
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                caught = tmp.read()
                held.text = caught.decode(errors="replace")
                if not held.keep:
                    caught = b"".join(line for line in caught.splitlines(keepends=True)
                                      if not _GRPC_LOG_LINE.match(line))
                if caught:
                    os.write(2, caught)


def _bind_failure(log: str) -> str:
    """Why a bind failed and what to change, from gRPC's log of it where that names the cause."""
    if "Address already in use" in log:
        return f"the port is in use (another server?); pick another {option('port')}"
    if "Cannot assign requested address" in log:
        return f"the host is not a local address; pick another {option('host')}"
    if "Permission denied" in log:
        return (f"permission denied (ports below 1024 need privileges); pick another "
                f"{option('port')}")
    return (f"the port is in use (another server?) or the host is not a local address; pick "
            f"another {option('port')}")


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
