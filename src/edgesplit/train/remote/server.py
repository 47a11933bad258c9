"""The edge server of split training (:class:`TrainServer`): trains the chain elements after
the device's cut, over gRPC, for one session at a time
(:mod:`~edgesplit.train.remote.sessions`).

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
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import grpc
import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.quant.wire import encode_tensor
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
from edgesplit.train.remote.sessions import (
    SESSION_TIMEOUT_S,
    TrainSession,
    TrainSessions,
    request_digest,
)
from edgesplit.train.trainable import TrainModelSpec
from edgesplit.transport import BadRequest, GrpcServer, TlsFiles, answer, invalid

__all__ = ["TrainServer", "serve_training", "untrained_model"]

log = logging.getLogger(__name__)


# ---- server --------------------------------------------------------------------------------
def _failure(exc: Exception) -> str:
    log.exception("training server failed on a request")
    return f"training server failed: {type(exc).__name__}: {exc}"


class _Servicer(pb_grpc.SplitTrainServiceServicer):
    def __init__(self, server: TrainServer) -> None:
        self.s = server

    def _handle(self, handler, request, context):
        self.s.check_token(context)
        return answer(context, lambda: handler(request), _failure)

    def Hello(self, request, context):
        return self._handle(lambda req: self.s.hello(req, context.peer()), request, context)

    def Step(self, request, context):
        return self._handle(self.s.step, request, context)

    def Sync(self, request, context):
        return self._handle(self.s.sync, request, context)

    def Fetch(self, request, context):
        return self._handle(self.s.fetch, request, context)

    def Close(self, request, context):
        return self._handle(self.s.close_session, request, context)

    def Undo(self, request, context):
        return self._handle(self.s.undo, request, context)


class TrainServer(GrpcServer):
    """The edge server of split training: trains the chain elements after the device's cut.

    ``chain_factory`` is called after ``torch.manual_seed(seed)`` (a module is deep-copied
    instead), exactly as the device builds its model, so both start from identical weights.
    ``sample_shape`` is one input sample's shape (no batch dimension): with it the server
    knows what every cut sends, and sizes its message limit for ``max_batch`` samples.
    """

    def __init__(self, chain_factory: Callable[[], nn.Module] | nn.Module, *, lr: float,
                 momentum: float = 0.0, seed: int, sample_shape: Sequence[int],
                 max_batch: int = DEFAULT_MAX_BATCH,
                 session_timeout_s: float = SESSION_TIMEOUT_S, token: str | None = None,
                 tls: TlsFiles | None = None, max_workers: int = 4) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch must be a whole number of samples >= 1, got "
                              f"{max_batch!r}")
        if not session_timeout_s > 0:
            raise ConfigError(f"session_timeout_s must be > 0 seconds, got {session_timeout_s}")
        torch.manual_seed(seed)
        model = copy.deepcopy(chain_factory) if isinstance(chain_factory, nn.Module) \
            else chain_factory()
        self.lr, self.momentum, self.seed = lr, momentum, seed
        self.max_batch = max_batch
        self.token, self.tls = token, tls
        self._init_state = copy.deepcopy(model.state_dict())
        self.replica = Replica(model, lr, momentum, seed)
        self.fingerprint = model_fingerprint(self.replica.chain)
        self.shapes = chain_shapes(self.replica.chain, sample_shape)
        self.limit = train_message_bytes(self.replica.chain, self.shapes, max_batch)
        self.lock = threading.Lock()
        self.sessions = TrainSessions(float(session_timeout_s))
        self._init_grpc(lambda server: pb_grpc.add_SplitTrainServiceServicer_to_server(
            _Servicer(self), server), self.limit, max_workers)

    # ---- sessions ------------------------------------------------------------------------------
    def hello(self, req: pb.HelloRequest, peer: str = "?") -> pb.HelloReply:
        """Check that the device starts from the same model, then start a fresh session (see
        :mod:`~edgesplit.train.remote.sessions` for when an open session is taken over)."""
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
            session = self.sessions.start(peer, req.take_over)
            self.replica.model.load_state_dict(self._init_state)
            self.replica = Replica(self.replica.model, self.lr, self.momentum, self.seed)
            log.info("training session %s started for %s (%d chain elements)",
                     session.id[:8], peer, n)
            return pb.HelloReply(model_fingerprint=self.fingerprint, chain_length=n,
                                 version=PROTOCOL_VERSION, seed=self.seed,
                                 session_id=session.id, max_message_bytes=self.limit,
                                 max_batch=self.max_batch, classes=self.shapes.classes,
                                 session_timeout_s=self.sessions.timeout_s)

    def close_session(self, req: pb.CloseRequest) -> pb.CloseReply:
        """End the session ``req`` names, if it is the open one (closing twice is fine)."""
        with self.lock:
            return pb.CloseReply(closed=self.sessions.close(req.session_id))

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
            first = self.sessions.require(req.session_id).repeat("Step", req.seq, digest)
        if first is not None:
            return first
        act, y = self._read_batch(req, cut)  # outside the lock: decoding takes time
        act.requires_grad_(cut >= 0)
        with self.lock:
            session = self.sessions.require(req.session_id)
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
            session = self.sessions.require(req.session_id)
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
            session = self.sessions.require(req.session_id)
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
            self.sessions.require(req.session_id)
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
                   host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                   tls: TlsFiles | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                   session_timeout_s: float = SESSION_TIMEOUT_S,
                   on_ready: Callable[[int], None] | None = None) -> None:
    """Serve split training of the model spec ``model`` (untrained, or pretrained with a fresh
    classifier, built with ``seed``) until SIGINT/SIGTERM; ``on_ready`` gets the port once
    listening."""
    from edgesplit.transport import serve_forever

    spec = TrainModelSpec.parse(model)
    untrained_model(spec, seed)  # fail fast on an unknown name or option
    server = TrainServer(lambda: untrained_model(spec, seed), lr=lr, momentum=momentum,
                         seed=seed, sample_shape=spec.sample_shape, max_batch=max_batch,
                         session_timeout_s=session_timeout_s, token=token, tls=tls)
    bound = server.start(host, port)
    log.info("split-training server for %s listening on %s:%d", model, host, bound)
    if on_ready is not None:
        on_ready(bound)
    serve_forever(server)

