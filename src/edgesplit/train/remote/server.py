"""The edge server of split training: :func:`training_server` puts a :class:`TrainHandler`,
which trains the chain elements after the device's cut, in a
:class:`~edgesplit.runtime.shell.ServingShell` serving the SplitTrainService
(``train/proto``): the shell checks each call's token (throttled), serves TLS, holds a worker
slot per call, maps failures to statuses, says its health and drains on stop, as for every
other server.

It serves gRPC alone, without the shell's data plane: a training request is a protobuf message
of per-layer states that frames would need a codec of their own for, a round's time is two
forward and backward passes and the emulated link's, not the fraction of a millisecond gRPC
adds to a call, and the device counts a round's bytes as those messages' sizes
(:class:`~edgesplit.train.remote.client.RoundStats`).

**One session at a time.** The server trains one model for one device at a time, its session
kept in a :class:`~edgesplit.runtime.sessions.SessionTable` of one that evicts nothing.
``Hello`` starts a session from the initial model and returns its id, which every later
request carries; a request with another id fails with FAILED_PRECONDITION (the message says
why: closed, taken over, or unknown). While a session is open, another ``Hello`` is refused,
unless it sets ``take_over`` (the same device restarting after a crash: its half of the model
is lost, so it starts over) or the open session has been idle for ``session_timeout_s``; the
server then ends it, and tells its device why when it comes back. A device that only lost the
connection keeps its session and goes on. Closing ends the session. What a session keeps so
that nothing is applied twice is :class:`~edgesplit.train.remote.sessions.TrainSession`'s.

**Requests are checked before anything changes.** The server knows what crosses each cut
(shape and dtype per sample, from a forward pass at start-up), the number of classes, a batch
limit and, from those, its gRPC message limit. A Step whose activation, labels or batch do not
fit, or whose tensors are not finite, is refused with INVALID_ARGUMENT and leaves the server's
parameters, buffers and momentum bit-identical; so does a Sync whose states do not fit (it is
merged into copies and applied only when every element merged), and a Step whose training
gave a non-finite loss or gradient (the batch-norm statistics its forward pass moved are put
back). Undo restores the server's parameters, buffers, momentum and trained set from a copy
made just before its last Step's update.
"""

from __future__ import annotations

import copy
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import grpc
import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError, option
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime.options import ServeOptions
from edgesplit.runtime.sessions import SessionTable
from edgesplit.runtime.shell import AddServicer, ServingShell, WorkerSlots
from edgesplit.train.proto import edgesplit_train_pb2 as pb
from edgesplit.train.proto import edgesplit_train_pb2_grpc as pb_grpc
from edgesplit.train.remote.protocol import (
    DEFAULT_MAX_BATCH,
    PROTOCOL_VERSION,
    Tensors,
    Update,
    batch_size,
    chain_shapes,
    decode_as,
    layer_msg,
    model_fingerprint,
    read_layer,
    train_message_bytes,
)
from edgesplit.train.remote.replica import Replica, Snapshot
from edgesplit.train.remote.sessions import SESSION_TIMEOUT_S, TrainSession, request_digest
from edgesplit.train.trainable import TrainModelSpec
from edgesplit.transport import BadRequest, invalid

__all__ = ["DEFAULT_WORKERS", "TrainHandler", "serve_training", "training_server",
           "untrained_model"]

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 4  # calls a training server serves at once unless told otherwise
_ENDED_KEPT = 32  # ended sessions remembered, to tell their devices why
SERVER = "training server"  # how its errors name it


def training_server(chain_factory: Callable[[], nn.Module] | nn.Module, *, lr: float,
                    momentum: float = 0.0, seed: int, sample_shape: Sequence[int],
                    max_batch: int = DEFAULT_MAX_BATCH,
                    session_timeout_s: float = SESSION_TIMEOUT_S,
                    options: ServeOptions | None = None) -> ServingShell[TrainHandler]:
    """The edge server of split training, not started, served as ``options`` say (a token,
    TLS; at most ``DEFAULT_WORKERS`` calls at once unless they say otherwise; no data plane,
    see the module docstring).

    ``chain_factory`` is called after ``torch.manual_seed(seed)`` (a module is deep-copied
    instead), exactly as the device builds its model, so both start from identical weights.
    ``sample_shape`` is one input sample's shape (no batch dimension): with it the server
    knows what every cut sends, and sizes its message limit for ``max_batch`` samples. An
    open session may be taken by another device once idle for ``session_timeout_s``."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ConfigError(f"max_batch must be a whole number of samples >= 1, got "
                          f"{max_batch!r}")
    if not session_timeout_s > 0:
        raise ConfigError(f"session_timeout_s must be > 0 seconds, got {session_timeout_s}")
    options = replace(options or ServeOptions(), data_port=None)
    torch.manual_seed(seed)
    model = copy.deepcopy(chain_factory) if isinstance(chain_factory, nn.Module) \
        else chain_factory()
    handler = TrainHandler(model, lr=lr, momentum=momentum, seed=seed,
                           sample_shape=sample_shape, max_batch=max_batch,
                           session_timeout_s=float(session_timeout_s))
    slots = WorkerSlots(options.workers(DEFAULT_WORKERS), SERVER,
                        f"{option('max_workers')} requests", options.next_timeout_s)
    return ServingShell(handler, options, limit=handler.limit, slots=slots,
                        service=_train_service)


def _train_service(shell: ServingShell[TrainHandler]) -> AddServicer:
    servicer = _Servicer(shell)
    return lambda server: pb_grpc.add_SplitTrainServiceServicer_to_server(servicer, server)


class _Servicer(pb_grpc.SplitTrainServiceServicer):
    """The SplitTrainService of ``shell``, answered by its :class:`TrainHandler`, each call
    through :meth:`~edgesplit.runtime.shell.ServingShell.serve_call`."""

    def __init__(self, shell: ServingShell[TrainHandler]) -> None:
        self.call, self.handler = shell.serve_call, shell.handler

    def Hello(self, request, context):
        return self.call(context, lambda: self.handler.hello(request, context.peer()))

    def Step(self, request, context):
        return self.call(context, lambda: self.handler.step(request))

    def Sync(self, request, context):
        return self.call(context, lambda: self.handler.sync(request))

    def Fetch(self, request, context):
        return self.call(context, lambda: self.handler.fetch(request))

    def Close(self, request, context):
        return self.call(context, lambda: self.handler.close_session(request))

    def Undo(self, request, context):
        return self.call(context, lambda: self.handler.undo(request))


class TrainHandler:
    """What a training server's shell serves: the chain elements of ``model`` after the
    device's cut, trained by SGD (``lr``, ``momentum``) from its initial weights (built with
    ``seed``) in every new session; ``sample_shape``, ``max_batch`` and
    ``session_timeout_s`` as :func:`training_server` says. Its lock guards the model and the
    session together: a request changes both."""

    def __init__(self, model: nn.Module, *, lr: float, momentum: float, seed: int,
                 sample_shape: Sequence[int], max_batch: int,
                 session_timeout_s: float) -> None:
        self.lr, self.momentum, self.seed = lr, momentum, seed
        self.max_batch, self.session_timeout_s = max_batch, session_timeout_s
        self._init_state = copy.deepcopy(model.state_dict())
        self.replica = Replica(model, lr, momentum, seed)
        self.fingerprint = model_fingerprint(self.replica.chain)
        self.shapes = chain_shapes(self.replica.chain, sample_shape)
        self.limit = train_message_bytes(self.replica.chain, self.shapes, max_batch)
        self.lock = threading.Lock()
        # one session, never evicted: the server ends it (and says why) or its device does
        self.sessions: SessionTable[TrainSession] = SessionTable(
            1, device=SERVER, holds="training sessions", evictable=lambda entry: False)
        self._ended: OrderedDict[str, str] = OrderedDict()  # session id -> why it ended

    # ---- the shell's handler -------------------------------------------------------------
    def failure(self, exc: BaseException) -> str:
        log.exception("training server failed on a request")
        return f"training server failed: {type(exc).__name__}: {exc}"

    def started(self, serving: Callable[[bool], None]) -> None:
        """Nothing to start: the server's health is its own."""

    def refuse(self) -> None:
        """Nothing waits but for the shell's slots."""

    def drain(self, timeout: float) -> None:
        """Nothing waits but for the shell's slots."""

    def close(self) -> None:
        """Nothing to close."""

    # ---- sessions ------------------------------------------------------------------------
    @property
    def current(self) -> TrainSession | None:
        """The open session (None: none)."""
        return next(iter(self.sessions.values()), None)

    def hello(self, req: pb.HelloRequest, peer: str = "?") -> pb.HelloReply:
        """Check that the device starts from the same model, then start a fresh session (see
        the module docstring for when an open session is taken over)."""
        n = len(self.replica.chain)
        if req.version != PROTOCOL_VERSION:
            raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                             f"protocol version mismatch: server {PROTOCOL_VERSION}, device "
                             f"{req.version}; run the same edgesplit version on both sides")
        if req.model_fingerprint != self.fingerprint or req.chain_length != n:
            raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                             f"model mismatch: the server's initial model has fingerprint "
                             f"{self.fingerprint[:12]} ({n} chain elements, seed {self.seed}), "
                             f"the device's {req.model_fingerprint[:12]} ({req.chain_length} "
                             f"elements, seed {req.seed}); build both sides from the same "
                             "model and seed")
        with self.lock:
            session = self._start(peer, req.take_over)
            self.replica.model.load_state_dict(self._init_state)
            self.replica = Replica(self.replica.model, self.lr, self.momentum, self.seed)
            log.info("training session %s started for %s (%d chain elements)",
                     session.id[:8], peer, n)
            return pb.HelloReply(model_fingerprint=self.fingerprint, chain_length=n,
                                 version=PROTOCOL_VERSION, seed=self.seed,
                                 session_id=session.id, max_message_bytes=self.limit,
                                 max_batch=self.max_batch, classes=self.shapes.classes,
                                 session_timeout_s=self.session_timeout_s)

    def close_session(self, req: pb.CloseRequest) -> pb.CloseReply:
        """End the session ``req`` names, if it is the open one (closing twice is fine)."""
        with self.lock:
            current = self.current
            if current is None or req.session_id != current.id:
                return pb.CloseReply(closed=False)
            self._end(current, "closed by its device")
            return pb.CloseReply(closed=True)

    def _start(self, peer: str, take_over: bool) -> TrainSession:
        """A new session for ``peer``, ending the open one if ``take_over`` or if it has been
        idle for the session timeout; refused (FAILED_PRECONDITION) otherwise."""
        current = self.current
        if current is not None:
            idle, timeout = self.sessions.idle_s(current.id), self.session_timeout_s
            if not take_over and idle < timeout:
                raise BadRequest(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"the server is training another session (device {current.peer}, last "
                    f"request {idle:.0f} s ago; sessions expire after {timeout:g} s idle): "
                    "wait for it to finish, or, if it is yours and that device restarted, "
                    f"take it over ({option('take_over', True)}; the session's training is "
                    "lost)")
            self._end(current, f"taken over by device {peer}" if take_over else
                      f"expired after {idle:.0f} s idle and was taken by device {peer}")
        session = TrainSession(secrets.token_hex(16), peer)
        self.sessions.get_or_open(session.id, None, lambda: session)
        return session

    def _require(self, session_id: str) -> TrainSession:
        """The open session, if the request names it (and now its last request), else
        refused with why."""
        session = self.sessions.use(session_id) if session_id else None
        if session is not None:
            return session
        if not session_id:
            why = "the request names no training session: the device must call Hello first"
        elif session_id in self._ended:
            why = (f"training session {session_id[:8]} has ended ({self._ended[session_id]}); "
                   "start a new session (its training is lost)")
        else:
            why = (f"unknown training session {session_id[:8]} (did the server restart?); "
                   "start a new session")
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION, why)

    def _end(self, session: TrainSession, why: str) -> None:
        self.sessions.end(session.id)
        self._ended[session.id] = why
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        log.info("training session %s ended: %s", session.id[:8], why)

    # ---- training --------------------------------------------------------------------------
    def step(self, req: pb.StepRequest) -> pb.StepReply:
        """Train chain[cut+1:] on the received activation; return the gradient at the cut.
        A repeat of the last Step gets its first reply and trains nothing; otherwise the
        request's content, then its number, is checked before the model is updated."""
        t0, digest = time.perf_counter(), request_digest("Step", req)
        n, cut = len(self.replica.chain), req.cut
        if not -1 <= cut <= n - 2:
            raise invalid(f"cut {cut} is out of range: the server trains the elements after "
                           f"the cut, so it must be -1 to {n - 2} (cut {n - 1} is pure "
                           "on-device training and sends nothing)")
        with self.lock:  # a device whose session ended hears that first, not about its data
            first = self._require(req.session_id).repeat("Step", req.seq, digest)
        if first is not None:
            return first
        act, y = self._read_batch(req, cut)  # outside the lock: decoding takes time
        act.requires_grad_(cut >= 0)
        with self.lock:
            session = self._require(req.session_id)
            first = session.repeat("Step", req.seq, digest)  # a repeat sent meanwhile
            if first is not None:
                return first
            loss, undo = self._train(cut, act, y, req.round, session, req.seq)
            grad = encode_tensor(act.grad, 32) if act.grad is not None else b""  # see _train
            reply = pb.StepReply(round=req.round, gradient=grad, loss=loss,
                                 server_ms=(time.perf_counter() - t0) * 1e3)
            session.accept(req.seq, digest, reply, undo)
        return reply

    def _read_batch(self, req: pb.StepRequest, cut: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample, dtype = self.shapes.cuts[cut + 1]
        what = "the model input" if cut < 0 else f"what chain element {cut} outputs"
        batch = batch_size(req.activation, "activation", sample, dtype, self.max_batch, what)
        act = decode_as(req.activation, "activation", (batch, *sample), dtype)
        y = decode_as(req.labels, f"labels (one per sample of the batch of {batch})", (batch,),
                       torch.int64)
        classes = self.shapes.classes
        bad = (y < 0) | (y >= classes)
        if bool(bad.any()):
            raise invalid(f"labels must be class indices 0 to {classes - 1}, got "
                           f"{int(y[bad][0])} (ignore-index labels such as -100 are not "
                           "supported: leave those samples out)")
        return act, y

    def _train(self, cut: int, act: torch.Tensor, y: torch.Tensor, round_: int,
               session: TrainSession, seq: int) -> tuple[float, Snapshot]:
        """One round on the server's part; refused (and undone) if it is not finite or not
        the session's next request. Returns the loss and what takes the update back."""
        replica, n = self.replica, len(self.replica.chain)
        saved = replica.save_buffers(range(cut + 1, n))
        try:
            loss = F.cross_entropy(replica.forward(cut + 1, n, act, round_), y)
            problem = "loss" if not bool(torch.isfinite(loss)) else \
                replica.backward(loss, None)
            if problem is None and act.grad is not None \
                    and not bool(torch.isfinite(act.grad).all()):
                problem = "gradient at the cut"
            if problem is None and act.requires_grad and act.grad is None:
                raise invalid(f"the chain elements after cut {cut} do not depend on the "
                              "activation: there is no gradient to send back at this cut")
            if problem is not None:
                raise invalid(f"training on this batch gave a non-finite {problem} (values "
                               "too large for float32); nothing was updated: lower the "
                               "learning rate or scale the inputs")
            session.check_next("Step", seq)  # after the content: a bad batch hears about it
        except BaseException:
            replica.undo(saved)
            raise
        undo = replica.snapshot(range(cut + 1, n), saved)
        replica.update(range(cut + 1, n))
        return float(loss.detach()), undo

    def _indices(self, indices: Iterable[int]) -> list[int]:
        n, result = len(self.replica.chain), list(indices)
        bad = [i for i in result if i >= n]
        if bad or len(set(result)) != len(result):
            raise invalid(f"chain indices must be distinct and 0 to {n - 1}, got {result}")
        return result

    def sync(self, req: pb.SyncRequest) -> pb.SyncReply:
        """Merge S = req.indices: reply with this side's deltas (and buffers it owns). Every
        element is merged into new tensors first and applied only when all merged. A repeat
        of the last Sync gets its first reply and merges nothing (merging twice would add
        the deltas twice)."""
        n, digest = len(self.replica.chain), request_digest("Sync", req)
        indices = self._indices(req.indices)
        if not -1 <= req.cut <= n - 1:
            raise invalid(f"sync cut {req.cut} is out of range -1 to {n - 1}")
        device: dict[int, tuple[Update, Tensors]] = {}
        for layer in req.layers:
            if layer.index not in indices or layer.index in device:
                raise invalid(f"sync sends element {layer.index} "
                               f"{'twice' if layer.index in device else 'not in ' + str(indices)}")
            if layer.buffers and layer.index > req.cut:
                raise invalid(f"sync sends buffers of element {layer.index}, which the server "
                               f"owns under cut {req.cut}")
            device[layer.index] = read_layer(layer, self.replica.chain[layer.index])
        missing = sorted(set(indices) - set(device))
        if missing:  # an element left out would lose its owner's buffers and momentum
            raise invalid(f"sync of {indices} sends no state for elements {missing}: send a "
                           "LayerState (possibly empty) for every element it merges")
        with self.lock:
            session = self._require(req.session_id)
            first = session.repeat("Sync", req.seq, digest)
            if first is not None:
                return first
            session.check_next("Sync", req.seq)
            device_trained = {i for i, (update, _) in device.items() if update[0]}
            own = self.replica.updates(indices, device_trained)
            reply = pb.SyncReply(round=req.round)
            for i in indices:
                reply.layers.append(layer_msg(i, own.get(i), self.replica.buffers(i)
                                               if i > req.cut else None))
            merged = {}
            for i in indices:
                update, buffers = device[i]
                merged[i] = self.replica.merged(i, (update, own.get(i)),
                                                None if i > req.cut else buffers)
            for i, state in merged.items():
                self.replica.apply(i, state)
            session.accept(req.seq, digest, reply)
        return reply

    def undo(self, req: pb.UndoRequest) -> pb.UndoReply:
        """Take back the last accepted request, a Step whose gradient the device could not
        use: parameters, momentum, buffers and the trained set return to before it."""
        digest = request_digest("Undo", req)
        with self.lock:
            session = self._require(req.session_id)
            first = session.repeat("Undo", req.seq, digest)
            if first is not None:
                return first
            session.check_next("Undo", req.seq)
            if session.undo is None or req.step_seq != session.seq:
                raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"Undo takes back only the last accepted request, and only a "
                                 f"Step: {req.step_seq} is not (the last is {session.seq})")
            self.replica.restore(session.undo)
            log.info("training session %s: Step %d undone", session.id[:8], req.step_seq)
            reply = pb.UndoReply()
            session.accept(req.seq, digest, reply)
        return reply

    def fetch(self, req: pb.FetchRequest) -> pb.FetchReply:
        """The current parameters and buffers of the requested chain elements."""
        indices = self._indices(req.indices)
        reply = pb.FetchReply()
        with self.lock:
            self._require(req.session_id)
            for i in indices:
                module = self.replica.chain[i]
                params = {n: p.detach() for n, p in module.named_parameters()}
                reply.layers.append(layer_msg(i, (params, True), self.replica.buffers(i)))
        return reply


def untrained_model(name: str | TrainModelSpec, seed: int) -> nn.Module:
    """A freshly initialised model to train (never cached trained weights), built after
    ``torch.manual_seed(seed)`` so that device and server get identical weights; ``name`` is a
    model spec (``digits_cnn``, ``mobilenet_v2:pretrained,classes=10,input=3x32x32``, see
    :class:`TrainModelSpec`), whose pretrained weights come from their package."""
    spec = name if isinstance(name, TrainModelSpec) else TrainModelSpec.parse(name)
    return spec.build(seed)


def serve_training(model: str, *, lr: float, momentum: float = 0.0, seed: int = 0,
                   host: str = "127.0.0.1", port: int = 0, options: ServeOptions | None = None,
                   max_batch: int = DEFAULT_MAX_BATCH,
                   session_timeout_s: float = SESSION_TIMEOUT_S,
                   on_ready: Callable[[int], None] | None = None) -> None:
    """Serve split training of the model spec ``model`` (untrained, or pretrained with a fresh
    classifier, built with ``seed``) on host:port as ``options`` say until SIGINT/SIGTERM;
    ``on_ready`` gets the port once listening."""
    from edgesplit.transport import serve_forever

    spec = TrainModelSpec.parse(model)
    untrained_model(spec, seed)  # fail fast on an unknown name or option
    server = training_server(lambda: untrained_model(spec, seed), lr=lr, momentum=momentum,
                             seed=seed, sample_shape=spec.sample_shape, max_batch=max_batch,
                             session_timeout_s=session_timeout_s, options=options)
    bound = server.start(host, port)
    log.info("split-training server for %s listening on %s:%d", model, host, bound)
    if on_ready is not None:
        on_ready(bound)
    serve_forever(server)
