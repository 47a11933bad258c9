"""The cloud side of a plan on Ray Serve: one device's partition as a deployment of replicas
(fixed or autoscaled), behind edgesplit's own service.

Devices keep calling a :func:`~edgesplit.runtime.server.partition_server` (the same .proto,
data plane, token, TLS, plan fingerprint and wire format): with ``engine=RayEngine(...)`` that
server is an *ingress*. It authenticates, checks the plan and decodes every request as the
local server does (so bad requests get the same errors), then hands the tensors to the
deployment through its ``DeploymentHandle`` instead of computing them, and forwards to the
next hop (a middle hop of a chain) or answers. Ray's own HTTP and gRPC proxies are not started
(``proxy_location`` ``Disabled``): nothing of Ray faces the devices.

A replica that dies mid-request (killed, its node lost) fails only that attempt: the engine
sends the request again to a live replica, up to ``RayOptions.retries`` times within the
caller's deadline. A partition's compute has no side effects, so a retry cannot duplicate one;
each request is answered once, under its own id.

Health maps onto Ray's: the ingress's gRPC health service says SERVING while the application
is RUNNING in Ray Serve (checked every ``health_period_s``), NOT_SERVING otherwise. Shutdown
is graceful in order: the ingress stops taking requests and finishes those in flight, then the
application is deleted (replicas drain, up to ``graceful_shutdown_timeout_s``), then a cluster
this process started is stopped; one it joined (``address``) is left running.

Ray is an optional dependency (``pip install 'edgesplit[ray]'``); without it the engine
refuses with that command.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch

from edgesplit.errors import ConfigError, option
from edgesplit.runtime.calls import with_retries
from edgesplit.runtime.program import PlanProgram
from edgesplit.transport import BadRequest

__all__ = ["ENGINES", "RAY_INSTALL", "RayEngine", "RayOptions", "cluster_options", "import_ray"]

log = logging.getLogger(__name__)
ENGINES = ("local", "ray")
RAY_INSTALL = "pip install 'edgesplit[ray]'"
RETRY_BACKOFF_S = 0.05  # before sending a request again after its replica died (doubling)
RACE_BACKOFF_S = 0.05  # before building a deployment again after a lost pickle race (doubling)


def import_ray() -> tuple[Any, Any]:
    """``(ray, ray.serve)``, or a ConfigError naming the install command."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError(f"{option('engine', 'ray')} needs Ray Serve, which is not installed: "
                          f"{RAY_INSTALL}") from None
    return ray, serve


@dataclass(frozen=True)
class RayOptions:
    """Where and how the deployment runs. ``max_replicas`` set: autoscaling between
    ``min_replicas`` and it (starting at ``replicas``), aiming at ``target_ongoing`` requests
    per replica; else ``replicas`` fixed."""

    address: str | None = None  # a running cluster ("auto", "HOST:PORT"); None: start one here
    # the interface the cluster started here listens on (the ingress's --host); None: Ray's
    # default, every interface. A cluster joined (address) listens where it was started.
    host: str | None = None
    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing: float = 2.0
    replica_cpus: float = 1.0  # Ray CPUs per replica; its torch threads follow
    replica_gpus: float = 0.0  # Ray GPUs per replica (a fraction shares one); > 0: on cuda
    max_batch: int = 32  # @serve.batch bound (1: no batching)
    max_wait_ms: float = 0.0
    retries: int = 3  # a request's attempts after its replica died
    constructor_retries: int = 3  # Serve's tries at starting a replica before it gives up
    app_name: str | None = None  # default: edgesplit-<plan id>-<device>
    grace_s: float = 5.0  # replicas' graceful shutdown
    health_period_s: float = 2.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"{option('replicas')} must be at least 1")
        if self.min_replicas is not None and self.max_replicas is None:
            raise ConfigError(f"{option('min_replicas')} bounds autoscaling: give "
                              f"{option('max_replicas')} too")
        if self.max_replicas is not None:
            low = 1 if self.min_replicas is None else self.min_replicas
            if low < 0 or self.max_replicas < max(1, low):
                raise ConfigError(f"autoscaling needs 0 <= {option('min_replicas')} <= "
                                  f"{option('max_replicas')} and {option('max_replicas')} >= 1")
        if self.target_ongoing <= 0:
            raise ConfigError(f"{option('target_ongoing')} must be above 0")
        if self.replica_cpus <= 0:
            raise ConfigError(f"{option('replica_cpus')} must be above 0")
        if not self.replica_gpus >= 0:
            raise ConfigError(f"{option('replica_gpus')} must be 0 (the CPU) or more")
        if self.max_batch < 1:
            raise ConfigError(f"{option('max_batch')} must be at least 1")
        if self.constructor_retries < 1:
            raise ConfigError(f"{option('constructor_retries')} must be at least 1")
        if self.max_wait_ms < 0 or self.retries < 0:
            raise ConfigError(f"{option('max_wait_ms')} and {option('retries')} must be 0 or "
                              "more")

    def deployment(self) -> dict[str, Any]:
        """Ray Serve deployment options."""
        opts: dict[str, Any] = {
            "ray_actor_options": {
                "num_cpus": self.replica_cpus,
                # the replica's handler runs on its event loop, not a thread of its own (one
                # hand-off less a request); compute still leaves the loop (asyncio.to_thread)
                "runtime_env": {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}},
            },
            # a replica takes a whole batch at once, and a little more to queue the next
            "max_ongoing_requests": max(8, 2 * self.max_batch),
            "graceful_shutdown_timeout_s": self.grace_s,
            # a replica that cannot load the plan fails the same way every time: say so soon
            "max_constructor_retry_count": self.constructor_retries,
        }
        if self.replica_gpus > 0:  # Ray gives the replica its GPU(s) as CUDA_VISIBLE_DEVICES
            opts["ray_actor_options"]["num_gpus"] = self.replica_gpus
        if self.max_replicas is None:
            opts["num_replicas"] = self.replicas
        else:
            low = 1 if self.min_replicas is None else self.min_replicas
            opts["autoscaling_config"] = {
                "min_replicas": low, "max_replicas": self.max_replicas,
                "initial_replicas": min(max(self.replicas, low), self.max_replicas),
                "target_ongoing_requests": self.target_ongoing}
        return opts

    @property
    def replica_device(self) -> str | None:
        """The torch device a replica computes on: ``cuda`` (the GPU Ray gave it) where it has
        GPUs, else None (the CPU)."""
        return "cuda" if self.replica_gpus > 0 else None


class RayEngine:
    """``device``'s partition of ``program`` deployed on Ray Serve; :meth:`compute` is what a
    partition server (:class:`~edgesplit.runtime.compute.EngineCompute`) calls instead of
    computing."""

    def __init__(self, program: PlanProgram, device: str, options: RayOptions | None = None, *,
                 trust_model_file: bool = False, emulate: bool = False) -> None:
        self.options = options or RayOptions()
        step = program.step(device)
        if step.partition is None:
            raise ConfigError(f"device {device!r} computes nothing in this plan (it only "
                              f"relays): serve it without {option('engine', 'ray')}")
        if step.name == program.sink:
            raise ConfigError(f"device {device!r} joins a star's sources (a mesh's branches); "
                              "the Ray engine serves a chain's devices, a star's sources and a "
                              "mesh's other devices")
        self.ray, self.serve = import_ray()
        self.device = step.name
        self.inputs = tuple(step.partition.inputs)
        self.app_name = self.options.app_name or f"edgesplit-{program.plan_id}-{self.device}"
        self._compute_key = f"{self.device}.compute_ms"
        self._engine_key = f"{self.device}.engine_ms"
        self._emulated_key = f"{self.device}.emulated_ms"
        self.served_by: collections.Counter[str] = collections.Counter()  # replies per replica
        self.retried = 0  # attempts sent again after their replica died
        self._stats_lock = threading.Lock()
        self._own_cluster = False
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._start_cluster()
        self._check_room()
        self.handle = self._deploy(program, trust_model_file, emulate)
        try:
            self.replica_info: dict[str, Any] = self.handle.describe.remote().result(
                timeout_s=60)
        except Exception as exc:
            self.close()
            raise ConfigError(f"the deployment {self.app_name} does not answer: "
                              f"{_first_line(exc)}") from None

    # ---- cluster and deployment ------------------------------------------------------------
    def _start_cluster(self) -> None:
        ray = self.ray
        if not ray.is_initialized():
            init = cluster_options(self.options)
            try:
                with _loopback_node(ray, init.get("_node_ip_address") == _LOOPBACK):
                    ray.init(**init)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                where = self.options.address or "a local cluster"
                raise ConfigError(f"cannot start or join Ray at {where}: {_first_line(exc)}; "
                                  f"check {option('ray_address')} (a running cluster's "
                                  "HOST:PORT or auto)") from None
            self._own_cluster = self.options.address is None
        for name in ("ray.serve", "ray"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # no HTTP proxy: devices reach the deployment only through our ingress (and were one
        # started, it would listen on the ingress's host, not Serve's default of every one)
        http = {"host": self.options.host} if self.options.host else None
        self.serve.start(proxy_location="Disabled", http_options=http)

    def _check_room(self) -> None:
        """Refuse replicas a cluster can never place: Serve would wait for them forever. A
        cluster this engine started cannot grow; one it joined may (an autoscaler), so there
        it is only a warning."""
        opts = self.options
        start = opts.replicas if opts.max_replicas is None else \
            opts.deployment()["autoscaling_config"]["initial_replicas"]
        resources = self.ray.cluster_resources()
        if opts.replica_gpus > 0:
            self._check_gpus(start, float(resources.get("GPU", 0.0)))
        need = start * opts.replica_cpus
        total = float(resources.get("CPU", 0.0))
        if need <= total + 1e-9:
            return
        text = (f"{start} replica(s) x {opts.replica_cpus:g} CPU need {need:g} CPUs; the Ray "
                f"cluster has {total:g}")
        if self._own_cluster:
            self.close(delete=False)
            raise ConfigError(f"{text}: lower {option('replicas')} or {option('replica_cpus')} "
                              f"(a fraction shares a core), or join a larger cluster with "
                              f"{option('ray_address')}")
        log.warning("%s: Serve waits until the cluster has room for them", text)

    def _check_gpus(self, start: int, total: float) -> None:
        """Refuse GPU replicas on a cluster without a GPU (a joined one too: Serve would wait
        for one without a word), or more than a cluster this engine started has; warn where a
        joined cluster has some but too few (it may grow)."""
        opts = self.options
        need = start * opts.replica_gpus
        if need <= total + 1e-9:
            return
        flag = option("replica_gpus", f"{opts.replica_gpus:g}")
        if total == 0:
            self.close(delete=False)
            raise ConfigError(f"{flag}: the Ray cluster has no GPU, so its replicas would wait "
                              f"for one forever; leave out {option('replica_gpus')} or join a "
                              f"cluster with GPUs ({option('ray_address')})")
        text = (f"{start} replica(s) x {opts.replica_gpus:g} GPU need {need:g} GPUs; the Ray "
                f"cluster has {total:g}")
        if self._own_cluster:
            self.close(delete=False)
            raise ConfigError(f"{text}: lower {option('replicas')} or "
                              f"{option('replica_gpus')} (a fraction shares a GPU)")
        log.warning("%s: Serve waits until the cluster has room for them", text)

    def _deploy(self, program: PlanProgram, trust_model_file: bool, emulate: bool) -> Any:
        from edgesplit.runtime.ray_replica import PartitionReplica

        opts = self.options
        if self.app_name in self.serve.status().applications:
            # deploying would replace it under whoever runs it (and our stop would delete it)
            self.close(delete=False)
            raise ConfigError(f"Ray Serve already runs an application {self.app_name!r} (another "
                              f"ingress?): give another {option('app_name')}, or delete it "
                              f"(`serve shutdown`, or ray.serve.delete({self.app_name!r}))")
        deployment = _past_pickle_race(lambda: self.serve.deployment(
            PartitionReplica, name=f"edgesplit-{self.device}").options(**opts.deployment()))
        app = deployment.bind(
            _portable(program).model_dump_json(), self.device,
            backend=program.step(self.device).backend.name, trust_model_file=trust_model_file,
            threads=max(1, int(opts.replica_cpus)), max_batch=opts.max_batch,
            max_wait_ms=opts.max_wait_ms, emulate=emulate, torch_device=opts.replica_device)
        try:
            return self.serve.run(app, name=self.app_name, route_prefix=None,
                                  logging_config={"log_level": "WARNING"})
        except Exception as exc:  # a replica's constructor failed, or the cluster is full
            why = self._replica_failure() or _first_line(exc)
            self.close()
            raise ConfigError(f"Ray Serve could not deploy {self.app_name}: {why}") from None

    def _replica_failure(self) -> str | None:
        """The exception a failed replica raised, from Serve's status (its message holds the
        replica's traceback; the exception is its last line)."""
        try:
            app = self.serve.status().applications[self.app_name]
            messages = [d.message for d in app.deployments.values() if d.message]
        except Exception:
            return None
        for message in messages:
            lines = [line.strip() for line in message.splitlines() if line.strip()]
            errors = [line for line in lines if "Error:" in line or "Exception:" in line]
            if errors:
                return errors[-1][:300]
        return None

    # ---- requests --------------------------------------------------------------------------
    def compute(self, values: dict[str, torch.Tensor], timeout_s: float
                ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """``values`` plus the partition's outputs, computed by a replica, and the timings to
        report (the replica's compute, the hop to it, emulation's sleep)."""
        from edgesplit.runtime.ray_replica import from_arrays, to_arrays

        arrays = to_arrays(values, self.inputs)
        start = time.perf_counter()
        reply = self._call(arrays, start + timeout_s)
        total_ms = (time.perf_counter() - start) * 1e3
        if reply.error is not None:
            raise ReplicaError(reply.error)
        assert reply.outputs is not None
        with self._stats_lock:
            self.served_by[reply.replica] += 1
        timings = {self._compute_key: reply.compute_ms,
                   self._engine_key: max(0.0, total_ms - reply.compute_ms
                                         - (reply.emulated_ms or 0.0))}
        if reply.emulated_ms is not None:
            timings[self._emulated_key] = reply.emulated_ms
        return {**values, **from_arrays(reply.outputs)}, timings

    def _call(self, arrays: dict, deadline: float) -> Any:
        """One request to the deployment (``deadline`` a ``time.perf_counter()`` instant),
        sent again while its replica died under it, the waits between never past the
        deadline."""
        lost = _replica_lost(self.ray)
        from ray.serve.exceptions import BackPressureError

        def attempt(n: int) -> Any:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise self._too_late()
            response = self.handle.remote(arrays)
            try:
                return response.result(timeout_s=left)
            except TimeoutError:
                response.cancel()
                raise self._too_late() from None
            except BackPressureError:
                raise BadRequest(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"device {self.device!r}: every Ray replica is busy") from None

        def died(exc: Exception) -> bool:  # asked only when it will be sent again
            if not isinstance(exc, lost):
                return False
            with self._stats_lock:
                self.retried += 1
            log.warning("device %s: a replica died under a request; sending it again",
                        self.device)
            return True

        try:  # the router may not know yet: the backoff gives it a moment
            return with_retries(attempt, retries=self.options.retries,
                                base_s=RETRY_BACKOFF_S, retryable=died, until=deadline)
        except lost as exc:
            raise BadRequest(grpc.StatusCode.UNAVAILABLE,
                             f"device {self.device!r}: its Ray replica died and "
                             f"{self.options.retries} retries failed: "
                             f"{_first_line(exc)}") from None

    def _too_late(self) -> BadRequest:
        return BadRequest(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"device {self.device!r}: the Ray deployment did not answer within "
                          "the caller's deadline")

    # ---- health and shutdown ---------------------------------------------------------------
    def healthy(self) -> bool:
        """Whether Ray Serve reports the application RUNNING."""
        try:
            app = self.serve.status().applications.get(self.app_name)
        except Exception:  # the controller is unreachable: not serving
            return False
        return app is not None and str(app.status).endswith("RUNNING")

    def watch(self, on_change: Callable[[bool], None]) -> None:
        """Call ``on_change(healthy)`` whenever Ray's view of the application changes."""
        def loop() -> None:
            last: bool | None = None
            while not self._watch_stop.is_set():
                now = self.healthy()
                if now != last and not self._watch_stop.is_set():
                    on_change(now)
                    last = now
                self._watch_stop.wait(self.options.health_period_s)

        self._watcher = threading.Thread(target=loop, name="edgesplit-ray-health", daemon=True)
        self._watcher.start()

    def stop_watching(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)

    def close(self, *, delete: bool = True) -> None:
        """Delete the application (replicas drain), and stop a cluster this engine started."""
        self.stop_watching()
        try:
            if delete and self.app_name in self.serve.status().applications:
                self.serve.delete(self.app_name)
        except Exception as exc:  # the cluster went first: nothing left to drain
            log.warning("deleting %s: %s", self.app_name, _first_line(exc))
        if self._own_cluster:
            self.serve.shutdown()
            self.ray.shutdown()
            self._own_cluster = False


class ReplicaError(Exception):
    """A replica's compute failed (its exception's type and message)."""


_LOOPBACK = "127.0.0.1"
_EVERY_INTERFACE = ("", "0.0.0.0", "::", "[::]")


def cluster_options(options: RayOptions) -> dict[str, Any]:
    """``ray.init``'s keywords. A cluster started here gets the ingress's host as its node
    address, which its processes (GCS, raylet, workers, agents) listen on instead of every
    interface; a host name is resolved (Ray takes an address), and a loopback host (127.x,
    localhost) becomes 127.0.0.1. Every interface, or joining a cluster: Ray's default."""
    init: dict[str, Any] = {"address": options.address, "include_dashboard": False,
                            "log_to_driver": False, "logging_level": logging.WARNING}
    host = options.host
    if options.address is not None or host is None or host in _EVERY_INTERFACE:
        return init
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.gethostbyname(host))
        except OSError as exc:
            raise ConfigError(f"cannot resolve host {host!r} for the Ray cluster: {exc}; give "
                              "an address") from None
    node = _LOOPBACK if address.is_loopback else str(address)
    init.update(_node_ip_address=node, dashboard_host=node)
    return init


@contextmanager
def _loopback_node(ray: Any, loopback: bool) -> Iterator[None]:
    """Keep a loopback node address loopback while ``ray.init`` starts the cluster.

    Ray replaces a loopback node address with the machine's external one (so that other nodes
    could join), and its processes then listen there, reachable from the network, unless its
    clusters are switched off, as on macOS and Windows (``ray_constants.ENABLE_RAY_CLUSTER``,
    read when the address is resolved): switched off here for this call only. A single-node
    cluster is all the engine starts. Checked by hand with ``ss -ltnp`` (Ray 2.60): GCS,
    raylet, workers and agents on 127.0.0.1, against every interface without it. Ray Serve's
    replicas still open their inter-deployment gRPC port on ``[::]:0``, which Ray fixes (no
    option reaches it)."""
    constants: Any = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if not loopback or not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    before = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = before


def _replica_lost(ray: Any) -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the replica went away", not "the request failed"."""
    from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError

    return (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
            ReplicaUnavailableError, DeploymentUnavailableError)


def _portable(program: PlanProgram):
    """The plan with a relative ``.pt2`` source made absolute (replicas may run elsewhere
    than this process's folder, and are sent the plan, not its file)."""
    plan = program.plan
    source = plan.model.local_source
    if source.endswith(".pt2") and not Path(source).is_absolute() and Path(source).exists():
        model = plan.model.model_copy(update={"source": str(Path(source).resolve())})
        return plan.model_copy(update={"model": model})
    return plan


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _past_pickle_race(make: Callable[[], Any], attempts: int = 5) -> Any:
    """``make()``, tried again where Ray lost a race with itself: each DeploymentConfig
    Serve builds registers its request router's module with cloudpickle, pickles it and
    unregisters it, in one process-wide table, so a config built on another thread at the
    same moment (a live handle's router, say) can unregister it first and the second
    unregister raises ValueError ("... is not registered for pickle by value"). Nothing was
    deployed yet, so building the deployment again is safe."""
    return with_retries(lambda _: make(), retries=attempts - 1, base_s=RACE_BACKOFF_S,
                        retryable=lambda exc: isinstance(exc, ValueError)
                        and "registered for pickle by value" in str(exc))
