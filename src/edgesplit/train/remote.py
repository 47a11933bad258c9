"""Real two-process split training over gRPC, as in L2S (paper 002, Sec. III-A and IV-C).

The end device (:class:`RemoteSplitTrainer`) holds chain elements ``[0..cut]`` of the model, the
edge server (:class:`TrainServer`) the rest; cut ``len(chain) - 1`` is pure on-device training
(no RPC). Each round the device runs the front forward, sends the activation and the labels
(``Step``), the server runs the back forward, backward and update and returns the gradient at
the cut (computed before its update), and the device finishes the backward pass and updates.

Both sides keep a full copy of the chain, built from the same factory and seed (``Hello``
checks a SHA-256 fingerprint), and a ``base`` snapshot of the parameters taken at the last
sync. A sync over chain elements S sends, per element, ``params - base`` from each side that
trained it since the last sync; both sides then set ``params = base + delta_device +
delta_server`` (no update is lost; both compute it in the same order, so the copies stay
bit-identical; a side that alone trained an element sends its parameters themselves, i.e.
base + delta without float32 rounding, at the same size) and the element's owner under the
last round's cut sends its buffers (batch-norm statistics) and its SGD momentum, which only
the owner keeps current (a side taking over an element with a momentum from long ago would
push it with stale gradients). Two policies:

* ``fws`` (L2S-FWS): when the cut changes, the elements that change sides are synced before
  the round. No element is then trained on both sides between syncs, so this is exactly
  unsplit training (SGD with or without momentum).
* ``periodic`` (L2S): cut changes send nothing, each side trains its possibly stale copy;
  every ``sync_every`` rounds and on :meth:`RemoteSplitTrainer.sync_now`, the elements trained
  on both sides since the last sync are merged.

The device emulates the link for both directions (:class:`LinkShaper`); the bandwidth may
change at any round (:meth:`RemoteSplitTrainer.set_bandwidth_mbps`). The server serves one
training session at a time: a ``Hello`` resets it to the initial model.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Self

import grpc
import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError, RemoteError, WireError
from edgesplit.hardware import Link
from edgesplit.quant.wire import decode_tensor, encode_tensor
from edgesplit.runtime.shaping import LinkShaper
from edgesplit.runtime.transport import GrpcServer, TlsFiles, open_channel
from edgesplit.train.proto import edgesplit_train_pb2 as pb
from edgesplit.train.proto import edgesplit_train_pb2_grpc as pb_grpc
from edgesplit.train.split import as_chain, tensor_bytes

__all__ = ["PROTOCOL_VERSION", "SYNC_POLICIES", "RemoteSplitTrainer", "RoundStats",
           "SyncResult", "TrainServer", "model_fingerprint", "serve_training", "untrained_model"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
SYNC_POLICIES = ("periodic", "fws")
OPTIM_PREFIX = "optim:"  # buffer entries that carry an element's SGD momentum
MESSAGE_LIMIT = 512 * 1024 * 1024  # activations of a large batch; gRPC refuses bigger ones
Tensors = dict[str, torch.Tensor]
Update = tuple[Tensors, bool]  # (params or deltas by name, absolute)


# ---- shared pieces -------------------------------------------------------------------------
def model_fingerprint(chain: Sequence[nn.Module]) -> str:
    """SHA-256 of every parameter and buffer of ``chain`` (names, dtypes, shapes, values)."""
    h = hashlib.sha256()
    for i, module in enumerate(chain):
        for name, t in module.state_dict().items():
            t = t.detach().cpu().contiguous()
            h.update(f"{i}.{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _Replica:
    """One side's copy of the chain: its optimizer, the base snapshot of the last sync and the
    elements it trained since then."""

    def __init__(self, model: nn.Module, lr: float, momentum: float) -> None:
        self.model, self.chain = model, as_chain(model)
        unique = {id(p): p for p in model.parameters() if p.requires_grad}
        self.opt = torch.optim.SGD(list(unique.values()), lr=lr, momentum=momentum) \
            if unique else None
        self.base = {i: {n: p.detach().clone() for n, p in m.named_parameters()}
                     for i, m in enumerate(self.chain)}
        self.trained: set[int] = set()

    def part(self, lo: int, hi: int) -> nn.Sequential:
        return nn.Sequential(*self.chain[lo:hi]).train()

    def backward_and_step(self, start: torch.Tensor, grad: torch.Tensor | None,
                          elements: range) -> None:
        """Back-propagate from ``start`` (with ``grad``, or a scalar loss) and update only the
        parameters that got a gradient (SGD skips the others, momentum included)."""
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        if start.requires_grad:
            start.backward(grad)
        if self.opt is not None:
            self.opt.step()
        self.trained.update(elements)

    def updates(self, indices: Iterable[int], other_trained: set[int]) -> dict[int, Update]:
        """What this side sends for each element of ``indices`` it trained: params - base if
        the other side trained it too, else the params themselves (= base + delta, exactly)."""
        result = {}
        for i in indices:
            if i in self.trained:
                both = i in other_trained
                result[i] = ({n: p.detach() - self.base[i][n] if both else p.detach().clone()
                              for n, p in self.chain[i].named_parameters()}, not both)
        return result

    def buffers(self, i: int) -> Tensors:
        """Element ``i``'s buffers and its optimizer momentum (``optim:<param>``): the state
        that only its owner keeps current, sent with it so training continues exactly."""
        state = {n: b.detach() for n, b in self.chain[i].named_buffers()}
        for name, p in self.chain[i].named_parameters():
            buf = self.opt.state.get(p, {}).get("momentum_buffer") if self.opt else None
            if buf is not None:
                state[OPTIM_PREFIX + name] = buf.detach()
        return state

    def _set_momentum(self, i: int, state: Tensors) -> None:
        """Take the owner's momentum for element ``i`` (none sent: the owner has none)."""
        if self.opt is None:
            return
        for name, p in self.chain[i].named_parameters():
            buf = state.get(OPTIM_PREFIX + name)
            if buf is None:
                self.opt.state.pop(p, None)
            else:
                self.opt.state[p]["momentum_buffer"] = buf.clone()

    def merge(self, i: int, updates: Sequence[Update | None], buffers: Tensors | None) -> None:
        """params = base + delta_device + delta_server (in that order on both sides, so the
        copies stay identical); one side's absolute params are taken as they are."""
        sent = [u for u in updates if u is not None and u[0]]
        with torch.no_grad():
            for name, p in self.chain[i].named_parameters():
                base = self.base[i][name]
                if len(sent) == 1 and sent[0][1]:
                    new = sent[0][0][name].clone()
                else:
                    new = base.clone()
                    for values, absolute in sent:
                        new += values[name] - base if absolute else values[name]
                p.copy_(new)
                self.base[i][name] = new
            for name, b in self.chain[i].named_buffers() if buffers else ():
                b.copy_(buffers[name])
        if buffers is not None:
            self._set_momentum(i, buffers)
        self.trained.discard(i)

    def check_state(self, i: int, params: Tensors, buffers: Tensors) -> str | None:
        """Why (params, buffers) do not fit element ``i``, or None."""
        named = dict(self.chain[i].named_parameters())
        momentum = {k: v for k, v in buffers.items() if k.startswith(OPTIM_PREFIX)}
        buffers = {k: v for k, v in buffers.items() if not k.startswith(OPTIM_PREFIX)}
        own_buffers = {n: b for n, b in self.chain[i].named_buffers()}
        unknown = {k.removeprefix(OPTIM_PREFIX) for k in momentum} - set(named)
        if unknown:
            return f"element {i} has no parameters {sorted(unknown)} for optimizer state"
        momentum = {k.removeprefix(OPTIM_PREFIX): v for k, v in momentum.items()}
        for sent, own in ((params, named), (buffers, own_buffers), (momentum, named)):
            if sent is not momentum and sent and set(sent) != set(own):
                return f"element {i} has tensors {sorted(own)}, got {sorted(sent)}"
            for name, t in sent.items():
                if t.shape != own[name].shape:
                    return (f"element {i} tensor {name!r} has shape {list(own[name].shape)}, "
                            f"got {list(t.shape)}")
        return None


def _layer_msg(index: int, update: Update | None, buffers: Tensors | None) -> pb.LayerState:
    params, absolute = update or ({}, False)
    msg = pb.LayerState(index=index, absolute=absolute)
    for name, t in params.items():
        msg.params.add(name=name, data=encode_tensor(t, 32))
    for name, t in (buffers or {}).items():
        msg.buffers.add(name=name, data=encode_tensor(t, 32))
    return msg


def _read_layer(msg: pb.LayerState) -> tuple[Update, Tensors]:
    return (({t.name: decode_tensor(t.data) for t in msg.params}, msg.absolute),
            {t.name: decode_tensor(t.data) for t in msg.buffers})


def _payload(states: Iterable[Tensors | None]) -> int:
    return sum(tensor_bytes(t) for s in states if s for t in s.values())


def _assign(module: nn.Module, params: Tensors, buffers: Tensors) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])
        for name, b in module.named_buffers():
            b.copy_(buffers[name])  # optimizer state (OPTIM_PREFIX) is not part of a model


# ---- server --------------------------------------------------------------------------------
class _BadRequest(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _decode(data: bytes, what: str) -> torch.Tensor:
    try:
        return decode_tensor(data)
    except WireError as exc:
        raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {exc}") from None


class _Servicer(pb_grpc.SplitTrainServiceServicer):
    def __init__(self, server: TrainServer) -> None:
        self.s = server

    def _handle(self, handler, request, context):
        self.s.check_token(context)
        try:
            with self.s.lock:
                return handler(request)
        except _BadRequest as exc:
            context.abort(exc.code, str(exc))
        except Exception as exc:  # this request fails, the server goes on
            log.exception("training server failed on a request")
            context.abort(grpc.StatusCode.INTERNAL,
                          f"training server failed: {type(exc).__name__}: {exc}")

    def Hello(self, request, context):
        return self._handle(self.s.hello, request, context)

    def Step(self, request, context):
        return self._handle(self.s.step, request, context)

    def Sync(self, request, context):
        return self._handle(self.s.sync, request, context)

    def Fetch(self, request, context):
        return self._handle(self.s.fetch, request, context)


class TrainServer(GrpcServer):
    """The edge server of split training: trains the chain elements after the device's cut.

    ``chain_factory`` is called after ``torch.manual_seed(seed)`` (a module is deep-copied
    instead), exactly as the device builds its model, so both start from identical weights.
    """

    def __init__(self, chain_factory: Callable[[], nn.Module] | nn.Module, *, lr: float,
                 momentum: float = 0.0, seed: int, token: str | None = None,
                 tls: TlsFiles | None = None, max_workers: int = 4) -> None:
        torch.manual_seed(seed)
        model = copy.deepcopy(chain_factory) if isinstance(chain_factory, nn.Module) \
            else chain_factory()
        self.lr, self.momentum, self.seed = lr, momentum, seed
        self.token, self.tls = token, tls
        self._init_state = copy.deepcopy(model.state_dict())
        self.replica = _Replica(model, lr, momentum)
        self.fingerprint = model_fingerprint(self.replica.chain)
        self.lock = threading.Lock()
        self._session = False
        self._init_grpc(lambda server: pb_grpc.add_SplitTrainServiceServicer_to_server(
            _Servicer(self), server), MESSAGE_LIMIT, max_workers)

    # ---- handlers (called under self.lock) ---------------------------------------------------
    def hello(self, req: pb.HelloRequest) -> pb.HelloReply:
        """Check that the device starts from the same model, then start a fresh session."""
        n = len(self.replica.chain)
        if req.version != PROTOCOL_VERSION:
            raise _BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                              f"protocol version mismatch: server {PROTOCOL_VERSION}, device "
                              f"{req.version}; run the same edgesplit version on both sides")
        if req.model_fingerprint != self.fingerprint or req.chain_length != n:
            raise _BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                              f"model mismatch: the server's initial model has fingerprint "
                              f"{self.fingerprint[:12]} ({n} chain elements, seed {self.seed}), "
                              f"the device's {req.model_fingerprint[:12]} ({req.chain_length} "
                              f"elements, seed {req.seed}); build both sides from the same "
                              "model and seed")
        self.replica.model.load_state_dict(self._init_state)
        self.replica = _Replica(self.replica.model, self.lr, self.momentum)
        self._session = True
        log.info("training session started (%d chain elements)", n)
        return pb.HelloReply(model_fingerprint=self.fingerprint, chain_length=n,
                             version=PROTOCOL_VERSION, seed=self.seed)

    def _require_session(self) -> None:
        if not self._session:
            raise _BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                              "no training session: the device must call Hello first")

    def step(self, req: pb.StepRequest) -> pb.StepReply:
        """Train chain[cut+1:] on the received activation; return the gradient at the cut."""
        self._require_session()
        t0 = time.perf_counter()
        n, cut = len(self.replica.chain), req.cut
        if not -1 <= cut <= n - 2:
            raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                              f"cut {cut} is out of range: the server trains the elements after "
                              f"the cut, so it must be -1 to {n - 2} (cut {n - 1} is pure "
                              "on-device training and sends nothing)")
        act, y = _decode(req.activation, "activation"), _decode(req.labels, "labels")
        if y.dtype != torch.int64 or y.dim() != 1 or act.dim() == 0 or len(y) != act.shape[0]:
            raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                              f"labels must be int64 of shape [{act.shape[0] if act.dim() else '?'}"
                              f"] (one per sample), got {y.dtype!s} {list(y.shape)}")
        needs_grad = cut >= 0 and act.is_floating_point()
        act.requires_grad_(needs_grad)
        try:
            loss = F.cross_entropy(self.replica.part(cut + 1, n)(act), y)
        except (RuntimeError, ValueError, IndexError) as exc:
            raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                              f"chain elements {cut + 1}..{n - 1} cannot train on an activation "
                              f"of shape {list(act.shape)}: {str(exc).splitlines()[0]}") from None
        self.replica.backward_and_step(loss, None, range(cut + 1, n))
        grad = encode_tensor(act.grad, 32) if needs_grad and act.grad is not None else b""
        return pb.StepReply(round=req.round, gradient=grad, loss=float(loss.detach()),
                            server_ms=(time.perf_counter() - t0) * 1e3)

    def _indices(self, indices: Iterable[int]) -> list[int]:
        n, result = len(self.replica.chain), list(indices)
        bad = [i for i in result if i >= n]
        if bad or len(set(result)) != len(result):
            raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                              f"chain indices must be distinct and 0 to {n - 1}, got {result}")
        return result

    def sync(self, req: pb.SyncRequest) -> pb.SyncReply:
        """Merge S = req.indices: reply with this side's deltas (and buffers it owns)."""
        self._require_session()
        indices = self._indices(req.indices)
        device: dict[int, tuple[Update, Tensors]] = {}
        for layer in req.layers:
            if layer.index not in indices:
                raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"sync sends element {layer.index}, not in {indices}")
            update, buffers = _decode_layer(layer)
            problem = self.replica.check_state(layer.index, update[0], buffers)
            if problem:
                raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT, f"sync: {problem}")
            device[layer.index] = (update, buffers)
        device_trained = {i for i, (update, _) in device.items() if update[0]}
        own = self.replica.updates(indices, device_trained)
        reply = pb.SyncReply(round=req.round)
        for i in indices:
            server_owns = i > req.cut
            reply.layers.append(_layer_msg(i, own.get(i),
                                           self.replica.buffers(i) if server_owns else None))
        for i in indices:
            update, buffers = device.get(i, (None, {}))
            self.replica.merge(i, (update, own.get(i)), None if i > req.cut else buffers)
        return reply

    def fetch(self, req: pb.FetchRequest) -> pb.FetchReply:
        """The current parameters and buffers of the requested chain elements."""
        self._require_session()
        reply = pb.FetchReply()
        for i in self._indices(req.indices):
            module = self.replica.chain[i]
            params = {n: p.detach() for n, p in module.named_parameters()}
            reply.layers.append(_layer_msg(i, (params, True), self.replica.buffers(i)))
        return reply


def _decode_layer(msg: pb.LayerState) -> tuple[Update, Tensors]:
    try:
        return _read_layer(msg)
    except WireError as exc:
        raise _BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                          f"element {msg.index}: {exc}") from None


_UNTRAINED: dict[str, Callable[[], nn.Module]] = {}


def untrained_model(name: str, seed: int) -> nn.Module:
    """A freshly initialised model to train (never cached trained weights), built after
    ``torch.manual_seed(seed)`` so that device and server get identical weights."""
    from edgesplit.models._digits import DigitsCNN

    factories = {"digits_cnn": DigitsCNN, **_UNTRAINED}
    if name not in factories:
        raise ConfigError(f"model {name!r} cannot be trained from scratch; supported: "
                          f"{', '.join(sorted(factories))}")
    torch.manual_seed(seed)
    return factories[name]()


def serve_training(model: str, *, lr: float, momentum: float = 0.0, seed: int = 0,
                   host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                   tls: TlsFiles | None = None,
                   on_ready: Callable[[int], None] | None = None) -> None:
    """Serve split training of ``model`` (untrained, built with ``seed``) until SIGINT/SIGTERM;
    ``on_ready`` gets the port once listening."""
    from edgesplit.runtime.transport import serve_forever

    untrained_model(model, seed)  # fail fast on an unknown name
    server = TrainServer(lambda: untrained_model(model, seed), lr=lr, momentum=momentum,
                         seed=seed, token=token, tls=tls)
    bound = server.start(host, port)
    log.info("split-training server for %s listening on %s:%d", model, host, bound)
    if on_ready is not None:
        on_ready(bound)
    serve_forever(server)


# ---- device (client) -----------------------------------------------------------------------
@dataclass(frozen=True)
class SyncResult:
    """One sync: the elements merged and what it cost on the emulated link."""

    indices: tuple[int, ...]
    bytes_up: int = 0       # SyncRequest size
    bytes_down: int = 0     # SyncReply size
    payload_bytes: int = 0  # raw tensor bytes of the deltas and buffers, both ways
    sync_ms: float = 0.0

    @property
    def total_bytes(self) -> int:
        return self.bytes_up + self.bytes_down


@dataclass(frozen=True)
class RoundStats:
    """One training round as the device measured it (L2S: d_p^m = device_ms, d_p^e = edge_ms)."""

    round: int
    cut: int
    loss: float
    device_ms: float   # front forward + backward + update, incl. the emulated slowdown
    edge_ms: float     # request sent -> gradient decoded: link both ways + server + gRPC
    server_ms: float   # as the server reported it
    sync_ms: float
    bytes_up: int
    bytes_down: int
    sync_bytes: int
    synced: tuple[int, ...] = ()

    @property
    def total_ms(self) -> float:
        return self.device_ms + self.edge_ms + self.sync_ms


def _explain(code: grpc.StatusCode, details: str | None, address: str) -> str:
    if code == grpc.StatusCode.UNAVAILABLE:
        return (f"training server {address} is unavailable ({details}); is the split-training "
                "server running there?")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"training server {address} did not answer in time (raise timeout_s)"
    return f"training server {address} refused the request: {code.name}: {details}"


def _sleep_slowdown(elapsed_s: float, slowdown: float) -> float:
    """Sleep (slowdown - 1) x elapsed; returns the emulated device time in seconds."""
    if slowdown > 1.0:
        time.sleep((slowdown - 1.0) * elapsed_s)
    return elapsed_s * max(slowdown, 1.0)


class RemoteSplitTrainer:
    """The end device of split training: trains chain[0..cut] and drives the server.

    ``model`` must be built like the server's (same factory, same seed); it is copied, so the
    caller's module is left untouched. ``link_mbps`` None disables link emulation (``rtt_ms``
    applies only with a bandwidth).
    """

    def __init__(self, model: nn.Module, address: str, *, lr: float, momentum: float = 0.0,
                 seed: int, sync: str = "periodic", sync_every: int = 100,
                 link_mbps: float | None = None, rtt_ms: float = 0.0,
                 device_slowdown: float = 1.0, token: str | None = None,
                 tls: TlsFiles | None = None, timeout_s: float = 60.0) -> None:
        if sync not in SYNC_POLICIES:
            raise ConfigError(f"sync policy {sync!r} is unknown: use one of "
                              f"{', '.join(SYNC_POLICIES)}")
        if sync_every < 1:
            raise ConfigError(f"sync_every must be at least 1 round, got {sync_every}")
        if device_slowdown < 1.0:
            raise ConfigError(f"device_slowdown must be >= 1 (x the measured time), got "
                              f"{device_slowdown}")
        if rtt_ms < 0:
            raise ConfigError(f"rtt_ms must be >= 0, got {rtt_ms}")
        self.model = copy.deepcopy(model)
        self.replica = _Replica(self.model, lr, momentum)
        self.n = len(self.replica.chain)
        self.address, self.seed, self.policy, self.sync_every = address, seed, sync, sync_every
        self.device_slowdown, self.rtt_ms, self.timeout_s = device_slowdown, rtt_ms, timeout_s
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        self.cut: int | None = None  # the cut of the last round
        self.round = 0
        self._server_trained: set[int] = set()
        self.bandwidth_mbps: float | None = None
        self._shaper = LinkShaper(None)
        if link_mbps is not None:
            self.set_bandwidth_mbps(link_mbps)
        self._channel = open_channel(address, MESSAGE_LIMIT, tls)
        self._stub = pb_grpc.SplitTrainServiceStub(self._channel)
        try:
            self._hello()
        except BaseException:
            self._channel.close()
            raise

    # ---- plumbing ----------------------------------------------------------------------------
    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise RemoteError(_explain(exc.code(), exc.details(), self.address)) from None

    def _hello(self) -> None:
        fp = model_fingerprint(self.replica.chain)
        self._call(self._stub.Hello, pb.HelloRequest(model_fingerprint=fp, chain_length=self.n,
                                                     version=PROTOCOL_VERSION, seed=self.seed))

    def set_bandwidth_mbps(self, mbps: float) -> None:
        """Emulate a link of ``mbps`` (both directions) from the next message on."""
        if not mbps > 0:
            raise ConfigError(f"link bandwidth must be > 0 Mbps, got {mbps}")
        self.bandwidth_mbps = float(mbps)
        self._shaper = LinkShaper(Link(name="emulated", bandwidth_mbps=mbps, rtt_ms=self.rtt_ms))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_cut(self, cut: int) -> int:
        if isinstance(cut, bool) or not isinstance(cut, int) or not -1 <= cut <= self.n - 1:
            raise ConfigError(f"cut {cut!r} is not valid for a chain of {self.n} elements: "
                              f"allowed are -1 (all on the server) to {self.n - 1} (all on the "
                              "device)")
        return cut

    # ---- one round ---------------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor, cut: int) -> RoundStats:
        """One training round on (x, y) with the device holding chain[0..cut]."""
        cut = self._check_cut(cut)
        self.round += 1
        syncs: list[SyncResult] = []
        if self.policy == "fws" and self.cut is not None and cut != self.cut:
            lo, hi = sorted((self.cut, cut))
            syncs.append(self._sync(range(lo + 1, hi + 1)))
        self.cut = cut
        if cut == self.n - 1:
            (device_ms, loss), edge = self._local_round(x, y), (0.0, 0.0, 0, 0)
        else:
            device_ms, loss, edge = self._split_round(x, y, cut)
        if self.policy == "periodic" and self.round % self.sync_every == 0:
            syncs.append(self.sync_now())
        edge_ms, server_ms, up, down = edge
        return RoundStats(self.round, cut, loss, device_ms, edge_ms, server_ms,
                          sum(s.sync_ms for s in syncs), up, down,
                          sum(s.total_bytes for s in syncs),
                          tuple(i for s in syncs for i in s.indices))

    def _local_round(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        t0 = time.perf_counter()
        loss = F.cross_entropy(self.replica.part(0, self.n)(x), y)
        self.replica.backward_and_step(loss, None, range(self.n))
        seconds = _sleep_slowdown(time.perf_counter() - t0, self.device_slowdown)
        return seconds * 1e3, float(loss.detach())

    def _split_round(self, x: torch.Tensor, y: torch.Tensor, cut: int
                     ) -> tuple[float, float, tuple[float, float, int, int]]:
        t0 = time.perf_counter()
        act = self.replica.part(0, cut + 1)(x) if cut >= 0 else x
        forward_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        request = pb.StepRequest(round=self.round, cut=cut, activation=encode_tensor(act, 32),
                                 labels=encode_tensor(y.to(torch.int64), 32))
        up = request.ByteSize()
        self._shaper.send(up, "up")
        reply = self._call(self._stub.Step, request)
        down = reply.ByteSize()
        self._shaper.send(down, "down")
        grad = None
        if cut >= 0:
            try:
                grad = decode_tensor(reply.gradient)
            except WireError as exc:
                raise RemoteError(f"training server {self.address} sent a corrupt gradient: "
                                  f"{exc}") from None
        edge_ms = (time.perf_counter() - t1) * 1e3
        self._server_trained.update(range(cut + 1, self.n))
        t2 = time.perf_counter()
        if cut >= 0:
            self.replica.backward_and_step(act, grad, range(cut + 1))
        device_s = _sleep_slowdown(forward_s + time.perf_counter() - t2, self.device_slowdown)
        return device_s * 1e3, reply.loss, (edge_ms, reply.server_ms, up, down)

    # ---- syncing -----------------------------------------------------------------------------
    def sync_now(self, next_cut: int | None = None) -> SyncResult:
        """Merge every chain element trained on both sides since the last sync and, given the
        cut of the rounds to come, the elements that will change sides (so that the side
        taking them over starts from current weights, as at an FWS move)."""
        indices = self.replica.trained & self._server_trained
        if next_cut is not None and self.cut is not None:
            lo, hi = sorted((self._check_cut(next_cut), self.cut))
            changed = self.replica.trained | self._server_trained  # the others are in sync
            indices |= set(range(lo + 1, hi + 1)) & changed
        return self._sync(sorted(indices))

    def _sync(self, indices: Iterable[int]) -> SyncResult:
        indices = list(indices)
        if not indices or self.cut is None:
            return SyncResult(())
        t0, cut = time.perf_counter(), self.cut
        own = self.replica.updates(indices, self._server_trained)
        request = pb.SyncRequest(round=self.round, cut=cut, indices=indices)
        mine = {i: self.replica.buffers(i) for i in indices if i <= cut}
        for i in indices:
            request.layers.append(_layer_msg(i, own.get(i), mine.get(i)))
        up = request.ByteSize()
        self._shaper.send(up, "up")
        reply = self._call(self._stub.Sync, request)
        down = reply.ByteSize()
        self._shaper.send(down, "down")
        theirs = self._read_reply(reply.layers, indices)
        for i in indices:
            update, buffers = theirs.get(i, (None, {}))
            self.replica.merge(i, (own.get(i), update), buffers if i > cut else None)
        self._server_trained.difference_update(indices)
        payload = _payload([*(u[0] for u in own.values()), *mine.values()]) + \
            _payload(s for update, buffers in theirs.values() for s in (update[0], buffers))
        log.debug("synced elements %s: %d bytes up, %d down", indices, up, down)
        return SyncResult(tuple(indices), up, down, payload, (time.perf_counter() - t0) * 1e3)

    def _read_reply(self, layers, indices: list[int]) -> dict[int, tuple[Update, Tensors]]:
        result = {}
        for layer in layers:
            try:
                update, buffers = _read_layer(layer)
            except WireError as exc:
                raise RemoteError(f"training server {self.address} sent a corrupt state of "
                                  f"element {layer.index}: {exc}") from None
            problem = None if layer.index in indices else f"unexpected element {layer.index}"
            problem = problem or self.replica.check_state(layer.index, update[0], buffers)
            if problem:
                raise RemoteError(f"training server {self.address} answered a sync with a "
                                  f"state that does not fit this model: {problem}")
            result[layer.index] = (update, buffers)
        return result

    def final_model(self) -> nn.Module:
        """The trained model: sync what both sides trained, then take the device's copy of
        chain[0..cut] and the server's of the rest (the owners under the last cut)."""
        self.sync_now()
        model = copy.deepcopy(self.model)
        chain = as_chain(model)
        if self.cut is not None and self.cut < self.n - 1:
            indices = list(range(self.cut + 1, self.n))
            reply = self._call(self._stub.Fetch, pb.FetchRequest(indices=indices))
            for i, (update, buffers) in self._read_reply(reply.layers, indices).items():
                _assign(chain[i], update[0], buffers)
        return model.eval()
