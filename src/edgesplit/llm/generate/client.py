"""Generating with a causal LM split across devices: ``LLMClient`` runs the first stage itself
(the prompt starts and the tokens end on the chain's first device) and drives the rest of the
chain one step at a time, yielding each token as soon as its step returns.

The prefill sends the prompt, each decode step the previous token; every stage adds the
step's positions to its own KV cache for the session. Greedy (the default), the tokens are
exactly those of single-process ``model.generate(do_sample=False)`` on the same weights; with
:class:`~edgesplit.llm.stage.sampling.Sampling` the stage holding the head samples, and the
tokens are those of the same logits through the same seeded draw in one process.

*Conversations continue.* The client remembers each session's *conversation*: the tokens
every stage's KV session holds for it. A generation whose prompt extends them (the next turn:
the whole conversation so far, re-sent) sends only what is new, from the position where the
prompt leaves what is cached (stages rewind their caches to it where they hold more). When the
session is gone from a stage (evicted to make room, a restarted server), the client
re-prefills the whole prompt from its own copy, transparently, once, at the generation's
first step; a session lost in the middle of a generation fails it with SessionError. Any
failed generation forgets the session's conversation, so the next one starts from position 0.

``emulate=True`` slows the first stage's real compute to its device's speed and ``shape`` (on
by default) makes its sends take the plan's first link (:mod:`edgesplit.llm.stage.emulation`).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import torch
from torch import nn

from edgesplit.errors import (
    ConfigError,
    ContextLimitError,
    RemoteError,
    SessionError,
    SessionOwnerError,
    SessionsBusyError,
    option,
)
from edgesplit.llm.stage.compute import llm_section, open_stage
from edgesplit.llm.stage.emulation import (
    Phase,
    StagePacer,
    phase_of,
    stage_links,
)
from edgesplit.llm.stage.kv_sessions import OWNER_KEY, LLMSessions
from edgesplit.llm.stage.sampling import Sampling
from edgesplit.llm.stage.server import head_stage, llm_message_bytes
from edgesplit.llm.stage.wire import (
    END_SESSION,
    TOKEN,
    DecodeCodec,
    message,
    session_error,
)
from edgesplit.plan.model import PLAN_VERSION, Plan
from edgesplit.runtime.client import RuntimeClient
from edgesplit.runtime.dataplane import DataPlane, Hop, Message
from edgesplit.runtime.options import CallOptions
from edgesplit.runtime.planned import SESSION_KEY
from edgesplit.runtime.program import plan_id
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.transport import LoopbackChannel, explain
from edgesplit.transport.shaping import LinkShaper

__all__ = ["GeneratedToken", "LLMClient", "common_prefix"]

# session errors that do not mean the caches are gone: sending the prompt again cannot help
_NOT_GONE = (ContextLimitError, SessionOwnerError, SessionsBusyError)


@dataclass
class GeneratedToken:
    """One generated token: its index in the generation, the step that made it (``prefill``
    for the first), when it arrived since the generation started and how long its step took,
    and each stage's compute and codec time in that step (by device), and, where a stage
    emulates its device, the part of its compute it slept."""

    index: int
    token: int
    phase: Phase
    elapsed_ms: float
    step_ms: float
    compute_ms: dict[str, float] = field(default_factory=dict)
    serialize_ms: dict[str, float] = field(default_factory=dict)
    emulated_ms: dict[str, float] = field(default_factory=dict)
    reused: int = 0  # prompt tokens the session's caches already held (not run again)


class LLMClient(RuntimeClient):
    """The first stage of ``plan`` plus a caller of the second device at ``address`` (not
    needed when the first device holds every block), called as ``calls`` say (its token,
    TLS, each step's deadline, retries: none unless they say so) over ``data_plane``.
    ``session`` names this client's KV caches on every stage (default: a random id).
    ``model``: the transformers model to take
    the first stage's blocks from (default: the plan's checkpoint, or built from its source).
    ``emulate``: the first stage's real compute is slowed to its device's speed; ``shape``:
    its sends take the plan's link time; ``dilation``: both that many times slower.
    ``torch_device``: where the first stage computes (``cpu``, ``cuda[:N]``, ``mps``);
    ``threads``: its ONNX Runtime threads where its weights are quantized (default 1)."""

    # a step is only retried when it never reached a server
    retryable = (grpc.StatusCode.UNAVAILABLE,)

    def __init__(self, plan: Plan, address: str | LoopbackChannel | None = None, *,
                 session: str | None = None, calls: CallOptions | None = None,
                 data_plane: DataPlane = "auto", model: nn.Module | None = None,
                 emulate: bool = False, shape: bool = False, dilation: float = 1.0,
                 torch_device: str | torch.device | None = None,
                 threads: int | None = None) -> None:
        calls = calls or CallOptions()
        self.plan, self.llm, self.plan_id = plan, llm_section(plan), plan_id(plan)
        self.stage = open_stage(plan, 0, model, torch_device, threads=threads)
        self.device = plan.devices[0].name
        self.session = session or uuid.uuid4().hex
        super().__init__(self.plan_id, calls.token, timeout_s=calls.timeout_s,
                         retries=calls.tries(0), retry_backoff_s=calls.retry_backoff_s)
        self._bearer = self.metadata  # the token alone: each call names its session
        # this client's secret for its sessions: a stage answers a session it made only to it
        self._secret = secrets.token_urlsafe(24)
        self.metadata = self._metadata(self.session)
        self.sessions = LLMSessions(self.device, self.stage.new_cache,
                                    max_sessions=self.llm.sessions,
                                    max_context=self.llm.max_context)
        # per session id, its conversation: the tokens every stage's KV session holds
        self._conversations: dict[str, list[int]] = {}
        self.remote = head_stage(self.llm) > 0
        if self.remote and address is None:
            raise ConfigError(f"the chain continues at {plan.devices[1].name!r}: give its "
                              f"server's address ({option('address', flag='--server')} "
                              "HOST:PORT, where `edgesplit llm serve` listens)")
        self.address = address if isinstance(address, str) else "in-process"
        self._hop = Hop(address, llm_message_bytes(self.llm), calls.tls, data_plane) \
            if self.remote and address is not None else None
        self._codec = DecodeCodec(self.llm.hidden_size)
        self.pacer = StagePacer.measured(self.stage, plan, dilation=dilation) \
            if emulate else None
        self.shaper = LinkShaper(stage_links(plan, 0, dilation)[1] if self.remote else None,
                                 shape)

    @property
    def data_plane(self) -> str:
        """How steps travel: "tcp HOST:PORT", "grpc", or "local" (one device holds it all)."""
        return "local" if self._hop is None else self._hop.data_plane

    def close(self) -> None:
        if self._hop is not None:
            self._hop.close()

    def _metadata(self, session: str) -> list[tuple[str, str]]:
        return [*self._bearer, (SESSION_KEY, session), (OWNER_KEY, self._secret)]

    def held(self, session: str | None = None) -> list[int]:
        """The session's conversation: the tokens its caches hold, as this client knows
        them."""
        return list(self._conversations.get(session or self.session, []))

    def generate(self, prompt: Sequence[int] | torch.Tensor, new_tokens: int, *,
                 sampling: Sampling | None = None, session: str | None = None
                 ) -> Iterator[GeneratedToken]:
        """Tokens after ``prompt`` (token ids), one by one as they arrive: greedy, or drawn
        as ``sampling`` says. The session (default: this client's) continues where the prompt
        extends what its caches hold, else starts afresh (module docstring).
        ContextLimitError, before anything runs, when the prompt and the tokens fed back
        exceed the plan's max context."""
        session = session or self.session
        ids = self.check_prompt(prompt, new_tokens)
        if self._hop is not None:
            self._ensure_plan()
        held = self._conversations.pop(session, [])  # set again after each step that succeeds
        seq = ids[0].tolist()
        position = _reusable(held, seq)
        reused = position
        start = time.perf_counter()
        for index in range(new_tokens):
            t0 = time.perf_counter()
            x = torch.tensor([seq[position:]], dtype=torch.int64)
            try:
                token, compute, codec, slept = self._step(x, position, session, sampling)
            except SessionError as exc:
                if index > 0 or position == 0 or isinstance(exc, _NOT_GONE):
                    raise
                # the caches are gone somewhere on the chain: the prompt again, from 0
                x, position, reused = ids, 0, 0
                token, compute, codec, slept = self._step(x, position, session, sampling)
            now = time.perf_counter()
            position = len(seq)
            # every cache holds ``seq`` now; the new token is not fed back yet
            self._conversations[session] = list(seq)
            seq.append(token)
            yield GeneratedToken(index, token, "prefill" if index == 0 else "decode",
                                 (now - start) * 1e3, (now - t0) * 1e3, compute, codec, slept,
                                 reused)

    def check_prompt(self, prompt: Sequence[int] | torch.Tensor, new_tokens: int
                     ) -> torch.Tensor:
        """The prompt as ``[1, T]`` ids; ConfigError / ContextLimitError unless it and
        ``new_tokens`` fit the model and the plan's max context."""
        ids = torch.as_tensor(prompt, dtype=torch.int64).reshape(1, -1)
        if ids.shape[1] < 1 or new_tokens < 1:
            raise ConfigError("generation needs a prompt of at least one token and at least "
                              f"one new token, got {ids.shape[1]} and {new_tokens}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.llm.vocab_size:
            raise ConfigError(f"prompt token ids must lie in [0, {self.llm.vocab_size}) (the "
                              "model's vocabulary)")
        held = ids.shape[1] + new_tokens - 1  # the last token is never fed back
        if held > self.llm.max_context:
            raise ContextLimitError(
                f"a prompt of {ids.shape[1]} tokens and {new_tokens} new tokens needs a KV "
                f"cache of {held} tokens, more than the plan's max context of "
                f"{self.llm.max_context}: ask for fewer tokens or plan with a larger "
                f"{option('max_context', flag='--max-context')}")
        return ids

    def end_session(self, session: str | None = None) -> None:
        """Free the session's KV caches on every stage (a later generation starts anew)."""
        session = session or self.session
        self._conversations.pop(session, None)
        self.sessions.end(session)
        if self._hop is not None:
            end = message(self.plan_id, PLAN_VERSION, self.next_request_id(),
                          {END_SESSION: torch.zeros(1, dtype=torch.int64)})
            md = self._metadata(session)
            self._call(lambda timeout, _: self._hop.run(end, timeout, md))

    # ---- one step ----------------------------------------------------------------------------
    def _step(self, x: torch.Tensor, position: int, session: str, sampling: Sampling | None
              ) -> tuple[int, dict[str, float], dict[str, float], dict[str, float]]:
        compute: dict[str, float] = {}
        codec: dict[str, float] = {}
        slept: dict[str, float] = {}
        with self.sessions.step(session, position, int(x.shape[1])) as state:
            t0 = time.perf_counter()
            out = self.stage.step(x, position, state.cache, sampling)
            if self.pacer is not None:  # the time slept is part of the compute
                slept[self.device] = self.pacer.pace(t0, phase_of(position))
            compute[self.device] = (time.perf_counter() - t0) * 1e3
            if self._hop is None:
                return int(out.reshape(-1)[0]), compute, codec, slept
            t1 = time.perf_counter()
            request_id = self.next_request_id()
            step = self._codec.step(self.plan_id, PLAN_VERSION, request_id,
                                    self.stage.io.sends, out, position, sampling)
            codec[self.device] = (time.perf_counter() - t1) * 1e3
            if self.shaper.enabled:
                self.shaper.send(self._hop.wire_size(step), "up")
            md = self._metadata(session)
            try:
                reply = self._call(lambda timeout, _: self._hop.run(step, timeout, md))
            except BaseException:
                self._conversations.pop(session, None)  # what the stages hold is unknown now
                raise
            token = self._token(reply, request_id)
        for key, ms in reply.timings_ms.items():
            device, _, kind = key.rpartition(".")
            if kind == "compute_ms":
                compute[device] = compute.get(device, 0.0) + ms
            elif kind == "serialize_ms":
                codec[device] = codec.get(device, 0.0) + ms
            elif kind == "emulated_ms":
                slept[device] = slept.get(device, 0.0) + ms
        return token, compute, codec, slept

    def _token(self, reply: Message, request_id: int) -> int:
        names = [t.name for t in reply.tensors]
        if reply.request_id != request_id or names != [TOKEN]:
            raise RemoteError(f"server {self.address} answered request {reply.request_id} "
                              f"with {names}; expected {TOKEN!r} for request {request_id}")
        try:
            return self._codec.read_token(reply.tensors[0].data)
        except Exception as exc:
            raise RemoteError(f"server {self.address} answered with a bad token: {exc}"
                              ) from None

    def _described(self) -> Iterator[tuple[str, pb.Description]]:
        assert self._hop is not None
        yield self.address, self._call(self._hop.describe)

    def _plan_mismatch(self, where: str, described: pb.Description) -> str:
        return (f"server {where} runs plan {described.plan_id} (version "
                f"{described.plan_version}), this client {self.plan_id} "
                f"(version {PLAN_VERSION}); start both sides from the same "
                "plan file")

    def _failed(self, exc: grpc.RpcError) -> Exception:
        """A stage's session status becomes its error; any other failure a RemoteError."""
        code, details = exc.code(), " ".join((exc.details() or "").split())
        session = session_error(code, details)
        if session is not None:
            return session
        return RemoteError(explain(
            code, details, self.address,
            unavailable_hint="; is `edgesplit llm serve` running there? "
            f"({option('retries')} retries with backoff)",
            timeout_hint=f"raise {option('timeout_s')}"))



def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _reusable(held: list[int], ids: list[int]) -> int:
    """How many leading tokens of ``ids`` the caches already hold, leaving at least one token
    to run: the step must produce the next token."""
    return min(common_prefix(held, ids), len(ids) - 1)
