"""The end device of split training (:class:`RemoteSplitTrainer`), as in L2S (paper 002, Sec.
III-A and IV-C): it holds chain elements ``[0..cut]`` of the model, the edge server
(:func:`~edgesplit.train.remote.server.training_server`) the rest; cut ``len(chain) - 1`` is pure
on-device training (no RPC). Each round the device runs the front forward, sends the
activation and the labels (``Step``), the server runs the back forward, backward and update and
returns the gradient at the cut (computed before its update), and the device finishes the
backward pass and updates. Syncs follow the policy of
:mod:`~edgesplit.train.remote.protocol`.

The device emulates the link for both directions (:class:`LinkShaper`); the bandwidth may
change at any round (:meth:`RemoteSplitTrainer.set_bandwidth_mbps`). A round the device cannot
finish after the server stepped (a non-finite gradient at the cut or in the device's part) is
taken back with Undo.

The device is told three things apart: how it trains (:class:`TrainOptions`: SGD and the sync
policy), what it emulates (:class:`Emulation`: the link, a slower device) and how it calls the
server (:class:`~edgesplit.runtime.options.CallOptions`: token, TLS, timeout, retries).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Self, cast

import grpc
import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError, EdgesplitError, RemoteError, WireError, option
from edgesplit.hardware import Link
from edgesplit.quant.wire import encode_tensor
from edgesplit.runtime.calls import RETRYABLE, rpc_failed_with, with_retries
from edgesplit.runtime.options import CallOptions
from edgesplit.train.proto import edgesplit_train_pb2 as pb
from edgesplit.train.proto import edgesplit_train_pb2_grpc as pb_grpc
from edgesplit.train.remote.protocol import (
    PROTOCOL_VERSION,
    SYNC_POLICIES,
    Tensors,
    Update,
    decode_as,
    layer_msg,
    model_fingerprint,
    read_layer,
)
from edgesplit.train.remote.replica import Replica
from edgesplit.train.split import as_chain, tensor_bytes
from edgesplit.transport import LoopbackChannel, bearer_metadata, explain, open_channel
from edgesplit.transport.shaping import LinkShaper

__all__ = ["DEFAULT_RETRIES", "Emulation", "RemoteSplitTrainer", "RoundStats", "SyncResult",
           "TrainOptions"]

log = logging.getLogger(__name__)

_HELLO_LIMIT = 1 << 20  # Hello and Close are tiny; the real limit comes with the HelloReply
DEFAULT_RETRIES = 2  # a numbered request is safe to send again: the server answers a repeat


@dataclass(frozen=True)
class TrainOptions:
    """How the device trains: SGD with ``lr`` and ``momentum`` from the model built with
    ``seed`` (the server must be given the same three), and how the two sides' copies of the
    model are merged: ``sync``, one of
    :data:`~edgesplit.train.remote.protocol.SYNC_POLICIES` (``periodic``: every
    ``sync_every`` rounds)."""

    lr: float
    seed: int
    momentum: float = 0.0
    sync: str = "periodic"
    sync_every: int = 100

    def __post_init__(self) -> None:
        if self.sync not in SYNC_POLICIES:
            raise ConfigError(f"sync policy {self.sync!r} is unknown: use one of "
                              f"{', '.join(SYNC_POLICIES)}")
        if self.sync_every < 1:
            raise ConfigError(f"sync_every must be at least 1 round, got {self.sync_every}")


@dataclass(frozen=True)
class Emulation:
    """What the device emulates: a link of ``link_mbps`` both ways (None: none; ``rtt_ms``
    applies only with a bandwidth) and a device ``device_slowdown`` times slower than this
    machine."""

    link_mbps: float | None = None
    rtt_ms: float = 0.0
    device_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if self.device_slowdown < 1.0:
            raise ConfigError(f"device_slowdown must be >= 1 (x the measured time), got "
                              f"{self.device_slowdown}")
        if self.rtt_ms < 0:
            raise ConfigError(f"rtt_ms must be >= 0, got {self.rtt_ms}")


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
    caller's module is left untouched. It trains as ``training`` says, emulates what
    ``emulation`` says (default: nothing) and calls the server at ``address`` as ``calls``
    say (default: no token, plain TCP). ``take_over`` ends a session the server has open
    (this device's own, from before a crash) instead of being refused; training restarts
    from the initial model. :meth:`close` (or leaving the ``with`` block) ends the session.

    Every request that changes the server's state (Step, Sync, Undo) carries the session's
    next sequence number; one that failed on the way (UNAVAILABLE, DEADLINE_EXCEEDED: it may
    have been applied, its reply lost) is sent again, the same request with the same number,
    up to ``calls.retries`` times (default ``DEFAULT_RETRIES``) with a backoff doubling from
    ``calls.retry_backoff_s`` (up to ``MAX_BACKOFF_S``, as every client's:
    :func:`~edgesplit.runtime.calls.with_retries`); the server answers a repeat from its
    first reply, so nothing is applied twice.
    """

    def __init__(self, model: nn.Module, address: str | LoopbackChannel,
                 training: TrainOptions, *, emulation: Emulation | None = None,
                 calls: CallOptions | None = None, take_over: bool = False) -> None:
        emulation, calls = emulation or Emulation(), calls or CallOptions()
        self.retries, self.backoff_s = calls.tries(DEFAULT_RETRIES), float(calls.retry_backoff_s)
        self._seq = 0  # the last sequence number the server accepted
        self.model = copy.deepcopy(model)
        self.replica = Replica(self.model, training.lr, training.momentum, training.seed)
        self.n = len(self.replica.chain)
        self.address = address if isinstance(address, str) else "in-process"
        self.seed, self.policy = training.seed, training.sync
        self.sync_every = training.sync_every
        self.device_slowdown, self.rtt_ms = emulation.device_slowdown, emulation.rtt_ms
        self.timeout_s = calls.timeout_s
        self.metadata = bearer_metadata(calls.token)
        self.cut: int | None = None  # the cut of the last round
        self.round = 0
        self._server_trained: set[int] = set()
        self.bandwidth_mbps: float | None = None
        self._shaper = LinkShaper(None)
        if emulation.link_mbps is not None:
            self.set_bandwidth_mbps(emulation.link_mbps)
        self._closed = False
        self._channel: Any  # a grpc.Channel, or a LoopbackChannel standing in for one
        if not isinstance(address, str):  # a server's loopback_channel(): its own limit
            self._channel = address
            self._stub = pb_grpc.SplitTrainServiceStub(self._channel)
            self._hello(take_over)
            return
        self._channel = open_channel(address, _HELLO_LIMIT, calls.tls)
        try:
            self._stub = pb_grpc.SplitTrainServiceStub(self._channel)
            hello = self._hello(take_over)
            # the server sized its limit from the model: reconnect with it for the big messages
            self._channel.close()
            self._channel = open_channel(address, self.limit, calls.tls)
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
            return decode_as(data, "the gradient at the cut", act.shape, torch.float32)
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
            request.layers.append(layer_msg(i, own.get(i), mine.get(i)))
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
                (params, absolute), buffers = read_layer(layer, self.replica.chain[layer.index])
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


def _payload(states: Iterable[Tensors | None]) -> int:
    return sum(tensor_bytes(t) for s in states if s for t in s.values())


def _assign(module: nn.Module, params: Tensors, buffers: Tensors) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])
        for name, b in module.named_buffers():
            b.copy_(buffers[name])  # optimizer state (OPTIM_PREFIX) is not part of a model
