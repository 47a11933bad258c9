"""Serving one stage of a causal LM plan: :func:`llm_stage_server`, a
:class:`~edgesplit.runtime.shell.ServingShell` around an :class:`LLMStage` handler.

It speaks the layer runtime's service (``PartitionService``: ``Run``, ``RunStream``,
``Describe``) and data plane, with its bearer token, TLS, deadlines and request errors, so a
stage is reached, secured and timed out like any partition server; only what a request means
differs (:mod:`edgesplit.llm.stage.wire`). Each stage keeps one KV cache per session
(:class:`~edgesplit.llm.stage.kv_sessions.LLMSessions`), runs its blocks, and forwards the
hidden state to the next stage with the caller's token and session; the stage holding the head
answers the greedy token, which travels back along the chain to the client.

A session's error is its request's status: past the max context OUT_OF_RANGE, unknown (evicted,
never started) or a step past what the cache holds ABORTED, another client's (another secret)
PERMISSION_DENIED, no cache free before the deadline RESOURCE_EXHAUSTED; a malformed request
(no session secret included) INVALID_ARGUMENT; another plan FAILED_PRECONDITION. A step at a
position below what the cache holds rewinds it there first (a conversation's next turn). A
failed step leaves every session as it was (a rewinding one, at the position it rewound to).
At most ``max_workers`` steps run at once, whether they came over gRPC or the data plane.

With ``emulate=True`` each step's real compute is slowed to the plan device's speed (the cost
model's ratio of its time to this machine's), and links are shaped to the plan's where the
options say ``shape`` (:mod:`edgesplit.llm.stage.emulation`).

Not the layer partition server's handler: that one checks each tensor against a captured
LayerGraph's fixed shapes and batches across requests, while a stage's tensors grow with the
prompt and its state is a per-session cache that must not be silently recreated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import grpc
import torch
from torch import nn

from edgesplit.errors import ConfigError, RemoteError, SessionError, option
from edgesplit.llm.stage.compute import StageModel, llm_section, open_stage
from edgesplit.llm.stage.emulation import (
    StagePacer,
    phase_of,
    stage_links,
)
from edgesplit.llm.stage.kv_sessions import OWNER_KEY, LLMSessions, owner_digest
from edgesplit.llm.stage.sampling import Sampling
from edgesplit.llm.stage.wire import (
    END_SESSION,
    POSITION,
    SAMPLING,
    SESSION_CODES,
    TOKEN,
    DecodeCodec,
    decode_sampling,
    decode_step,
    message,
    session_status,
)
from edgesplit.plan.model import PLAN_VERSION, LLMPlan, Plan
from edgesplit.runtime.dataplane import Message
from edgesplit.runtime.options import ServeOptions
from edgesplit.runtime.planned import SESSION_KEY
from edgesplit.runtime.program import plan_id
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.shell import (
    NextHop,
    ServingShell,
    WorkerSlots,
    check_next,
    check_request_plan,
    check_served,
    failure_of,
    open_hop,
)
from edgesplit.transport import (
    BadRequest,
    LoopbackChannel,
    check_alive,
    remaining_timeout,
)
from edgesplit.transport.frames import REPLY, Frame
from edgesplit.transport.shaping import LinkShaper

__all__ = ["DEFAULT_WORKERS", "LLMStage", "check_sessions_fit", "head_stage", "llm_message_bytes",
           "llm_stage_server", "stage_index"]

DEFAULT_WORKERS = 8  # steps a stage serves at once unless told otherwise

_HEADERS = 64 * 1024
_GRPC_MAX_MESSAGE = 2**31 - 1  # gRPC's message limits are C ints


def llm_message_bytes(llm: LLMPlan) -> int:
    """The largest step message: a prompt's hidden state at max context, 8 bytes a value
    at most, plus headers; ConfigError when that passes what a gRPC message can carry (a
    context that long is refused up front rather than by gRPC's options or mid-session)."""
    need = llm.max_context * llm.hidden_size * 8 + _HEADERS
    if need > _GRPC_MAX_MESSAGE:
        most = (_GRPC_MAX_MESSAGE - _HEADERS) // (llm.hidden_size * 8)
        raise ConfigError(f"the plan's max context of {llm.max_context} tokens makes a step of "
                          f"up to {need} bytes (hidden size {llm.hidden_size}), more than the "
                          f"2 GiB a message carries: plan it again with --max-context {most} "
                          "or less")
    return max(_HEADERS, need)


def stage_index(plan: Plan, device: str) -> int:
    """The stage of ``device``: a plan device's name, or the preset it was planned with when
    exactly one plan device uses it."""
    names = [d.name for d in plan.devices]
    if device in names:
        return names.index(device)
    matches = [i for i, d in enumerate(plan.devices) if d.device.name == device]
    if len(matches) == 1:
        return matches[0]
    presets = ", ".join(f"{d.name} ({d.device.name})" for d in plan.devices)
    if matches:
        raise ConfigError(f"{len(matches)} plan devices use {device!r}: name one of {presets}")
    raise ConfigError(f"device {device!r} is not in the plan; its devices are {presets}")


def check_sessions_fit(llm: LLMPlan, index: int, device: str, sessions: int) -> None:
    """ConfigError when ``sessions`` KV caches at the plan's max context, with the stage's
    weights and working set, pass the memory its plan device has (more sessions than the
    plan was priced for; a quantized stage allocates them all up front)."""
    stage = llm.stages[index]
    limit = stage.memory_limit_bytes
    if limit is None or sessions <= llm.sessions:
        return
    per_session = stage.kv_cache_bytes / llm.sessions
    need = stage.memory_bytes + per_session * (sessions - llm.sessions)
    if need > limit:
        most = llm.sessions + int((limit - stage.memory_bytes) // max(per_session, 1))
        raise ConfigError(
            f"{sessions} sessions' KV caches at the plan's max context of {llm.max_context} "
            f"tokens need {need / 2**20:.1f} MiB on device {device!r} with its blocks, more "
            f"than its {limit / 2**20:.1f} MiB: serve with "
            f"{option('max_sessions', max(most, llm.sessions))} or fewer, or plan a shorter "
            "--max-context")


def head_stage(llm: LLMPlan) -> int:
    """The stage holding the head: the chain ends there (later devices hold no blocks)."""
    return next(i for i, s in enumerate(llm.stages) if s.end == len(llm.blocks)
                and (s.start < s.end or len(llm.blocks) == 0))


def llm_stage_server(plan: Plan, device: str, options: ServeOptions | None = None, *,
                     next_address: str | LoopbackChannel | None = None,
                     max_sessions: int | None = None, model: nn.Module | None = None,
                     emulate: bool = False, dilation: float = 1.0,
                     torch_device: str | torch.device | None = None,
                     threads: int | None = None) -> ServingShell[LLMStage]:
    """The server of stage ``device`` of the LLM ``plan``, served as ``options`` say (at most
    ``DEFAULT_WORKERS`` steps at once unless they say otherwise); a stage before the head
    forwards to ``next_address``. ``max_sessions`` KV caches at once (default: the plan's
    ``sessions``, what its memory was planned for), the least recently used idle one evicted
    first. ``model``: the transformers model to take the stage's blocks from (default: the
    plan's checkpoint, only this stage's tensors, or built from its source). ``emulate``:
    each step's real compute is slowed to the plan device's speed; ``options.shape``: its
    sends and replies take the plan's link time; ``dilation``: both ``dilation`` times slower
    (:mod:`edgesplit.llm.stage.emulation`). ``torch_device``: where the stage computes
    (``cpu``, ``cuda[:N]``, ``mps``); ``threads``: a quantized stage's ONNX Runtime threads
    (default 1; a float stage computes on torch's)."""
    options = options or ServeOptions()
    llm = llm_section(plan)
    index = stage_index(plan, device)
    name, head = plan.devices[index].name, head_stage(llm)
    check_served(name, first=index == 0, client="`edgesplit llm generate`")
    if index > head:
        raise ConfigError(f"device {name!r} holds no blocks and the chain ends before it (at "
                          f"{plan.devices[head].name!r}, with the head): nothing to serve "
                          "there")
    check_next(name, plan.devices[index + 1].name if index < head else None, next_address)
    max_sessions = max_sessions or llm.sessions
    check_sessions_fit(llm, index, name, max_sessions)  # before a cache is allocated
    stage = open_stage(plan, index, model, torch_device, threads=threads, sessions=max_sessions)
    sessions = LLMSessions(name, stage.new_cache, max_sessions=max_sessions,
                           max_context=llm.max_context)
    # one bound for gRPC's calls and the data plane's (which has a thread per connection)
    slots = WorkerSlots(options.workers(DEFAULT_WORKERS), name,
                        f"{option('max_workers')} steps: try again, or serve with more "
                        "workers", options.next_timeout_s)
    limit = llm_message_bytes(llm)
    before, after = stage_links(plan, index, dilation)
    downstream = LinkShaper(after if index < head else None, options.shape)  # steps forwarded
    # the token, the session and its secret travel on: every stage keeps the session
    forwarding = None if index == head else NextHop(
        open_hop(cast(Any, next_address), limit, options), name,
        timeout_s=options.next_timeout_s, shaper=downstream,
        passes=("authorization", SESSION_KEY, OWNER_KEY), own=_passed_back)
    pacer = StagePacer.measured(stage, plan, dilation=dilation) if emulate else None
    handler = LLMStage(plan, stage, sessions, slots, forwarding, pacer=pacer,
                       upstream=LinkShaper(before, options.shape))  # replies, to the caller
    return ServingShell(handler, options, limit=limit, slots=slots)


class LLMStage:
    """What an LLM stage server's shell serves: ``stage`` of ``plan`` over ``sessions``' KV
    caches, each step in one of ``slots``; ``forwarding`` reaches the next stage (None: this
    one holds the head); ``pacer`` slows compute to the plan device's (None: real), and
    ``upstream`` shapes the replies."""

    def __init__(self, plan: Plan, stage: StageModel, sessions: LLMSessions,
                 slots: WorkerSlots, forwarding: NextHop | None, *,
                 pacer: StagePacer | None, upstream: LinkShaper) -> None:
        self.plan, self.llm, self.plan_id = plan, llm_section(plan), plan_id(plan)
        self.stage, self.sessions, self.slots = stage, sessions, slots
        self.forwarding, self.pacer, self.upstream = forwarding, pacer, upstream
        self.downstream = forwarding.shaper if forwarding is not None \
            else LinkShaper(None, False)
        self.device = sessions.device
        io = stage.io
        self.inputs, self.outputs = [io.receives, POSITION, SAMPLING], [TOKEN]
        self.failure = failure_of(self.device, "step")
        self._ser_key = f"{self.device}.serialize_ms"
        self.codec = DecodeCodec(self.llm.hidden_size)
        # the last call's metadata and its session and owner digest (:meth:`_caller_of`)
        self._caller: tuple[object, str, str] = (None, "", "")

    # ---- the shell's handler -------------------------------------------------------------
    def reply_pb(self, request: pb.Bundle, context: grpc.ServicerContext) -> pb.Bundle:
        """One gRPC step's answer (:meth:`handle`)."""
        return self.handle(request, context).to_pb()

    def answer_frame(self, frame: Frame, context: grpc.ServicerContext) -> Frame:
        """One data-plane step's answer (:meth:`handle`); the shell checked its token."""
        return self.handle(Message.from_frame(frame), context).to_frame(REPLY)

    def started(self, serving: Callable[[bool], None]) -> None:
        """Nothing to start: the server's health is its own."""

    def refuse(self) -> None:
        """Nothing waits but for the shell's slots (and a cache: its step holds a slot)."""

    def drain(self, timeout: float) -> None:
        """Nothing waits but for the shell's slots."""

    def close(self) -> None:
        if self.forwarding is not None:
            self.forwarding.close()

    def _caller_of(self, context: grpc.ServicerContext | None) -> tuple[str, str]:
        """The call's session and owner digest (:func:`_session`, :func:`_owner`); a data-plane
        connection repeats its calls' metadata as one object (a tuple), whose pair is kept:
        hashing the secret and reading the metadata twice cost ~40 us a step after compute
        (measured)."""
        metadata = context.invocation_metadata() if context is not None else None
        last = self._caller  # one read: other threads replace the triple, never half of it
        if metadata is not None and last[0] is metadata:
            return last[1], last[2]
        session, owner = _session(context), _owner(context)
        if isinstance(metadata, tuple):  # immutable: the same object, the same pair
            self._caller = (metadata, session, owner)
        return session, owner

    # ---- a step ------------------------------------------------------------------------------
    def handle(self, request: pb.Bundle | Message, context: grpc.ServicerContext | None = None
               ) -> Message:
        """Answer one step (or an end of session) of the caller's session, in one of the
        ``max_workers`` slots that gRPC's calls and the data plane's share."""
        self.slots.take(context)
        try:
            return self._handle(request, context)
        finally:
            self.slots.give()

    def _handle(self, request: pb.Bundle | Message, context: grpc.ServicerContext | None
                ) -> Message:
        t_in = time.perf_counter()
        check_request_plan(request, self.plan_id)
        session, owner = self._caller_of(context)
        parts = {t.name: t.data for t in request.tensors}
        if list(parts) == [END_SESSION]:
            return self._end(request, session, owner, context)
        io = self.stage.io
        if not {io.receives, POSITION} <= set(parts) <= {io.receives, POSITION, SAMPLING} or \
                len(request.tensors) != len(parts):
            raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                             f"device {self.device!r} expects tensors {io.receives!r} and "
                             f"{POSITION!r}, optionally {SAMPLING!r} (or only "
                             f"{END_SESSION!r}), got {[t.name for t in request.tensors]}")
        codec = self.codec
        position = codec.read_position(parts[POSITION])
        sampling = decode_sampling(parts[SAMPLING]) if SAMPLING in parts else None
        if io.hidden_in:
            x = codec.read_hidden(parts[io.receives], io.receives,
                                  vocab_size=self.llm.vocab_size,
                                  max_tokens=self.llm.max_context)
        else:
            x = decode_step(parts[io.receives], io.receives, hidden_size=None,
                            vocab_size=self.llm.vocab_size, max_tokens=self.llm.max_context)
        timings = {self._ser_key: (time.perf_counter() - t_in) * 1e3}
        check_alive(context, self.device)
        try:
            with self.sessions.step(session, position, int(x.shape[1]), owner,
                                    wait_s=remaining_timeout(context, self.slots.timeout_s)
                                    ) as state:
                t0 = time.perf_counter()
                out = self.stage.step(x, position, state.cache, sampling)
                if self.pacer is not None:  # the time slept is part of the compute
                    timings[f"{self.device}.emulated_ms"] = self.pacer.pace(
                        t0, phase_of(position))
                timings[f"{self.device}.compute_ms"] = (time.perf_counter() - t0) * 1e3
                # the rest of the chain; its failure rolls this stage back too
                token = out if self.forwarding is None else \
                    self._forward(request, out, position, sampling, context, timings)
        except SessionError as exc:
            raise session_status(exc) from None
        reply = codec.token_reply(self.plan_id, PLAN_VERSION, request.request_id,
                                  int(token), timings)
        if self.upstream.enabled:  # the token's way back to the caller
            self.upstream.send(reply.to_frame(REPLY).nbytes(), "down")
        return reply

    def _end(self, request: pb.Bundle | Message, session: str, owner: str,
             context: grpc.ServicerContext | None) -> Message:
        try:
            self.sessions.end(session, owner)
        except SessionError as exc:
            raise session_status(exc) from None
        if self.forwarding is not None:  # not shaped: the plan's links price steps, not ends
            end = message(self.plan_id, PLAN_VERSION, request.request_id,
                          {END_SESSION: torch.zeros(1, dtype=torch.int64)})
            self.forwarding.call(end, context)
        return Message(self.plan_id, PLAN_VERSION, request.request_id, [], {})

    def _forward(self, request: pb.Bundle | Message, out: torch.Tensor, position: int,
                 sampling: Sampling | None, context: grpc.ServicerContext | None,
                 timings: dict[str, float]) -> torch.Tensor:
        """The next stage's token for what this one computed (its serialize time and the
        next stages' timings added to ``timings``)."""
        t0 = time.perf_counter()
        step = self.codec.step(self.plan_id, PLAN_VERSION, request.request_id,
                               self.stage.io.sends, out, position, sampling)
        assert self.forwarding is not None
        reply = self.forwarding.forward(step, context, timings, self._ser_key, t0)
        names = [t.name for t in reply.tensors]
        if names != [TOKEN]:
            raise RemoteError(f"the stage after {self.device!r} answered with {names}, "
                              f"not {TOKEN!r}")
        return torch.tensor([[self.codec.read_token(reply.tensors[0].data)]],
                            dtype=torch.int64)


def _passed_back(exc: grpc.RpcError) -> BadRequest | None:
    """The next stage's failure this step fails with as it is: a session's status (the
    client acts on it), the caller's deadline or cancellation, a step the next stage refused
    as malformed (anything else: the next hop failed)."""
    code = exc.code()
    if code in SESSION_CODES or code in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                         grpc.StatusCode.CANCELLED,
                                         grpc.StatusCode.INVALID_ARGUMENT):
        return BadRequest(code, exc.details() or code.name)
    return None


def _owner(context: grpc.ServicerContext | None) -> str:
    """The digest of the caller's session secret (metadata OWNER_KEY), which every step and
    end must carry: a session is bound to the client that made it."""
    secret = dict(context.invocation_metadata()).get(OWNER_KEY) if context else None
    digest = owner_digest(secret if isinstance(secret, str) else None)
    if digest is None:
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"an LLM session answers only the client that made it: send a secret "
                         f"of your own with every step and end, call metadata {OWNER_KEY!r} "
                         "(LLMClient does)")
    return digest


def _session(context: grpc.ServicerContext | None) -> str:
    session = dict(context.invocation_metadata()).get(SESSION_KEY) if context else None
    if not isinstance(session, str) or not session:
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"an LLM stage keeps a KV cache per session: name yours with call "
                         f"metadata {SESSION_KEY!r} (LLMClient does)")
    return session
