"""Text generation over a split causal LM: the engine that ``llm generate --prompt``,
``llm chat`` and the OpenAI-compatible API (:mod:`edgesplit.llm.api.app`) drive.

:class:`LLMEngine` wraps an :class:`~edgesplit.llm.generate.client.LLMClient` (the first
stage, here, and the chain behind it) with the checkpoint's tokenizer: text in through the
chat template or plainly, text out as it decodes (:class:`~edgesplit.llm.generate.text.
IncrementalDetokenizer`: never half a character), ending at an end-of-sequence token (not
shown), at a stop string (not shown; text that may begin one is held back until it cannot),
or after ``max_new_tokens``.

It runs at most the plan's ``sessions`` generations at once, one per *slot*: a session id
kept across generations, so each slot holds one KV cache on every stage (what their memory
was planned for). One more generation waits up to ``queue_s`` for a free slot, then fails
with SessionError (the API answers 503). A generation takes the free slot whose conversation
(the tokens its caches hold) shares the longest prefix with its prompt: the next turn of a
conversation, re-sent whole as OpenAI's API does, runs only its new tokens (the client rewinds
what differs). A generation that is abandoned (its iterator closed: a client that left) stops
at once and its slot's caches are freed on every stage; a finished one keeps them for the next
turn.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from edgesplit.errors import ConfigError, EdgesplitError, SessionError, option
from edgesplit.llm.generate.client import LLMClient, common_prefix
from edgesplit.llm.generate.text import IncrementalDetokenizer, StopMatcher
from edgesplit.llm.stage.compute import llm_section, open_plan_checkpoint
from edgesplit.llm.stage.sampling import Sampling
from edgesplit.plan.model import Plan
from edgesplit.runtime.options import CallOptions

__all__ = ["Delta", "LLMEngine", "TextEngine", "open_engine", "plan_tokenizer"]

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length"]
_CANCEL_POLL_S = 0.05  # how often a generation queued for a slot looks at its cancel
_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Delta:
    """One piece of a generation's text as it decodes: ``text`` (possibly empty: a token
    that completes no character, or text held back as a possible stop string), the token ids
    it covers, and on the last delta only, why the generation ended."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    step: Any = None  # the GeneratedToken (timings) of the delta's token, where there is one


class TextEngine(Protocol):
    """What serves text: thread-safe, many generations at once (up to its slots)."""

    model_id: str  # the name /v1/models lists and requests must name
    max_context: int  # prompt + generated tokens a session holds at most

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The conversation through the tokenizer's chat template, ready for the assistant's
        turn (``add_generation_prompt``). ConfigError on a malformed message."""
        ...

    def text_ids(self, prompt: str) -> list[int]:
        """A plain prompt's token ids (no chat template)."""
        ...

    max_prompt_chars: int  # a prompt longer than this cannot fit max_context (exact bound)

    def stream(self, prompt_ids: Sequence[int], *, max_new_tokens: int, sampling: Sampling,
               stop: Sequence[str] = (), cancel: threading.Event | None = None
               ) -> Iterator[Delta]:
        """Deltas as tokens decode, ending at EOS or a stop string ("stop") or after
        ``max_new_tokens`` ("length"). ContextLimitError before any work when the prompt and
        ``max_new_tokens`` exceed ``max_context``. Closing the iterator early (a client that
        left) ends the generation and frees its KV caches on every stage. A generation whose
        ``cancel`` is set while it waits for a slot ends without a delta: its prefill
        never runs."""
        ...


def plan_tokenizer(plan: Plan) -> Any:
    """The tokenizer of the checkpoint ``plan`` runs (ConfigError for a random-weights plan,
    which has none)."""
    from edgesplit.llm.model.checkpoint import load_tokenizer

    checkpoint = open_plan_checkpoint(plan)
    if checkpoint is None:
        raise ConfigError(f"the plan's model {plan.model.source!r} has random weights and no "
                          "tokenizer: text needs a real checkpoint (plan one: `edgesplit llm "
                          "plan smollm2-135m-instruct ...`), or pass token ids "
                          f"({option('prompt_ids', flag='--prompt-ids')})")
    return load_tokenizer(checkpoint)


def _eos_ids(tokenizer: Any, plan: Plan) -> frozenset[int]:
    """Every id that ends a generation: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    checkpoint = open_plan_checkpoint(plan)
    config = checkpoint.folder / "generation_config.json" if checkpoint else None
    if config is not None and config.is_file():
        import json

        eos = json.loads(config.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return frozenset(int(i) for i in ids)


class LLMEngine:
    """Text generation with ``client``'s chain and ``tokenizer``; at most ``slots``
    generations at once (default: the plan's ``sessions``), a further one waiting up to
    ``queue_s``. ``slot_ids``: the session id each slot keeps (default: random ones, ``slots``
    of them)."""

    def __init__(self, client: LLMClient, tokenizer: Any, *, model_id: str | None = None,
                 slots: int | None = None, queue_s: float = 30.0,
                 eos_ids: Sequence[int] | None = None,
                 slot_ids: Sequence[str] | None = None) -> None:
        self.client, self.tokenizer = client, tokenizer
        self.model_id = model_id or client.plan.model.name
        self.max_context = client.llm.max_context
        self.eos_ids = frozenset(eos_ids) if eos_ids is not None else \
            _eos_ids(tokenizer, client.plan)
        ids = list(slot_ids) if slot_ids else \
            [uuid.uuid4().hex for _ in range(slots or client.llm.sessions)]
        self.queue_s, self.slots = queue_s, len(ids)
        self._free = threading.Semaphore(len(ids))
        self._lock = threading.Lock()
        # free slots, least recently used first; each one's id names caches on every stage
        self._idle: OrderedDict[str, None] = OrderedDict.fromkeys(ids)
        self.max_prompt_chars = self.max_context * _longest_token(tokenizer)

    # ---- text -> ids ----------------------------------------------------------------------
    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if not messages:
            raise ConfigError("a chat needs at least one message")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in _ROLES or \
                    not isinstance(m.get("content"), str):
                raise ConfigError(f"message {i} must be {{'role': one of {', '.join(_ROLES)}, "
                                  "'content': text}")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"the tokenizer of {self.model_id!r} has no chat template: "
                              "send a plain prompt instead")
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        return [int(i) for i in ids]

    def text_ids(self, prompt: str) -> list[int]:
        if not prompt:
            raise ConfigError("the prompt is empty")
        return [int(i) for i in self.tokenizer(prompt)["input_ids"]]

    # ---- generation -----------------------------------------------------------------------
    def stream(self, prompt_ids: Sequence[int], *, max_new_tokens: int, sampling: Sampling,
               stop: Sequence[str] = (), cancel: threading.Event | None = None
               ) -> Iterator[Delta]:
        ids = list(prompt_ids)
        self.client.check_prompt(ids, max_new_tokens)  # before waiting for a slot
        stopper = StopMatcher(stop)
        return self._stream(ids, max_new_tokens, sampling, stopper, cancel)

    def _stream(self, ids: list[int], max_new_tokens: int, sampling: Sampling,
                stopper: StopMatcher, cancel: threading.Event | None) -> Iterator[Delta]:
        slot = self._take(ids, cancel)
        if slot is None:
            return  # cancelled while queued: no prefill for a client that has gone
        detokenizer = IncrementalDetokenizer(self.tokenizer)
        tokens = cast(Generator[Any, None, None], self.client.generate(
            ids, max_new_tokens, sampling=sampling, session=slot))
        finished = failed = False
        try:
            for t in tokens:
                if t.token in self.eos_ids:
                    finished = True  # the last delta is out: nothing was abandoned
                    yield Delta(_last(stopper, detokenizer.flush()), (t.token,), "stop", t)
                    return
                text, stopped = stopper.push(detokenizer.push(t.token))
                if stopped:
                    finished = True
                    yield Delta(text, (t.token,), "stop", t)
                    return
                if t.index + 1 == max_new_tokens:
                    finished = True
                    yield Delta(text + _last(stopper, detokenizer.flush()), (t.token,),
                                "length", t)
                    return
                yield Delta(text, (t.token,), None, t)
            finished = True
        except EdgesplitError:
            failed = True
            raise
        finally:
            tokens.close()  # no more steps: an abandoned generation costs nothing more
            self._give_back(slot, abandoned=not finished, failed=failed)

    def _take(self, ids: list[int], cancel: threading.Event | None = None) -> str | None:
        """A free slot, the one whose conversation shares most of ``ids``; None once
        ``cancel`` is set (checked while waiting, and once more on getting one)."""
        got = self._wait_free(cancel)
        if got is None:
            return None
        if not got:
            raise SessionError(f"all {self.slots} session(s) of this server are busy "
                               f"generating (waited {self.queue_s:g} s): retry later, or plan "
                               "with more --sessions")
        if cancel is not None and cancel.is_set():
            self._free.release()
            return None
        with self._lock:
            best = max(self._idle, key=lambda s: common_prefix(self.client.held(s), ids))
            del self._idle[best]
        return best

    def _wait_free(self, cancel: threading.Event | None) -> bool | None:
        """Whether a slot came free (and was taken) within ``queue_s``; None once
        ``cancel`` is set first. A waiter looks at ``cancel`` every ``_CANCEL_POLL_S``."""
        if cancel is None:
            return self._free.acquire(timeout=self.queue_s)
        deadline = time.monotonic() + self.queue_s
        while not cancel.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._free.acquire(timeout=min(left, _CANCEL_POLL_S)):
                return True
        return None

    def _give_back(self, slot: str, *, abandoned: bool, failed: bool = False) -> None:
        """``slot`` is free again; an abandoned one (its client left, or a step failed)
        first has its caches freed on every stage (the next generation there starts anew)."""
        try:
            if abandoned:
                self.client.end_session(slot)
        except EdgesplitError as exc:  # a stage that is down frees its caches on restart
            # after a failed step the caller is told why; the end failing too (a stage down:
            # the same cause) would be a second line of the same news
            (log.debug if failed else log.warning)(
                "could not end session %s on every stage: %s", slot[:8], exc)
        finally:
            with self._lock:
                self._idle[slot] = None
            self._free.release()

    def close(self) -> None:
        """End every free slot's session on every stage, and the client's connections."""
        with self._lock:
            slots = list(self._idle)
        for slot in slots:
            if self.client.held(slot):
                self.client.end_session(slot)
        self.client.close()


def _longest_token(tokenizer: Any) -> int:
    """The most characters one token stands for, bounded from above by the longest entry of
    the vocabulary (a byte-level BPE writes each byte as one character, so its entries are at
    least as long as the text they decode to): ``max_context`` of them is the longest prompt
    that can fit."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return max((len(t) for t in vocab), default=64)


def _last(stopper: StopMatcher, text: str) -> str:
    """The end of a generation's text: what the detokenizer still held, then whatever the
    stop matcher held back (no stop string can begin in it any more)."""
    out, stopped = stopper.push(text)
    return out if stopped else out + stopper.flush()


def open_engine(plan: Plan, server: str | None, *, token: str | None = None,
                tls: Any = None, timeout_s: float = 60.0, retries: int = 0,
                data_plane: Any = "auto", model_id: str | None = None,
                emulate: bool = False, shape: bool = False,
                torch_device: str | None = None, threads: int | None = None) -> LLMEngine:
    """An engine for ``plan``: its first stage here (on ``torch_device``; a quantized one on
    ``threads`` ONNX Runtime threads), the chain at ``server``, the plan's checkpoint's
    tokenizer."""
    llm_section(plan)
    tokenizer = plan_tokenizer(plan)
    calls = CallOptions(token=token, tls=tls, timeout_s=timeout_s, retries=retries)
    client = LLMClient(plan, server, calls=calls, data_plane=data_plane, emulate=emulate,
                       shape=shape, torch_device=torch_device, threads=threads)
    return LLMEngine(client, tokenizer, model_id=model_id)
