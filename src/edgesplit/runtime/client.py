"""The client of split inference: ``ChainClient`` runs device 0 and drives the chain (its
servers: :func:`~edgesplit.runtime.server.partition_server`); ``RuntimeClient``, the base
of every runtime client (the chain's, the star's :class:`~edgesplit.runtime.star.StarClient`,
the LLM's :class:`~edgesplit.llm.generate.client.LLMClient`); and the helpers they share to
reach a server and say why a call failed (:func:`connect`, :func:`address_name`,
:func:`explain_failure`).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, cast

import grpc
import torch

from edgesplit.errors import ConfigError, RemoteError, WireError, option
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime.calls import (
    RETRYABLE,
    backoff_s,
    rpc_failed_with,
    runs_plan,
    with_retries,
)
from edgesplit.runtime.dataplane import (
    DataPlane,
    Hop,
    Message,
    Metadata,
    Part,
    as_part,
    reply_of,
)
from edgesplit.runtime.outputs import infer_rows
from edgesplit.runtime.planned import SESSION_KEY, decode_planned, link_before, max_message_bytes
from edgesplit.runtime.program import PlanProgram
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.transport import (
    LoopbackChannel,
    TlsFiles,
    bearer_metadata,
    explain,
    open_channel,
)
from edgesplit.transport.frames import Frame
from edgesplit.transport.shaping import LinkShaper

if TYPE_CHECKING:
    from edgesplit.runtime.mesh import Fanout

__all__ = ["ChainClient", "Reply", "RequestResult", "RuntimeClient", "address_name", "connect",
           "explain_failure"]

T = TypeVar("T")

# a reply as the client reads it: request id, the hops' timings, outputs by name, decode ms
Reply = tuple[int, dict[str, float], dict[str, torch.Tensor], float]


@dataclass
class RequestResult:
    request_id: int
    outputs: tuple[torch.Tensor, ...]
    breakdown_ms: dict[str, float]  # edge, serialize, transfer, remote, total
    hops_ms: dict[str, float] = field(default_factory=dict)  # what each server reported


class RuntimeClient:
    """What every runtime client holds and does alike: the call metadata (the bearer token,
    and the session where the client names one), the timeout of a call, retries with backoff
    (:func:`~edgesplit.runtime.calls.with_retries`), request ids (unique per client, safe
    across threads), the plan check made once before the first request, and closing.

    A subclass says, in its own words, how a final failure reads (:meth:`_failed`), which
    codes are worth another attempt (``retryable``), what it asks a server for its plan
    (:meth:`_described`) and how a mismatch reads (:meth:`_plan_mismatch`)."""

    retryable: ClassVar[tuple[grpc.StatusCode, ...]] = RETRYABLE
    address: str  # the server a failure is explained against

    def __init__(self, plan_id: str, token: str | None, *, timeout_s: float, retries: int,
                 retry_backoff_s: float, session: str | None = None) -> None:
        self.plan_id = plan_id  # what every server asked must run
        self.metadata = bearer_metadata(token)
        if session is not None:  # the servers keep backend state (a KV cache) per session
            self.metadata.append((SESSION_KEY, session))
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, retry_backoff_s
        self._ids = iter(range(1, 1 << 62))
        self._id_lock = threading.Lock()
        self._plan_checked = False

    def close(self) -> None:
        """Close the client's connections (a subclass's)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_request_id(self) -> int:
        """A request id this client has not used."""
        with self._id_lock:
            return next(self._ids)

    def _retried(self, attempt: Callable[[int], T], retryable: Callable[[Exception], bool]
                 ) -> T:
        """``attempt(n)`` retried with this client's retries and backoff while ``retryable``
        says so; a final failure is raised as it is."""
        return with_retries(attempt, retries=self.retries, base_s=self.backoff_s,
                            retryable=retryable)

    def _attempts(self, method: Callable[[float, Metadata], T]) -> T:
        """``method(timeout, metadata)``, retried on ``retryable``; a final gRPC failure is
        raised as it is. The first attempt is made as it is: the retry machinery (closures,
        the codes' set) is built for a failed one only, not on every request's hot path."""
        try:
            return method(self.timeout_s, self.metadata)
        except Exception as exc:
            retryable = rpc_failed_with(self.retryable)
            if not (self.retries > 0 and retryable(exc)):
                raise
        time.sleep(backoff_s(self.backoff_s, 0))
        # the attempts left, as with_retries makes them: backoff_s(2b, n) = backoff_s(b, n + 1)
        return with_retries(lambda _: method(self.timeout_s, self.metadata),
                            retries=self.retries - 1, base_s=2 * self.backoff_s,
                            retryable=retryable)

    def _call(self, method: Any) -> Any:
        """``method(timeout, metadata)``, retried on ``retryable``; a final gRPC failure
        becomes :meth:`_failed`'s error."""
        try:
            return self._attempts(method)
        except grpc.RpcError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: grpc.RpcError) -> Exception:
        """The error a call's final failure is raised as."""
        return RemoteError(explain_failure(exc.code(), exc.details(), self.address))

    def check_plan(self) -> None:
        """Ask the servers which plan they run before sending them tensors: a mismatch is
        then reported as such even when this plan's messages exceed a server's size limit."""
        for where, described in self._described():
            if not runs_plan(described, self.plan_id):
                raise RemoteError(self._plan_mismatch(where, described))
        self._plan_checked = True

    def _ensure_plan(self) -> None:
        """:meth:`check_plan`, once: until it passed."""
        if not self._plan_checked:
            self.check_plan()

    def _described(self) -> Iterator[tuple[str, pb.Description]]:
        """Each server asked (its name in a mismatch) and its ``Describe`` answer, in the
        order they are asked: a mismatch stops the asking."""
        raise NotImplementedError

    def _plan_mismatch(self, where: str, described: pb.Description) -> str:
        raise NotImplementedError


class ChainClient(RuntimeClient):
    """Runs device 0's partition and sends the rest of the chain to ``address``: over the
    server's data plane when it offers one (``data_plane="auto"``, the default; ``"tcp"``
    insists on it), else, or with ``"grpc"``, over gRPC. Safe to share between threads.
    A mesh whose root is device 0: ``address`` maps each branch device to its address, and
    the client broadcasts to them (:class:`edgesplit.runtime.mesh.Fanout`)."""

    def __init__(self, program: PlanProgram,
                 address: str | LoopbackChannel | Mapping[str, str | LoopbackChannel], *,
                 token: str | None = None,
                 tls: TlsFiles | None = None, shape: bool = False, timeout_s: float = 60.0,
                 retries: int = 0, retry_backoff_s: float = 0.2,
                 session: str | None = None, data_plane: DataPlane = "auto") -> None:
        super().__init__(program.plan_id, token, timeout_s=timeout_s, retries=retries,
                         retry_backoff_s=retry_backoff_s, session=session)
        self.program, self.step = program, program.steps[0]
        self.limit = max_message_bytes(program)
        # a mesh's root here: its fan-out shapes each branch's link
        fanout = program.root == self.step.name
        self.shaper = LinkShaper(link_before(program, 1) if len(program.steps) > 1 and
                                 not fanout else None, shape)
        self._hop: Hop | Fanout
        if isinstance(address, Mapping) or program.root == self.step.name:
            from edgesplit.runtime.mesh import Fanout

            if program.root != self.step.name:
                raise ConfigError("this plan's first device sends to one device: give the "
                                  "second device's address alone, not one per device")
            branches = address if isinstance(address, Mapping) else {}  # {}: says what to give
            self._hop = Fanout(program, branches, self.limit, tls, data_plane, shape)
        else:
            self._hop = Hop(address, self.limit, tls, data_plane)
        self.address = self._hop.address
        self._returns = list(program.steps[1].returns) if len(program.steps) > 1 else []
        self._reply_meta: dict[str, Any] | None = None  # a reply meta found well formed

    def close(self) -> None:
        self._hop.close()

    @property
    def data_plane(self) -> str:
        """How requests travel now: "tcp HOST:PORT" or "grpc" (decided by the first
        :meth:`describe`, which :meth:`request` makes before its first request)."""
        return self._hop.data_plane

    def describe(self) -> pb.Description:
        return self._call(self._hop.describe)

    def _described(self) -> Iterator[tuple[str, pb.Description]]:
        yield self.address, self.describe()

    def _plan_mismatch(self, where: str, described: pb.Description) -> str:
        return (f"server {where} refused the request: FAILED_PRECONDITION: plan "
                f"mismatch: the server runs plan {described.plan_id} (version "
                f"{described.plan_version}), this client {self.program.plan_id} (version "
                f"{PLAN_VERSION}); start both sides from the same plan file")

    def request(self, inputs: Sequence[torch.Tensor] | None = None) -> RequestResult:
        if self.step.sends:
            self._ensure_plan()
        request_id = self.next_request_id()
        start = time.perf_counter()
        values = self.step.compute(self.program.input_values(inputs))
        edge_ms = (time.perf_counter() - start) * 1e3
        if not self.step.sends:  # edge-only: nothing crosses
            total = (time.perf_counter() - start) * 1e3
            return RequestResult(request_id, tuple(values[t] for t in self.program.outputs),
                                 {"edge": edge_ms, "serialize": 0.0, "transfer": 0.0,
                                  "remote": 0.0, "total": total})
        t0 = time.perf_counter()
        encoded = self._encode(values)
        message = Message(self.program.plan_id, PLAN_VERSION, request_id,
                          [Part(name, data) for name, data in encoded.items()])
        serialize_ms = (time.perf_counter() - t0) * 1e3
        if self.shaper.enabled:
            self.shaper.send(self._hop.wire_size(message), "up")
        # the reply's tensors decode straight from the connection's buffer (no copy first)
        reply_id, hops, remote, decode_ms = self._call(lambda timeout, metadata: self._hop.run(
            message, timeout, metadata, read=self._read_reply, read_frame=self._read_frame))
        if reply_id != request_id:
            raise RemoteError(f"reply for request {reply_id} arrived for request {request_id}")
        serialize_ms += decode_ms
        total = (time.perf_counter() - start) * 1e3  # the request's clock stops here
        remote_ms = 0.0
        for key, ms in hops.items():
            if key.endswith(".compute_ms"):
                remote_ms += ms
            elif key.endswith(".serialize_ms"):
                serialize_ms += ms
        outputs = tuple(values.get(t, remote.get(t)) for t in self.program.outputs)
        if any(o is None for o in outputs):
            raise RemoteError("the chain did not return every model output")
        return RequestResult(request_id, cast(tuple[torch.Tensor, ...], outputs), {
            "edge": edge_ms, "serialize": serialize_ms, "remote": remote_ms,
            "transfer": max(0.0, total - edge_ms - serialize_ms - remote_ms), "total": total},
            hops)

    def infer(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Every row of ``inputs`` (one tensor per model input, rows along dimension 0: a
        multiple of the plan's batch size) through the split, one request per batch in order;
        the model's outputs, rows in order (:meth:`request` sends one batch and says how long
        each part took)."""
        return infer_rows(self.request, self.program, inputs)

    def _encode(self, values: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The sent tensors' messages; over the data plane a large plain one goes out from
        the tensor's own memory (its header and checksum in front), not copied into bytes."""
        if self._hop.frames is None:
            return self.program.encode(self.step, values, self.step.sends)
        bits, codec = self.step.send_bits, self.program.codec
        return {t: as_part(codec(t).encode_pieces(values[t], bits.get(t, 32)))
                for t in self.step.sends}

    def _read_reply(self, reply: Message) -> Reply:
        """The reply's request id, timings, outputs (decoded) and the milliseconds decoding
        took."""
        t0 = time.perf_counter()
        remote = self._decode_reply(reply)
        return reply.request_id, reply.timings_ms, remote, (time.perf_counter() - t0) * 1e3

    def _read_frame(self, answer: Frame) -> Reply:
        """:meth:`_read_reply` of a data-plane reply, read from its frame: once its meta (the
        same object while a connection's replies repeat it) was found to name this plan's
        outputs in order and its timings, later replies decode their parts without building
        a Message or checking names again. Anything else reads the general way, which says
        what is wrong."""
        meta, parts = answer.meta, answer.parts
        if meta is not self._reply_meta or len(parts) != len(self._returns) + 1:
            read = self._read_reply(reply_of(answer))
            if (meta.get("names") == self._returns and isinstance(meta.get("timings"), list)
                    and len(parts) == len(self._returns) + 1):
                self._reply_meta = meta
            return read
        t0 = time.perf_counter()
        names, decode = meta["timings"], self.program.decode
        try:
            remote = {name: decode(name, data)  # the last part holds the timings
                      for name, data in zip(self._returns, parts, strict=False)}
        except WireError:
            return self._read_reply(reply_of(answer))
        if len(parts[-1]) != 8 * len(names):
            return self._read_reply(reply_of(answer))
        timings = dict(zip(names, struct.unpack(f"<{len(names)}d", parts[-1]), strict=True))
        return answer.request_id, timings, remote, (time.perf_counter() - t0) * 1e3

    def _decode_reply(self, reply: Message) -> dict[str, torch.Tensor]:
        """The outputs a server answered with: only the ones this client waits for, each of
        the plan's shape and dtype (a hostile or broken server cannot make it allocate more)."""
        expected = set(self.program.steps[1].returns)
        names = [t.name for t in reply.tensors]
        if set(names) != expected or len(names) != len(expected):
            raise RemoteError(f"server {self.address} answered with tensors {names}, the plan "
                              f"expects {sorted(expected)}")
        try:
            return {t.name: decode_planned(self.program, t.name, t.data) for t in reply.tensors}
        except WireError as exc:
            raise RemoteError(f"server {self.address} answered with a bad tensor: {exc}"
                              ) from None


def connect(address: str | grpc.Channel | LoopbackChannel, limit: int, tls: TlsFiles | None
             ) -> grpc.Channel | LoopbackChannel:
    """A channel to ``address``, or the channel given (a server's ``loopback_channel()``)."""
    return open_channel(address, limit, tls) if isinstance(address, str) else address


def address_name(address: str | grpc.Channel | LoopbackChannel) -> str:
    return address if isinstance(address, str) else "in-process"


def explain_failure(code: grpc.StatusCode, details: str | None, address: str) -> str:
    return explain(code, details, address,
                   unavailable_hint="; is `edgesplit serve` running there? "
                   f"({option('retries')} retries with backoff)",
                   timeout_hint=f"raise {option('timeout_s')}")
