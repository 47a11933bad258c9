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
change at any round (:meth:`RemoteSplitTrainer.set_bandwidth_mbps`).

**Sessions.** The server trains one model for one device at a time. ``Hello`` starts a session
from the initial model and returns its id, which every later request carries; a request with
another id fails with FAILED_PRECONDITION (the message says why: closed, taken over, or
unknown). While a session is open, another ``Hello`` is refused, unless it sets ``take_over``
(the same device restarting after a crash: its half of the model is lost, so it starts over)
or the open session has been idle for ``session_timeout_s``. A device that only lost the
connection keeps its session and goes on. :meth:`RemoteSplitTrainer.close` ends the session.

**Requests are checked before anything changes.** The server knows what crosses each cut
(shape and dtype per sample, from a forward pass at start-up), the number of classes, a batch
limit and, from those, its gRPC message limit. A Step whose activation, labels or batch do not
fit, or whose tensors are not finite, is refused with INVALID_ARGUMENT and leaves the server's
parameters, buffers and momentum bit-identical; so does a Sync whose states do not fit (it is
merged into copies and applied only when every element merged), and a Step whose training
gave a non-finite loss or gradient (the batch-norm statistics its forward pass moved are put
back).

**Nothing is applied twice, nothing half.** Step, Sync and Undo carry the session's next
sequence number. The server keeps its last reply: the device re-sends a request whose reply
was lost with the same number and gets that reply, with nothing trained or merged again; a
number out of step is refused with FAILED_PRECONDITION (after the request's content is
checked). A round the device cannot finish after the server stepped (a non-finite gradient
at the cut or in the device's part) is taken back with Undo, which restores the server's
parameters, buffers, momentum and trained set from a copy made just before its update.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Self, cast

import grpc
import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError, EdgesplitError, RemoteError, WireError, option
from edgesplit.hardware import Link
from edgesplit.quant.wire import decode_tensor, encode_tensor, message_info
from edgesplit.runtime.calls import RETRYABLE, rpc_failed_with, with_retries
from edgesplit.train.proto import edgesplit_train_pb2 as pb
from edgesplit.train.proto import edgesplit_train_pb2_grpc as pb_grpc
from edgesplit.train.split import as_chain, seeded_forward, tensor_bytes
from edgesplit.train.trainable import TrainModelSpec
from edgesplit.transport import (
    BadRequest,
    GrpcServer,
    LoopbackChannel,
    TlsFiles,
    answer,
    bearer_metadata,
    explain,
    invalid,
    open_channel,
)
from edgesplit.transport.shaping import LinkShaper

__all__ = ["DEFAULT_MAX_BATCH", "PROTOCOL_VERSION", "SESSION_TIMEOUT_S", "SYNC_POLICIES",
           "ChainShapes", "RemoteSplitTrainer", "RoundStats", "SyncResult", "TrainServer",
           "chain_shapes", "model_fingerprint", "serve_training", "train_message_bytes",
           "untrained_model"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 3  # 2: sessions, limits in HelloReply, Close; 3: sequence numbers, Undo
SYNC_POLICIES = ("periodic", "fws")
OPTIM_PREFIX = "optim:"  # buffer entries that carry an element's SGD momentum
DEFAULT_MAX_BATCH = 256
SESSION_TIMEOUT_S = 600.0
_HELLO_LIMIT = 1 << 20  # Hello and Close are tiny; the real limit comes with the HelloReply
_ENDED_KEPT = 32  # ended sessions remembered, to tell their devices why
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


@dataclass(frozen=True)
class ChainShapes:
    """What crosses each cut of a chain, per sample: ``cuts[c + 1]`` is the (shape, dtype)
    element ``c`` outputs (``cuts[0]``: the model input), and the number of classes."""

    cuts: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    classes: int


def chain_shapes(chain: Sequence[nn.Module], sample_shape: Sequence[int],
                 dtype: torch.dtype = torch.float32) -> ChainShapes:
    """Run one zero sample through a copy of ``chain`` (eval mode: batch-norm needs no batch
    and keeps its statistics) and record every cut's shape and dtype."""
    layers = copy.deepcopy(list(chain))
    x = torch.zeros(1, *sample_shape, dtype=dtype)
    cuts = [(tuple(int(d) for d in sample_shape), dtype)]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            try:
                x = layer.eval()(x)
            except (RuntimeError, ValueError, IndexError) as exc:
                raise ConfigError(f"a sample of shape {list(sample_shape)} does not fit the "
                                  f"model (chain element {i}: {str(exc).splitlines()[0]}); "
                                  "give the shape of one input sample, without the batch "
                                  "dimension") from None
            cuts.append((tuple(x.shape[1:]), x.dtype))
    if x.dim() != 2 or x.shape[1] < 1:
        raise ConfigError(f"the model outputs {list(x.shape[1:])} per sample; split training "
                          "needs class logits [classes] for the cross-entropy loss")
    return ChainShapes(tuple(cuts), int(x.shape[1]))


def train_message_bytes(chain: Sequence[nn.Module], shapes: ChainShapes, max_batch: int) -> int:
    """The largest message split training of ``chain`` can need, like the inference server's
    ``max_message_bytes``: a Step of ``max_batch`` samples at the widest cut (activation at
    float32 and int64 labels; the gradient comes back at the activation's size), or a Sync or
    Fetch of every element's parameters (or deltas), buffers and momentum. gRPC refuses
    anything larger (RESOURCE_EXHAUSTED) before it reaches a handler."""
    widest = max(math.prod(shape) * 4 for shape, _ in shapes.cuts[:-1])
    step = max_batch * (widest + 8) + 2 * 256
    state = 0
    for module in chain:
        for p in module.parameters():
            state += 2 * (p.numel() * max(p.element_size(), 4) + 256)  # params + momentum
        for b in module.buffers():
            state += b.numel() * max(b.element_size(), 4) + 256
        state += 64
    return max(64 * 1024, int(max(step, state) * 1.25) + 16 * 1024)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_finite(t: torch.Tensor, what: str) -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise WireError(f"{what} has NaN or infinite values (training diverged or the data is "
                        "corrupt; lower the learning rate or clean the data)")


def _decode_as(data: bytes, what: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Decode a tensor that must have ``shape`` and ``dtype`` and be finite; the decoder checks
    the header first, so a message claiming another shape is refused before anything of its
    size is allocated."""
    try:
        t = decode_tensor(data, expect_shape=tuple(shape), expect_dtype=dtype)
    except WireError as exc:
        raise WireError(f"{what} must be {_dtype_name(dtype)} of shape {list(shape)}: {exc}"
                        ) from None
    _check_finite(t, what)
    return t


def _batch_size(data: bytes, what: str, sample: Sequence[int], dtype: torch.dtype,
                max_batch: int, hint: str) -> int:
    """The batch size of an activation message whose header must read [batch, *sample]."""
    try:
        info = message_info(data)
    except WireError as exc:
        raise WireError(f"{what}: {exc}") from None
    shape = info["shape"]
    if info["dtype"] != _dtype_name(dtype) or len(shape) != len(sample) + 1 \
            or shape[1:] != list(sample):
        raise WireError(f"{what} must be {_dtype_name(dtype)} of shape [batch, "
                        f"{', '.join(map(str, sample))}] ({hint}), got {info['dtype']} of shape "
                        f"{shape}; cut the same model at the same place on both sides")
    if shape[0] == 0:
        raise WireError(f"{what} is an empty batch: a round trains on at least one sample")
    if shape[0] > max_batch:
        raise WireError(f"{what} has a batch of {shape[0]} samples; this server trains on 1 to "
                        f"{max_batch} per round (send smaller batches, or restart "
                        f"serve-training with a larger {option('max_batch')})")
    return shape[0]


def _read_layer(msg: pb.LayerState, module: nn.Module) -> tuple[Update, Tensors]:
    """The (update, buffers) a LayerState carries for ``module``, every tensor checked for
    name, shape, dtype and finiteness; raises WireError naming the first problem."""
    i, params_own = msg.index, dict(module.named_parameters())
    buffers_own = dict(module.named_buffers())
    params: Tensors = {}
    for t in msg.params:
        own = params_own.get(t.name)
        if own is None or t.name in params:
            raise WireError(f"element {i} has no parameter {t.name!r} (or it was sent twice); "
                            f"its parameters are {sorted(params_own)}")
        params[t.name] = _decode_as(t.data, f"element {i} parameter {t.name!r}", own.shape,
                                    own.dtype)
    if params and set(params) != set(params_own):
        raise WireError(f"element {i} has parameters {sorted(params_own)}, got {sorted(params)}: "
                        "send all of them or none")
    buffers: Tensors = {}
    for t in msg.buffers:
        name = t.name.removeprefix(OPTIM_PREFIX)
        like = params_own.get(name) if t.name.startswith(OPTIM_PREFIX) else buffers_own.get(name)
        if like is None or t.name in buffers:
            raise WireError(f"element {i} has no buffer {t.name!r} (or it was sent twice); its "
                            f"buffers are {sorted(buffers_own)}, with optimizer state "
                            f"{OPTIM_PREFIX}<parameter>")
        buffers[t.name] = _decode_as(t.data, f"element {i} buffer {t.name!r}", like.shape,
                                     like.dtype)
    plain = {k for k in buffers if not k.startswith(OPTIM_PREFIX)}
    if plain and plain != set(buffers_own):
        raise WireError(f"element {i} has buffers {sorted(buffers_own)}, got {sorted(plain)}: "
                        "send all of them or none")
    return (params, msg.absolute), buffers


@dataclass
class _Snapshot:
    """What an update changes on one side, copied just before it (see :meth:`_Replica.restore`):
    the updated elements' parameters, momentum (None: none yet) and buffers (as
    :meth:`_Replica.save_buffers` saved them before the forward pass moved them), and the set
    of elements trained since the last sync."""

    params: list[tuple[torch.Tensor, torch.Tensor]]
    momentum: list[tuple[torch.Tensor, torch.Tensor | None]]
    buffers: list[tuple[torch.Tensor, torch.Tensor]]
    trained: set[int]


@dataclass
class _Merged:
    """An element's state after a merge, computed into new tensors before anything changes."""

    params: Tensors
    buffers: Tensors | None  # None: keep this side's (it owns the element)


class _Replica:
    """One side's copy of the chain: its optimizer, the base snapshot of the last sync and the
    elements it trained since then."""

    def __init__(self, model: nn.Module, lr: float, momentum: float, seed: int) -> None:
        self.model, self.chain, self.seed = model, as_chain(model), seed
        unique = {id(p): p for p in model.parameters() if p.requires_grad}
        self.params = list(unique.values())
        self.opt = torch.optim.SGD(self.params, lr=lr, momentum=momentum) if unique else None
        self.base = {i: {n: p.detach().clone() for n, p in m.named_parameters()}
                     for i, m in enumerate(self.chain)}
        self.trained: set[int] = set()

    def part(self, lo: int, hi: int) -> nn.Sequential:
        """chain[lo:hi] as one module, in train mode (draws unseeded: for inspection)."""
        return nn.Sequential(*self.chain[lo:hi]).train()

    def forward(self, lo: int, hi: int, x: torch.Tensor, round_: int) -> torch.Tensor:
        """chain[lo:hi] in train mode on ``x``; the random draws of round ``round_`` (dropout,
        drop-connect) come from per-element seeds, as in unsplit training
        (:func:`~edgesplit.train.split.seeded_forward`), wherever the cut is."""
        for module in self.chain[lo:hi]:
            module.train()
        return seeded_forward(self.chain, lo, hi, x, self.seed, round_)

    # -- one round, refusable until the update --------------------------------------------------
    def save_buffers(self, elements: Iterable[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the buffers a forward pass in train mode moves (batch-norm statistics)."""
        return [(b, b.detach().clone()) for i in elements for b in self.chain[i].buffers()]

    def undo(self, saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put back the buffers of :meth:`save_buffers` and drop the gradients: a refused
        round leaves no trace."""
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)

    def snapshot(self, elements: Iterable[int],
                 buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> _Snapshot:
        """Copies of what :meth:`update` of ``elements`` changes, so that it can be taken back;
        ``buffers`` from :meth:`save_buffers` before the forward pass."""
        params = [p for i in elements for p in self.chain[i].parameters()]
        state = self.opt.state if self.opt is not None else {}
        momentum = [(p, state.get(p, {}).get("momentum_buffer")) for p in params]
        return _Snapshot([(p, p.detach().clone()) for p in params],
                         [(p, None if b is None else b.clone()) for p, b in momentum],
                         buffers, set(self.trained))

    def restore(self, snapshot: _Snapshot) -> None:
        """Take an update back: afterwards parameters, momentum, buffers and the trained set
        are bit-identical to the :meth:`snapshot`."""
        with torch.no_grad():
            for p, value in snapshot.params:
                p.copy_(value)
        if self.opt is not None:
            for p, buf in snapshot.momentum:
                if buf is None:
                    self.opt.state.pop(p, None)
                else:
                    self.opt.state[p]["momentum_buffer"] = buf
        self.undo(snapshot.buffers)
        self.trained = set(snapshot.trained)

    def backward(self, start: torch.Tensor, grad: torch.Tensor | None) -> str | None:
        """Back-propagate from ``start`` (with ``grad``, or a scalar loss); why the gradients
        cannot be applied (not finite), or None."""
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        if start.requires_grad:
            start.backward(grad)
        if any(p.grad is not None and not bool(torch.isfinite(p.grad).all())
               for p in self.params):
            return "gradient"
        return None

    def update(self, elements: range) -> None:
        """Update only the parameters that got a gradient (SGD skips the others, momentum
        included)."""
        if self.opt is not None:
            self.opt.step()
        self.trained.update(elements)

    # -- syncing ---------------------------------------------------------------------------------
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

    def merged(self, i: int, updates: Sequence[Update | None], buffers: Tensors | None
               ) -> _Merged:
        """params = base + delta_device + delta_server (in that order on both sides, so the
        copies stay identical; one side's absolute params are taken as they are), computed
        into new tensors; raises WireError if the result is not finite."""
        sent = [u for u in updates if u is not None and u[0]]
        params = {}
        for name in dict(self.chain[i].named_parameters()):
            base = self.base[i][name]
            if len(sent) == 1 and sent[0][1]:
                new = sent[0][0][name].clone()
            else:
                new = base.clone()
                for values, absolute in sent:
                    new += values[name] - base if absolute else values[name]
            _check_finite(new, f"element {i} parameter {name!r} after the merge")
            params[name] = new
        return _Merged(params, buffers)

    def apply(self, i: int, merged: _Merged) -> None:
        """Take a merge's result: parameters and base, and the owner's buffers and momentum
        when sent (no momentum sent: the owner has none)."""
        with torch.no_grad():
            for name, p in self.chain[i].named_parameters():
                p.copy_(merged.params[name])
                self.base[i][name] = merged.params[name]
            if merged.buffers is not None:
                for name, b in self.chain[i].named_buffers():
                    if name in merged.buffers:
                        b.copy_(merged.buffers[name])
        if merged.buffers is not None and self.opt is not None:
            for name, p in self.chain[i].named_parameters():
                buf = merged.buffers.get(OPTIM_PREFIX + name)
                if buf is None:
                    self.opt.state.pop(p, None)
                else:
                    self.opt.state[p]["momentum_buffer"] = buf.clone()
        self.trained.discard(i)


def _layer_msg(index: int, update: Update | None, buffers: Tensors | None) -> pb.LayerState:
    params, absolute = update or ({}, False)
    msg = pb.LayerState(index=index, absolute=absolute)
    for name, t in params.items():
        msg.params.add(name=name, data=encode_tensor(t, 32))
    for name, t in (buffers or {}).items():
        msg.buffers.add(name=name, data=encode_tensor(t, 32))
    return msg


def _payload(states: Iterable[Tensors | None]) -> int:
    return sum(tensor_bytes(t) for s in states if s for t in s.values())


def _assign(module: nn.Module, params: Tensors, buffers: Tensors) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])
        for name, b in module.named_buffers():
            b.copy_(buffers[name])  # optimizer state (OPTIM_PREFIX) is not part of a model


# ---- server --------------------------------------------------------------------------------
def _failure(exc: Exception) -> str:
    log.exception("training server failed on a request")
    return f"training server failed: {type(exc).__name__}: {exc}"


def _digest(method: str, request: Any) -> bytes:
    """What tells a re-sent request from another one with the same sequence number."""
    return hashlib.sha256(method.encode() + b"\0" +
                          request.SerializeToString(deterministic=True)).digest()


@dataclass
class _Session:
    """An open session and its last accepted state-changing request: its number, its
    digest and the reply (sent again to a repeat), and, after a Step, what takes it back."""

    id: str
    peer: str
    last_seen: float  # time.monotonic() of its last request
    seq: int = 0
    digest: bytes = b""
    reply: Any = None
    undo: _Snapshot | None = None

    def repeat(self, method: str, seq: int, digest: bytes) -> Any:
        """The first reply if this is the last accepted request sent again, else None; a
        reused number with other content is refused (the device lost track)."""
        if seq == 0 or seq != self.seq:
            return None
        if digest != self.digest:
            raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{method} numbered {seq} reuses the number of an earlier, "
                             "different request that the server already applied (its reply "
                             "was lost and the device went on without it): device and server "
                             "are out of step; start a new session "
                             f"({option('take_over', True)}; the session's training is lost)")
        log.info("training session %s: %s %d sent again, answered from the first reply",
                 self.id[:8], method, seq)
        return self.reply

    def check_next(self, method: str, seq: int) -> None:
        """Refuse a number other than the next one: requests were lost or reordered."""
        if seq != self.seq + 1:
            raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{method} numbered {seq}, but the server's last accepted request "
                             f"was {self.seq}, so it expects {self.seq + 1} (or {self.seq} sent "
                             "again): device and server are out of step; start a new session "
                             f"({option('take_over', True)}; the session's training is lost)")

    def accept(self, seq: int, digest: bytes, reply: Any, undo: _Snapshot | None = None
               ) -> None:
        self.seq, self.digest, self.reply, self.undo = seq, digest, reply, undo


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
        self.max_batch, self.session_timeout_s = max_batch, float(session_timeout_s)
        self.token, self.tls = token, tls
        self._init_state = copy.deepcopy(model.state_dict())
        self.replica = _Replica(model, lr, momentum, seed)
        self.fingerprint = model_fingerprint(self.replica.chain)
        self.shapes = chain_shapes(self.replica.chain, sample_shape)
        self.limit = train_message_bytes(self.replica.chain, self.shapes, max_batch)
        self.lock = threading.Lock()
        self._session: _Session | None = None
        self._ended: OrderedDict[str, str] = OrderedDict()  # session id -> why it ended
        self._init_grpc(lambda server: pb_grpc.add_SplitTrainServiceServicer_to_server(
            _Servicer(self), server), self.limit, max_workers)

    # ---- sessions ------------------------------------------------------------------------------
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
            now, current = time.monotonic(), self._session
            if current is not None:
                idle = now - current.last_seen
                if not req.take_over and idle < self.session_timeout_s:
                    raise BadRequest(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"the server is training another session (device {current.peer}, last "
                        f"request {idle:.0f} s ago; sessions expire after "
                        f"{self.session_timeout_s:g} s idle): wait for it to finish, or, if it "
                        "is yours and that device restarted, take it over "
                        f"({option('take_over', True)}; the session's training is lost)")
                self._end(current, f"taken over by device {peer}" if req.take_over else
                          f"expired after {idle:.0f} s idle and was taken by device {peer}")
            self.replica.model.load_state_dict(self._init_state)
            self.replica = _Replica(self.replica.model, self.lr, self.momentum, self.seed)
            self._session = _Session(secrets.token_hex(16), peer, now)
            log.info("training session %s started for %s (%d chain elements)",
                     self._session.id[:8], peer, n)
            return pb.HelloReply(model_fingerprint=self.fingerprint, chain_length=n,
                                 version=PROTOCOL_VERSION, seed=self.seed,
                                 session_id=self._session.id, max_message_bytes=self.limit,
                                 max_batch=self.max_batch, classes=self.shapes.classes,
                                 session_timeout_s=self.session_timeout_s)

    def _end(self, session: _Session, why: str) -> None:
        self._ended[session.id] = why
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        if self._session is session:
            self._session = None
        log.info("training session %s ended: %s", session.id[:8], why)

    def _require_session(self, session_id: str) -> _Session:
        """Called under the lock: the request belongs to the open session, or is refused."""
        current = self._session
        if current is not None and session_id == current.id:
            current.last_seen = time.monotonic()
            return current
        if not session_id:
            why = "the request names no training session: the device must call Hello first"
        elif session_id in self._ended:
            why = (f"training session {session_id[:8]} has ended ({self._ended[session_id]}); "
                   "start a new session (its training is lost)")
        else:
            why = (f"unknown training session {session_id[:8]} (did the server restart?); "
                   "start a new session")
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION, why)

    def close_session(self, req: pb.CloseRequest) -> pb.CloseReply:
        """End the session ``req`` names, if it is the open one (closing twice is fine)."""
        with self.lock:
            current = self._session
            if current is None or req.session_id != current.id:
                return pb.CloseReply(closed=False)
            self._end(current, "closed by its device")
            return pb.CloseReply(closed=True)

    # ---- training --------------------------------------------------------------------------
    def step(self, req: pb.StepRequest) -> pb.StepReply:
        """Train chain[cut+1:] on the received activation; return the gradient at the cut.
        A repeat of the last Step gets its first reply and trains nothing; otherwise the
        request's content, then its number, is checked before the model is updated."""
        t0, digest = time.perf_counter(), _digest("Step", req)
        n, cut = len(self.replica.chain), req.cut
        if not -1 <= cut <= n - 2:
            raise invalid(f"cut {cut} is out of range: the server trains the elements after "
                           f"the cut, so it must be -1 to {n - 2} (cut {n - 1} is pure "
                           "on-device training and sends nothing)")
        with self.lock:  # a device whose session ended hears that first, not about its data
            first = self._require_session(req.session_id).repeat("Step", req.seq, digest)
        if first is not None:
            return first
        act, y = self._read_batch(req, cut)  # outside the lock: decoding takes time
        act.requires_grad_(cut >= 0)
        with self.lock:
            session = self._require_session(req.session_id)
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
        batch = _batch_size(req.activation, "activation", sample, dtype, self.max_batch, what)
        act = _decode_as(req.activation, "activation", (batch, *sample), dtype)
        y = _decode_as(req.labels, f"labels (one per sample of the batch of {batch})", (batch,),
                       torch.int64)
        classes = self.shapes.classes
        bad = (y < 0) | (y >= classes)
        if bool(bad.any()):
            raise invalid(f"labels must be class indices 0 to {classes - 1}, got "
                           f"{int(y[bad][0])} (ignore-index labels such as -100 are not "
                           "supported: leave those samples out)")
        return act, y

    def _train(self, cut: int, act: torch.Tensor, y: torch.Tensor, round_: int,
               session: _Session, seq: int) -> tuple[float, _Snapshot]:
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
        n, digest = len(self.replica.chain), _digest("Sync", req)
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
            device[layer.index] = _read_layer(layer, self.replica.chain[layer.index])
        missing = sorted(set(indices) - set(device))
        if missing:  # an element left out would lose its owner's buffers and momentum
            raise invalid(f"sync of {indices} sends no state for elements {missing}: send a "
                           "LayerState (possibly empty) for every element it merges")
        with self.lock:
            session = self._require_session(req.session_id)
            first = session.repeat("Sync", req.seq, digest)
            if first is not None:
                return first
            session.check_next("Sync", req.seq)
            device_trained = {i for i, (update, _) in device.items() if update[0]}
            own = self.replica.updates(indices, device_trained)
            reply = pb.SyncReply(round=req.round)
            for i in indices:
                reply.layers.append(_layer_msg(i, own.get(i), self.replica.buffers(i)
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
        digest = _digest("Undo", req)
        with self.lock:
            session = self._require_session(req.session_id)
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
            self._require_session(req.session_id)
            for i in indices:
                module = self.replica.chain[i]
                params = {n: p.detach() for n, p in module.named_parameters()}
                reply.layers.append(_layer_msg(i, (params, True), self.replica.buffers(i)))
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
    return explain(code, details, address, server="training server",
                   unavailable_hint="; is the split-training server running there?",
                   too_large_hint="send smaller batches")


def _sleep_slowdown(elapsed_s: float, slowdown: float) -> float:
    """Sleep (slowdown - 1) x elapsed; returns the emulated device time in seconds."""
    if slowdown > 1.0:
        time.sleep((slowdown - 1.0) * elapsed_s)
    return elapsed_s * max(slowdown, 1.0)


class RemoteSplitTrainer:
    """The end device of split training: trains chain[0..cut] and drives the server.

    ``model`` must be built like the server's (same factory, same seed); it is copied, so the
    caller's module is left untouched. ``link_mbps`` None disables link emulation (``rtt_ms``
    applies only with a bandwidth). ``take_over`` ends a session the server has open (this
    device's own, from before a crash) instead of being refused; training restarts from the
    initial model. :meth:`close` (or leaving the ``with`` block) ends the session.

    Every request that changes the server's state (Step, Sync, Undo) carries the session's
    next sequence number; one that failed on the way (UNAVAILABLE, DEADLINE_EXCEEDED: it may
    have been applied, its reply lost) is sent again, the same request with the same number,
    up to ``retries`` times with a backoff doubling from ``retry_backoff_s`` (up to
    ``MAX_BACKOFF_S``, as every client's: :func:`~edgesplit.runtime.calls.with_retries`); the
    server answers a repeat from its first reply, so nothing is applied twice.
    """

    def __init__(self, model: nn.Module,
                 address: str | LoopbackChannel, *, lr: float, momentum: float = 0.0,
                 seed: int, sync: str = "periodic", sync_every: int = 100,
                 link_mbps: float | None = None, rtt_ms: float = 0.0,
                 device_slowdown: float = 1.0, token: str | None = None,
                 tls: TlsFiles | None = None, timeout_s: float = 60.0,
                 take_over: bool = False, retries: int = 2,
                 retry_backoff_s: float = 0.2) -> None:
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
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0 \
                or not retry_backoff_s >= 0:
            raise ConfigError(f"retries must be a whole number >= 0 and retry_backoff_s >= 0 "
                              f"seconds, got {retries!r} and {retry_backoff_s!r}")
        self.retries, self.backoff_s = retries, float(retry_backoff_s)
        self._seq = 0  # the last sequence number the server accepted
        self.model = copy.deepcopy(model)
        self.replica = _Replica(self.model, lr, momentum, seed)
        self.n = len(self.replica.chain)
        self.address = address if isinstance(address, str) else "in-process"
        self.seed, self.policy, self.sync_every = seed, sync, sync_every
        self.device_slowdown, self.rtt_ms, self.timeout_s = device_slowdown, rtt_ms, timeout_s
        self.metadata = bearer_metadata(token)
        self.cut: int | None = None  # the cut of the last round
        self.round = 0
        self._server_trained: set[int] = set()
        self.bandwidth_mbps: float | None = None
        self._shaper = LinkShaper(None)
        if link_mbps is not None:
            self.set_bandwidth_mbps(link_mbps)
        self._closed = False
        self._channel: Any  # a grpc.Channel, or a LoopbackChannel standing in for one
        if not isinstance(address, str):  # a server's loopback_channel(): its own limit
            self._channel = address
            self._stub = pb_grpc.SplitTrainServiceStub(self._channel)
            self._hello(take_over)
            return
        self._channel = open_channel(address, _HELLO_LIMIT, tls)
        try:
            self._stub = pb_grpc.SplitTrainServiceStub(self._channel)
            hello = self._hello(take_over)
            # the server sized its limit from the model: reconnect with it for the big messages
            self._channel.close()
            self._channel = open_channel(address, self.limit, tls)
            self._stub = pb_grpc.SplitTrainServiceStub(self._channel)
        except BaseException:
            self._channel.close()
            raise
        log.info("training session %s on %s", hello.session_id[:8], address)

    # ---- plumbing ----------------------------------------------------------------------------
    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise RemoteError(_explain(exc.code(), exc.details(), self.address)) from None

    def _send(self, method, request):
        """A state-changing request, numbered after the last accepted one and sent again, with
        the same number, while it fails on the way (see the class docstring). The number
        advances only once the server accepted it."""
        request.seq = self._seq + 1
        on_the_way = rpc_failed_with(RETRYABLE)

        def again(exc: Exception) -> bool:  # asked only when it will be sent again
            if not on_the_way(exc):
                return False
            log.info("request %d failed on the way (%s); sending it again", request.seq,
                     cast(grpc.RpcError, exc).code().name)
            return True

        try:
            reply = with_retries(lambda _: method(request, timeout=self.timeout_s,
                                                  metadata=self.metadata),
                                 retries=self.retries, base_s=self.backoff_s, retryable=again)
        except grpc.RpcError as exc:
            raise RemoteError(_explain(exc.code(), exc.details(), self.address)) from None
        self._seq = request.seq
        return reply

    def _hello(self, take_over: bool) -> pb.HelloReply:
        fp = model_fingerprint(self.replica.chain)
        reply = self._call(self._stub.Hello, pb.HelloRequest(
            model_fingerprint=fp, chain_length=self.n, version=PROTOCOL_VERSION,
            seed=self.seed, take_over=take_over))
        if not reply.session_id or reply.max_batch < 1 or reply.classes < 1 \
                or reply.max_message_bytes < 1024:
            raise RemoteError(f"training server {self.address} answered Hello without a "
                              "session or its limits; run the same edgesplit version on both "
                              "sides")
        self.session_id, self.max_batch, self._seq = reply.session_id, reply.max_batch, 0
        self.classes, self.limit = reply.classes, reply.max_message_bytes
        return reply

    def set_bandwidth_mbps(self, mbps: float) -> None:
        """Emulate a link of ``mbps`` (both directions) from the next message on."""
        if not mbps > 0:
            raise ConfigError(f"link bandwidth must be > 0 Mbps, got {mbps}")
        self.bandwidth_mbps = float(mbps)
        self._shaper = LinkShaper(Link(name="emulated", bandwidth_mbps=mbps, rtt_ms=self.rtt_ms))

    def close(self) -> None:
        """End the session on the server (so that another device may train) and disconnect.
        A server that cannot be reached ends the session itself once it has been idle for
        its session timeout."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stub.Close(pb.CloseRequest(session_id=self.session_id),
                             timeout=min(self.timeout_s, 5.0), metadata=self.metadata)
        except grpc.RpcError as exc:
            log.debug("could not close training session: %s", exc.details())
        finally:
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

    def _check_batch(self, x: torch.Tensor, y: torch.Tensor, remote: bool) -> None:
        """Refuse a batch the server would refuse, before this side changes anything."""
        if x.dim() == 0 or y.dim() != 1 or len(y) != x.shape[0] or len(y) == 0:
            raise ConfigError(f"a batch is x [samples, ...] with one label per sample, at "
                              f"least one; got x {list(x.shape)} and labels {list(y.shape)}")
        if remote and len(y) > self.max_batch:
            raise ConfigError(f"a batch of {len(y)} samples is more than the training server "
                              f"takes per round ({self.max_batch}); use smaller batches or "
                              f"restart serve-training with a larger {option('max_batch')}")
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ConfigError(f"labels must be integer class indices, got {y.dtype}")
        bad = (y < 0) | (y >= self.classes)
        if bool(bad.any()):
            raise ConfigError(f"labels must be class indices 0 to {self.classes - 1}, got "
                              f"{int(y[bad][0])} (ignore-index labels such as -100 are not "
                              "supported: leave those samples out)")
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise ConfigError("the input batch has NaN or infinite values; clean the data")

    # ---- one round ---------------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor, cut: int) -> RoundStats:
        """One training round on (x, y) with the device holding chain[0..cut]. A round that
        fails (refused by the server, not finite) leaves this side's model as it was."""
        cut = self._check_cut(cut)
        self._check_batch(x, y, remote=cut < self.n - 1)
        syncs: list[SyncResult] = []
        if self.policy == "fws" and self.cut is not None and cut != self.cut:
            lo, hi = sorted((self.cut, cut))
            syncs.append(self._sync(range(lo + 1, hi + 1)))
        self.cut = cut
        saved = self.replica.save_buffers(range(cut + 1))
        try:
            if cut == self.n - 1:
                (device_ms, loss), edge = self._local_round(x, y), (0.0, 0.0, 0, 0)
            else:
                device_ms, loss, edge = self._split_round(x, y, cut)
        except BaseException:
            self.replica.undo(saved)
            raise
        self.round += 1
        if self.policy == "periodic" and self.round % self.sync_every == 0:
            syncs.append(self.sync_now())
        edge_ms, server_ms, up, down = edge
        return RoundStats(self.round, cut, loss, device_ms, edge_ms, server_ms,
                          sum(s.sync_ms for s in syncs), up, down,
                          sum(s.total_bytes for s in syncs),
                          tuple(i for s in syncs for i in s.indices))

    def _diverged(self, what: str) -> ConfigError:
        return ConfigError(f"round {self.round + 1}: training on this batch gave a non-finite "
                           f"{what}; nothing was updated: lower the learning rate or scale the "
                           "inputs")

    def _local_round(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        t0 = time.perf_counter()
        loss = F.cross_entropy(self.replica.forward(0, self.n, x, self.round + 1), y)
        problem = "loss" if not bool(torch.isfinite(loss)) else self.replica.backward(loss, None)
        if problem is not None:
            raise self._diverged(problem)
        self.replica.update(range(self.n))
        seconds = _sleep_slowdown(time.perf_counter() - t0, self.device_slowdown)
        return seconds * 1e3, float(loss.detach())

    def _split_round(self, x: torch.Tensor, y: torch.Tensor, cut: int
                     ) -> tuple[float, float, tuple[float, float, int, int]]:
        t0 = time.perf_counter()
        act = self.replica.forward(0, cut + 1, x, self.round + 1) if cut >= 0 else x
        if not bool(torch.isfinite(act).all()):
            raise self._diverged(f"activation at cut {cut}")
        forward_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        request = pb.StepRequest(session_id=self.session_id, round=self.round + 1, cut=cut,
                                 activation=encode_tensor(act.float(), 32),
                                 labels=encode_tensor(y.to(torch.int64), 32))
        up = request.ByteSize()
        self._shaper.send(up, "up")
        reply = self._send(self._stub.Step, request)
        server_trained = set(self._server_trained)
        self._server_trained.update(range(cut + 1, self.n))  # it trained, unless taken back
        down = reply.ByteSize()
        self._shaper.send(down, "down")
        try:  # the server has stepped: a round that fails from here on is taken back there
            grad = self._gradient(reply.gradient, act) if cut >= 0 else None
            edge_ms = (time.perf_counter() - t1) * 1e3
            t2 = time.perf_counter()
            if grad is not None:
                problem = self.replica.backward(act, grad)
                if problem is not None:
                    raise self._diverged(problem)
        except EdgesplitError as exc:
            raise self._undo_step(request.seq, exc, server_trained) from None
        if cut >= 0:
            self.replica.update(range(cut + 1))
        device_s = _sleep_slowdown(forward_s + time.perf_counter() - t2, self.device_slowdown)
        return device_s * 1e3, reply.loss, (edge_ms, reply.server_ms, up, down)

    def _gradient(self, data: bytes, act: torch.Tensor) -> torch.Tensor:
        """The server's gradient at the cut, which must fit ``act`` and be finite."""
        try:
            return _decode_as(data, "the gradient at the cut", act.shape, torch.float32)
        except WireError as exc:
            raise RemoteError(f"training server {self.address} sent an unusable gradient: "
                              f"{exc}") from None

    def _undo_step(self, step_seq: int, why: EdgesplitError, server_trained: set[int]
                   ) -> EdgesplitError:
        """Ask the server to take back Step ``step_seq`` (the round failed on this side after
        the server had updated; ``server_trained``: what it had trained before); the error to
        raise, saying whether both sides are as before the round."""
        try:
            self._send(self._stub.Undo, pb.UndoRequest(session_id=self.session_id,
                                                       step_seq=step_seq))
        except RemoteError as exc:
            return RemoteError(f"{why}; the server had already applied this round and could "
                               f"not take it back ({exc}): device and server now differ, "
                               f"start a new session ({option('take_over', True)})")
        self._server_trained = server_trained
        return type(why)(f"{why} (the server's update of this round was taken back)")

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
        request = pb.SyncRequest(session_id=self.session_id, round=self.round, cut=cut,
                                 indices=indices)
        mine = {i: self.replica.buffers(i) for i in indices if i <= cut}
        for i in indices:
            request.layers.append(_layer_msg(i, own.get(i), mine.get(i)))
        up = request.ByteSize()
        self._shaper.send(up, "up")
        reply = self._send(self._stub.Sync, request)
        down = reply.ByteSize()
        self._shaper.send(down, "down")
        theirs = self._read_reply(reply.layers, indices)
        try:
            merged = {i: self.replica.merged(i, (own.get(i), theirs[i][0]),
                                             theirs[i][1] if i > cut else None)
                      for i in indices}
        except WireError as exc:
            raise RemoteError(f"sync with training server {self.address} failed: {exc}"
                              ) from None
        for i, state in merged.items():
            self.replica.apply(i, state)
        self._server_trained.difference_update(indices)
        payload = _payload([*(u[0] for u in own.values()), *mine.values()]) + \
            _payload(s for update, buffers in theirs.values() for s in (update[0], buffers))
        log.debug("synced elements %s: %d bytes up, %d down", indices, up, down)
        return SyncResult(tuple(indices), up, down, payload, (time.perf_counter() - t0) * 1e3)

    def _read_reply(self, layers, indices: list[int], complete: bool = False
                    ) -> dict[int, tuple[Update, Tensors]]:
        """The server's state of every element of ``indices``, checked against this model
        (``complete``: with all parameters and buffers, as a Fetch sends them)."""
        result = {}
        for layer in layers:
            if layer.index not in indices or layer.index in result:
                raise RemoteError(f"training server {self.address} answered with element "
                                  f"{layer.index}, which was not asked for (or twice)")
            try:
                (params, absolute), buffers = _read_layer(layer, self.replica.chain[layer.index])
            except WireError as exc:
                raise RemoteError(f"training server {self.address} sent a state that does not "
                                  f"fit this model: {exc}") from None
            module = self.replica.chain[layer.index]
            if complete and (len(params) != len(dict(module.named_parameters()))
                             or not set(dict(module.named_buffers())) <= set(buffers)):
                raise RemoteError(f"training server {self.address} sent element "
                                  f"{layer.index} without all its parameters and buffers")
            result[layer.index] = ((params, absolute), buffers)
        missing = sorted(set(indices) - set(result))
        if missing:
            raise RemoteError(f"training server {self.address} sent no state for elements "
                              f"{missing}; run the same edgesplit version on both sides")
        return result

    def final_model(self) -> nn.Module:
        """The trained model: sync what both sides trained, then take the device's copy of
        chain[0..cut] and the server's of the rest (the owners under the last cut)."""
        self.sync_now()
        model = copy.deepcopy(self.model)
        chain = as_chain(model)
        if self.cut is not None and self.cut < self.n - 1:
            indices = list(range(self.cut + 1, self.n))
            reply = self._call(self._stub.Fetch, pb.FetchRequest(session_id=self.session_id,
                                                                 indices=indices))
            for i, (update, buffers) in self._read_reply(reply.layers, indices,
                                                         complete=True).items():
                _assign(chain[i], update[0], buffers)
        return model.eval()
