"""An OpenAI-compatible HTTP API over a split causal LM (a
:class:`~edgesplit.llm.generate.engine.TextEngine`): what the ``openai`` client, LangChain,
curl and chat front-ends already speak.

Endpoints: ``GET /v1/models`` (and ``/v1/models/{id}``) lists the one model the engine serves;
``POST /v1/chat/completions`` and ``POST /v1/completions`` generate, whole or streamed as
server-sent events in OpenAI's chunk format (``data: {...}`` chunks, then ``data: [DONE]``);
``GET /health`` answers without a key, for load balancers.

Decisions, where a choice was made or the server departs from OpenAI:

- One model: a request naming another gets 404 ``model_not_found``; ``model`` may be left out
  (vLLM does the same), meaning the one served.
- One choice per request. Refused with 400 ``unsupported_parameter``, naming the parameter:
  ``n`` and ``best_of`` other than 1; ``tools``, ``tool_choice`` other than ``"none"``,
  ``functions``, ``function_call`` and messages that carry tool calls or come from a tool (no
  tool calling); ``logprobs`` and ``top_logprobs`` (the engine returns text, not
  probabilities); ``echo``; ``suffix``; ``logit_bias``; ``response_format`` other than
  ``{"type": "text"}`` (no JSON mode); non-zero ``presence_penalty`` or ``frequency_penalty``
  (the sampler has no penalties). Refusing beats ignoring: a client asking for these would
  otherwise get plausible text that silently lacks them.
- Other fields OpenAI defines that do not change the text (``user``, ``metadata``,
  ``store``, ``service_tier``, ``parallel_tool_calls``...) and unknown fields are accepted and
  ignored, as vLLM does, so clients that always send them keep working.
- Messages: roles system, user and assistant; ``developer`` (OpenAI's newer name for system)
  is sent to the chat template as ``system``, which templates know. Content is a string or a
  list of ``{"type": "text"}`` parts, joined with newlines as vLLM does; other parts (images,
  audio) are refused.
- ``prompt`` (completions) is a string or a list of exactly one string; token-id prompts and
  several prompts per request are refused.
- Sampling: ``temperature`` defaults to OpenAI's 1.0 (0: greedy); ``top_p`` 1.0 (off);
  ``top_k`` (an extension, as vLLM) 0 or -1 for off; the range checks are
  :class:`~edgesplit.llm.stage.sampling.Sampling`'s (no upper bound of 2 on temperature).
  ``seed`` defaults to a fresh random one per request, so equal requests differ as they do at
  OpenAI; a given seed makes a request repeatable.
- ``max_completion_tokens`` wins over ``max_tokens`` (its deprecated name); both default to
  what the prompt leaves of the engine's ``max_context``. A prompt that leaves no room, or a
  limit beyond the room, is 400 ``context_length_exceeded`` with OpenAI's wording ("maximum
  context length"), which client libraries match on.
- ``stop``: a string or up to 4 non-empty strings (OpenAI's limit); the engine holds back text
  that may start one and leaves the stop string out of the output.
- Streaming: the first chat chunk carries ``delta.role`` (and empty content), then one chunk
  per piece of text (pieces that complete no character are not sent), then a chunk with an
  empty delta and ``finish_reason``; with ``stream_options.include_usage`` every chunk has
  ``usage: null`` and a last chunk with no choices carries the usage. ``stream_options``
  without ``stream`` is ignored. The generation starts, and its first piece decodes, before
  the response does: errors found then (context, busy stages, a stage down) get their HTTP
  status; a failure after that arrives as an ``{"error": {...}}`` event followed by
  ``[DONE]``, which the ``openai`` client raises as ``APIError``.
- Errors are OpenAI's JSON, ``{"error": {"message", "type", "param", "code"}}``: malformed
  bodies (invalid JSON, missing fields, wrong types) are 400, never FastAPI's 422; a wrong or
  missing key 401 ``invalid_api_key``; unknown routes 404; engine errors by kind:
  ContextLimitError 400, other ConfigError 400, SessionError (every engine slot busy, or this
  generation's caches evicted) 503 with ``Retry-After``, RemoteError and WireError (a stage
  failed or cannot be reached) 502; anything else 500 with a generic message, the traceback
  going to this module's log only.
- ``api_key``: every ``/v1`` route needs ``Authorization: Bearer KEY``, compared in constant
  time; ``/health`` does not.
- The engine blocks: tokenizing and every step of a generation run in worker threads, so
  requests proceed concurrently (up to the engine's slots; the engine queues the rest).
  Requests waiting for a slot and steps of running generations use separate thread
  limits, so waiters never starve the generations that would free a slot. A client
  that leaves, streaming or not, has its generation's iterator closed after the step in
  progress, which frees its caches on every stage.
"""

from __future__ import annotations

import json
import logging
import secrets
import signal
import socket
import threading
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgesplit.errors import (
    ConfigError,
    ContextLimitError,
    EdgesplitError,
    RemoteError,
    SessionError,
    WireError,
    option,
)
from edgesplit.llm.api.http_guard import Gate, HttpLimits, check_open_files, guarded_protocol
from edgesplit.llm.generate.engine import Delta, TextEngine
from edgesplit.llm.stage.sampling import Sampling
from edgesplit.transport.auth import AuthThrottle

__all__ = ["create_app", "serve_api"]

logger = logging.getLogger(__name__)

_SEED_LIMIT = 2**63  # Sampling's seeds: int64 on the wire
_MAX_STOPS = 4  # OpenAI's limit
_RETRY_AFTER_S = "1"

# ---------------------------------------------------------------------------------------------
# Request bodies


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = False


class _Body(BaseModel):
    """What both generation endpoints take. Extra fields are kept (``model_extra``) so that
    :data:`_UNSUPPORTED` can refuse the ones asking for what this server does not do."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    user: str | None = None


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[_Part] | None = None


class _ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)


class _CompletionBody(_Body):
    prompt: str | list[str]


def _off_unless(*defaults: object) -> Callable[[Any], bool]:
    """A test that a value asks for something: anything but None and ``defaults``, compared
    with their type (``logprobs: 0`` asks for log probabilities, ``false`` does not)."""
    return lambda v: v is not None and not any(v is d or (v == d and type(v) is type(d))
                                               for d in defaults)


# parameter -> (does this value ask for it?, what the server does instead)
_UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (_off_unless(1), "one choice per request; leave it out or send 1"),
    "best_of": (_off_unless(1), "one candidate per request; leave it out or send 1"),
    "tools": (bool, "no tool calling"),
    "tool_choice": (_off_unless("none"), "no tool calling"),
    "functions": (bool, "no function calling"),
    "function_call": (_off_unless("none"), "no function calling"),
    "logprobs": (_off_unless(False), "no log probabilities"),
    "top_logprobs": (_off_unless(0), "no log probabilities"),
    "echo": (bool, "the prompt is not echoed"),
    "suffix": (bool, "no insertion (suffix)"),
    "logit_bias": (bool, "no logit bias"),
    "response_format": (_off_unless({"type": "text"}), "text only (no JSON mode or schema)"),
    "presence_penalty": (_off_unless(0, 0.0), "no penalties; leave it out or send 0"),
    "frequency_penalty": (_off_unless(0, 0.0), "no penalties; leave it out or send 0"),
}

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# ---------------------------------------------------------------------------------------------
# Errors


class _ApiError(Exception):
    """An HTTP error in OpenAI's JSON shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code}}
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status, headers=self.headers)


def _unsupported(param: str, why: str) -> _ApiError:
    return _ApiError(400, f"{param} is not supported by this server: {why}", param=param,
                     code="unsupported_parameter")


def _api_error(exc: BaseException) -> _ApiError:
    """What a client is told about ``exc``: user mistakes say what to do, engine failures
    which kind of failure (and for 5xx whether to retry), bugs nothing but that they were
    logged."""
    if isinstance(exc, _ApiError):
        return exc
    if isinstance(exc, ContextLimitError):
        return _ApiError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, SessionError):
        # the engine's message says why (all slots busy, caches evicted); the status and
        # Retry-After say what a client does about it
        return _ApiError(503, str(exc), type="server_error", code="server_busy",
                         headers={"Retry-After": _RETRY_AFTER_S})
    if isinstance(exc, RemoteError | WireError):
        logger.warning("a stage failed: %s", exc)
        return _ApiError(502, f"a stage of the model failed: {exc}", type="server_error",
                         code="stage_failed")
    if isinstance(exc, ConfigError):
        return _ApiError(400, str(exc))
    logger.error("generation failed", exc_info=exc)
    return _ApiError(500, "internal server error (logged on the server)", type="server_error")


def _body_error(exc: RequestValidationError) -> _ApiError:
    """FastAPI's validation errors (422) as OpenAI's 400: the first problem, its field."""
    errors = exc.errors()
    if not errors:
        return _ApiError(400, "malformed request body: send a JSON object")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    if first.get("type") == "json_invalid":
        why = first.get("ctx", {}).get("error", first.get("msg"))
        return _ApiError(400, f"the request body is not valid JSON ({why}): send a JSON "
                              "object")
    param = ".".join(loc) or None
    where = param or "the request body"
    return _ApiError(400, f"{where}: {first.get('msg')}{more}", param=param)


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        return _api_error(exc).response()

    async def invalid_body(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _body_error(exc).response()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _ApiError(exc.status_code, str(exc.detail), headers=exc.headers).response()

    app.add_exception_handler(_ApiError, api_error)
    app.add_exception_handler(EdgesplitError, api_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, api_error)  # bugs: 500 without the traceback


@contextmanager
def _engine_errors() -> Iterator[None]:
    """Unexpected exceptions from the engine become a logged 500 here, where they happen,
    rather than in Starlette's last-resort handler, which re-raises into the server's log."""
    try:
        yield
    except (_ApiError, EdgesplitError):
        raise
    except Exception as exc:
        raise _api_error(exc) from exc


# ---------------------------------------------------------------------------------------------
# From a request to the engine's arguments


@dataclass(frozen=True)
class _Job:
    """One request's generation, engine-ready but for the prompt's tokens."""

    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def _check(engine: TextEngine, body: _Body) -> None:
    """404 for another model, 400 for a parameter asking for what this server does not do."""
    if body.model is not None and body.model != engine.model_id:
        raise _model_not_found(body.model, engine)
    extra = body.model_extra or {}
    for param, (asks, why) in _UNSUPPORTED.items():
        if asks(extra.get(param)):
            raise _unsupported(param, why)


def _model_not_found(model: str, engine: TextEngine) -> _ApiError:
    return _ApiError(404, f"the model {model!r} does not exist here: this server serves "
                          f"{engine.model_id!r} (GET /v1/models)", param="model",
                     code="model_not_found")


def _job(body: _Body) -> _Job:
    top_k = 0 if body.top_k in (None, -1) else body.top_k  # -1: vLLM's "off"
    sampling = Sampling(temperature=1.0 if body.temperature is None else body.temperature,
                        top_k=top_k, top_p=1.0 if body.top_p is None else body.top_p,
                        seed=secrets.randbelow(_SEED_LIMIT) if body.seed is None else body.seed)
    limit = body.max_completion_tokens
    options = body.stream_options
    return _Job(max_tokens=body.max_tokens if limit is None else limit, sampling=sampling,
                stop=_stops(body.stop), stream=bool(body.stream),
                include_usage=bool(body.stream and options and options.include_usage))


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > _MAX_STOPS:
        raise _ApiError(400, f"stop takes at most {_MAX_STOPS} strings, not {len(stops)}",
                        param="stop")
    if not all(stops):
        raise _ApiError(400, "stop strings must not be empty", param="stop")
    return stops


def _chat_messages(messages: Sequence[_Message]) -> list[dict[str, str]]:
    """The messages as the engine's chat template takes them: a role it knows, text."""
    out = []
    for i, m in enumerate(messages):
        role = _ROLES.get(m.role)
        if role is None:
            raise _unsupported(f"messages[{i}].role", f"role {m.role!r}: use system, "
                                                      "developer, user or assistant (no tool "
                                                      "calling)")
        if (m.model_extra or {}).get("tool_calls"):
            raise _unsupported(f"messages[{i}].tool_calls", "no tool calling")
        out.append({"role": role, "content": _message_text(m.content, i)})
    return out


def _message_text(content: str | list[_Part] | None, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise _unsupported(f"messages[{i}].content[{j}]",
                               f"content of type {part.type!r}: text only")
    return "\n".join(part.text or "" for part in content)


def _prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1:
        raise _ApiError(400, f"one prompt per request, not {len(prompt)}: send a string",
                        param="prompt")
    return prompt[0]


def _check_chars(texts: Sequence[str], limit: int, param: str) -> None:
    """400 ``context_length_exceeded`` for a prompt longer than ``limit`` characters, in all
    or in one of its ``texts`` (messages), before any of it is tokenized: tokenizing is
    linear in the text, and ten megabytes of it took half a minute and gigabytes."""
    total = 0
    for i, text in enumerate(texts):
        total += len(text)
        if total > limit:
            where = f"{param}[{i}]" if len(texts) > 1 else param
            raise _ApiError(400, f"the prompt is longer than {limit} characters, more than "
                                 "this model's maximum context length can hold: send a "
                                 "shorter one", param=where, code="context_length_exceeded")


def _max_new_tokens(max_context: int, prompt: int, asked: int | None) -> int:
    """``asked``, or all the room the prompt leaves; ContextLimitError in OpenAI's words when
    that is nothing or less than asked."""
    room = max_context - prompt
    if room >= 1 and (asked is None or asked <= room):
        return room if asked is None else asked
    wanted = asked or 1
    raise ContextLimitError(
        f"This model's maximum context length is {max_context} tokens. However, you requested "
        f"{prompt + wanted} tokens ({prompt} in the prompt, {wanted} for the completion). "
        "Please reduce the length of the prompt or max_tokens.")


# ---------------------------------------------------------------------------------------------
# Driving the engine from the event loop


class _Generation:
    """One engine stream stepped from worker threads. A generator cannot be closed while
    another thread runs it, so ``next`` and ``close`` take turns under a lock; ``close`` may be
    called any number of times, from any thread."""

    def __init__(self, deltas: Iterator[Delta], prompt_tokens: int) -> None:
        self._deltas = deltas
        self._lock = threading.Lock()
        self._closed = False
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0

    def next(self) -> Delta | None:
        with self._lock:
            if self._closed:
                return None
            delta = next(self._deltas, None)
            if delta is not None:
                self.completion_tokens += len(delta.token_ids)
            return delta

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            close = getattr(self._deltas, "close", None)
            if close is not None:
                close()

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def _open(engine: TextEngine, tokenize: Callable[[], list[int]], job: _Job,
          cancel: threading.Event) -> tuple[_Generation, Delta | None] | None:
    """Tokenize, start the generation and decode its first piece (in a worker thread): the
    errors that come before any text (context, busy stages) are raised here, while the
    response can still carry their status. None when ``cancel`` (the client left) was set
    before the first piece: a request that waited for a slot then never runs its
    prefill."""
    prompt_ids = tokenize()
    if not prompt_ids:
        raise ConfigError("the prompt is empty: send some text")
    max_new = _max_new_tokens(engine.max_context, len(prompt_ids), job.max_tokens)
    gen = _Generation(engine.stream(prompt_ids, max_new_tokens=max_new, sampling=job.sampling,
                                    stop=job.stop, cancel=cancel), len(prompt_ids))
    first = gen.next()
    if cancel.is_set():
        gen.close()
        return None
    return gen, first


@dataclass(frozen=True)
class _Lanes:
    """Worker-thread limits. Opening a generation may wait for a free slot (the engine
    queues it); the steps of running generations, and their closing, must never wait behind
    those, or the generations that would free a slot could not advance: two lanes."""

    opening: anyio.CapacityLimiter
    steps: anyio.CapacityLimiter

    @classmethod
    def new(cls, threads: int = 256) -> _Lanes:
        return cls(anyio.CapacityLimiter(threads), anyio.CapacityLimiter(threads))


async def _deltas(gen: _Generation, first: Delta | None,
                  lane: anyio.CapacityLimiter) -> AsyncGenerator[Delta, None]:
    """The generation's pieces, each decoded in a worker thread. However this ends (done,
    failed, cancelled by a client that left, closed early) the engine's iterator is closed,
    after the step in progress: that frees its caches on every stage."""
    try:
        delta = first
        while delta is not None:
            yield delta
            delta = await anyio.to_thread.run_sync(gen.next, limiter=lane)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(gen.close, limiter=lane)


async def _opened(engine: TextEngine, tokenize: Callable[[], list[int]], job: _Job,
                  request: Request, lane: anyio.CapacityLimiter
                  ) -> tuple[_Generation, Delta | None] | None:
    """:func:`_open` in a worker thread while the client is watched: None when it left
    first (queued behind busy slots, it is dropped before its prefill)."""
    cancel = threading.Event()
    failed: BaseException | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_on_disconnect, request, cancel.set)
        try:
            opened = await anyio.to_thread.run_sync(_open, engine, tokenize, job, cancel,
                                                    limiter=lane)
        except Exception as exc:  # raised below, outside the group (which would wrap it)
            failed, opened = exc, None
        tg.cancel_scope.cancel()
    if failed is not None:
        with _engine_errors():
            raise failed
    return opened


async def _collect(gen: _Generation, first: Delta | None, request: Request,
                   lane: anyio.CapacityLimiter) -> tuple[str, str] | None:
    """The whole text and finish reason, or None when the client left first (a non-streamed
    generation may run long: it is stopped rather than finished for no one)."""
    result = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_on_disconnect, request, tg.cancel_scope.cancel)
        parts, finish = [], None
        async with aclosing(_deltas(gen, first, lane)) as deltas:
            async for delta in deltas:
                parts.append(delta.text)
                finish = delta.finish_reason or finish
        result = "".join(parts), finish or "stop"
        tg.cancel_scope.cancel()
    return result


async def _on_disconnect(request: Request, then: Callable[[], object]) -> None:
    # the body has been read: what the server has left to receive is the disconnect
    while (await request.receive())["type"] != "http.disconnect":
        pass
    then()


# ---------------------------------------------------------------------------------------------
# Response objects


@dataclass(frozen=True)
class _Shape:
    """How one response's objects look: chat.completion(.chunk) or text_completion."""

    chat: bool
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = 0

    @classmethod
    def new(cls, chat: bool, model: str, include_usage: bool) -> _Shape:
        prefix = "chatcmpl-" if chat else "cmpl-"
        return cls(chat, model, include_usage, prefix + uuid.uuid4().hex, int(time.time()))

    def _object(self, stream: bool, choices: list[dict[str, Any]],
                **extra: Any) -> dict[str, Any]:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion.chunk" if stream else "chat.completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def whole(self, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
        said = {"message": {"role": "assistant", "content": text}} if self.chat else \
            {"text": text}
        choice = {"index": 0, **said, "logprobs": None, "finish_reason": finish}
        return self._object(False, [choice], usage=usage)

    def piece(self, text: str | None, finish: str | None = None, *,
              role: bool = False) -> dict[str, Any]:
        delta: dict[str, str] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, **({"delta": delta} if self.chat else {"text": text or ""}),
                  "logprobs": None, "finish_reason": finish}
        usage = {"usage": None} if self.include_usage else {}
        return self._object(True, [choice], **usage)

    def usage_piece(self, usage: dict[str, int]) -> dict[str, Any]:
        return self._object(True, [], usage=usage)


def _event(data: dict[str, Any] | str) -> ServerSentEvent:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return ServerSentEvent(data=text)


async def _events(gen: _Generation, first: Delta | None, shape: _Shape,
                  lane: anyio.CapacityLimiter) -> AsyncIterator[ServerSentEvent]:
    """The streamed response: OpenAI's chunks, then ``[DONE]``; a failure after the first
    chunk is an error event (the status line has gone)."""
    try:
        if shape.chat:
            yield _event(shape.piece("", role=True))
        finish = None
        async with aclosing(_deltas(gen, first, lane)) as deltas:
            async for delta in deltas:
                if delta.text:
                    yield _event(shape.piece(delta.text))
                finish = delta.finish_reason or finish
        yield _event(shape.piece(None, finish or "stop"))
        if shape.include_usage:
            yield _event(shape.usage_piece(gen.usage()))
    except Exception as exc:
        yield _event(_api_error(exc).body)
    yield _event("[DONE]")


# ---------------------------------------------------------------------------------------------
# The app


_LEFT = 499  # no one reads it: nginx's "client closed request"


async def _generate(engine: TextEngine, lanes: _Lanes, request: Request, body: _Body,
                    tokenize: Callable[[], list[int]], *, chat: bool) -> Response:
    job = _job(body)
    shape = _Shape.new(chat, engine.model_id, job.include_usage)
    opened = await _opened(engine, tokenize, job, request, lanes.opening)
    if opened is None:
        logger.info("client left before its generation started; dropped before its prefill")
        return Response(status_code=_LEFT)
    gen, first = opened
    if job.stream:
        # the background close is a second guard: _deltas closes it on every way out too
        return EventSourceResponse(_events(gen, first, shape, lanes.steps), sep="\n",
                                   background=BackgroundTask(gen.close))
    with _engine_errors():
        got = await _collect(gen, first, request, lanes.steps)
    if got is None:
        logger.info("client left before its completion was done; generation stopped")
        return Response(status_code=_LEFT)
    text, finish = got
    return JSONResponse(shape.whole(text, finish, gen.usage()))


def _model_card(engine: TextEngine, created: int) -> dict[str, Any]:
    return {"id": engine.model_id, "object": "model", "created": created,
            "owned_by": "edgesplit"}


def create_app(engine: TextEngine, *, api_key: str | None = None,
               limits: HttpLimits | None = None, max_prompt_chars: int | None = None,
               throttle: AuthThrottle | None = None) -> FastAPI:
    """The OpenAI-compatible API over ``engine`` as an ASGI app (see the module docstring).
    With ``api_key`` every ``/v1`` route needs ``Authorization: Bearer <api_key>``, checked
    (and wrong keys throttled by ``throttle``) before a body is read; bodies are read within
    ``limits`` (:class:`~edgesplit.llm.api.http_guard.HttpLimits`); a prompt over
    ``max_prompt_chars`` characters (default: the engine's, which no prompt that fits its
    context exceeds) is refused before it is tokenized."""
    if api_key is not None and not api_key.strip():
        raise ConfigError(f"{option('api_key')} is empty: give a key or none")
    chars = engine.max_prompt_chars if max_prompt_chars is None else max_prompt_chars
    if chars < 1:
        raise ConfigError(f"{option('max_prompt_chars')} must be at least 1, got {chars}")
    app = FastAPI(title="edgesplit OpenAI-compatible API", docs_url=None, redoc_url=None)
    _install_error_handlers(app)
    app.add_middleware(Gate, api_key=api_key, limits=limits or HttpLimits(),
                       throttle=throttle)
    created = int(time.time())
    lanes = _Lanes.new()
    v1 = APIRouter(prefix="/v1")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(engine, created)]}

    @v1.get("/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model != engine.model_id:
            raise _model_not_found(model, engine)
        return _model_card(engine, created)

    @v1.post("/chat/completions")
    async def chat_completions(body: _ChatBody, request: Request) -> Response:
        _check(engine, body)
        messages = _chat_messages(body.messages)
        _check_chars([m["content"] for m in messages], chars, "messages")
        return await _generate(engine, lanes, request, body,
                               lambda: engine.chat_ids(messages), chat=True)

    @v1.post("/completions")
    async def completions(body: _CompletionBody, request: Request) -> Response:
        _check(engine, body)
        prompt = _prompt(body.prompt)
        _check_chars([prompt], chars, "prompt")
        return await _generate(engine, lanes, request, body,
                               lambda: engine.text_ids(prompt), chat=False)

    app.include_router(v1)
    return app


# ---------------------------------------------------------------------------------------------
# Serving


def serve_api(engine: TextEngine, host: str = "127.0.0.1", port: int = 8000,
              api_key: str | None = None, *, limits: HttpLimits | None = None,
              max_prompt_chars: int | None = None,
              ready: Callable[[int], None] | None = None) -> None:
    """Serve :func:`create_app` with uvicorn (log level warning) until SIGINT or SIGTERM,
    then return once the requests in flight are done or cancelled, so the caller can close
    its engine. ``limits`` bound connections (in all and per host), the time to a request's
    head and body, its bytes and the keep-alive (:class:`~edgesplit.llm.api.http_guard.
    HttpLimits`: the defaults are safe). ``ready`` is called with the bound port (``port``
    0: any free one) once connections are accepted. A port that cannot be bound, or a
    connection cap the open-file limit cannot hold, is a ConfigError."""
    import uvicorn

    limits = limits or HttpLimits()
    check_open_files(limits)
    app = create_app(engine, api_key=api_key, limits=limits, max_prompt_chars=max_prompt_chars)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                           http=guarded_protocol(limits),
                                           # typed int, only ever given to call_later
                                           timeout_keep_alive=limits.keep_alive_s))  # type: ignore[arg-type]
    try:
        with _listen(host, port) as sock, _signals_stop(server):
            if ready is not None:
                ready(sock.getsockname()[1])
            server.run(sockets=[sock])
    finally:
        _reset_stream_shutdown()


def _reset_stream_shutdown() -> None:
    """sse-starlette hooks uvicorn's signal handler to set a process-wide "shutting down"
    flag that nothing resets: after one server of this process stopped on a signal, every
    stream of any later server here would end at once, unfinished. Reset it."""
    from sse_starlette.sse import AppStatus

    AppStatus.should_exit = False


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket. Bound here rather than by uvicorn: a busy port is one line saying
    what to do, and the port is known (and connections queue) before the first request."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host!r}: {exc}; give an address of this "
                          f"machine with {option('host')}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another "
                          f"{option('port')} (0: any free port)") from None
    return sock


@contextmanager
def _signals_stop(server: Any) -> Iterator[None]:
    """SIGINT and SIGTERM stop ``server`` (a ``uvicorn.Server``) for the whole of this block.
    uvicorn handles them while it serves, shuts down gracefully, then raises the signal again
    for the handler that was there before it: the default one would kill the process or
    raise KeyboardInterrupt before the caller closes its engine. This one makes serving end
    as a plain return, and also stops a server still starting up."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals only reach the main thread; a server elsewhere is stopped otherwise
        return

    def stop(*_: object) -> None:
        server.should_exit = True

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
