"""What an LLM generation step carries between stages, as the runtime's ordinary messages
(:class:`~edgesplit.runtime.dataplane.Message`, wire-format tensors by name), so the gRPC
service, the data plane and their checks are the layer runtime's own.

A step's request to a stage holds the tensor crossing into it (``input_ids`` ``[1, T]`` int64
when it starts at the embedding, else the hidden state ``<block>.out`` ``[1, T, H]``) and
``position`` (``[1]`` int64: the tokens the session's caches hold before this step; 0 starts
the session afresh; a position below what the cache holds rewinds it there first) and,
optionally, ``sampling`` (``[4]`` int64: :meth:`~edgesplit.llm.stage.sampling.Sampling.to_tensor`;
absent: greedy), which every stage forwards to the one holding the head. The reply holds
``token`` (``[1, 1]`` int64: the next token). A request holding only ``end_session`` ends the
caller's session on every stage. The session is
call metadata ``edgesplit-session``, as for any stateful backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np
import torch

from edgesplit.errors import (
    ConfigError,
    ContextLimitError,
    SessionError,
    SessionOwnerError,
    SessionsBusyError,
    WireError,
    option,
)
from edgesplit.llm.stage.sampling import Sampling
from edgesplit.quant.wire import PlainCodec, decode_tensor, encode_tensor, message_info
from edgesplit.runtime.dataplane import Message, Part
from edgesplit.transport import BadRequest

__all__ = [
    "END_SESSION",
    "POSITION",
    "SAMPLING",
    "SESSION_CODES",
    "TOKEN",
    "DecodeCodec",
    "decode_int",
    "decode_sampling",
    "decode_step",
    "message",
    "session_error",
    "session_status",
    "step_tensors",
]

POSITION = "position"
SAMPLING = "sampling"
TOKEN = "token"
END_SESSION = "end_session"

# a stage's session errors as gRPC statuses (and back, in the client), most specific first
_CONTEXT_STATUS = grpc.StatusCode.OUT_OF_RANGE
_SESSION_STATUSES: tuple[tuple[type[SessionError], grpc.StatusCode], ...] = (
    (ContextLimitError, _CONTEXT_STATUS),
    (SessionOwnerError, grpc.StatusCode.PERMISSION_DENIED),
    (SessionsBusyError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (SessionError, grpc.StatusCode.ABORTED),
)
SESSION_CODES = frozenset(code for _, code in _SESSION_STATUSES)


def session_status(exc: SessionError) -> BadRequest:
    """A session error as the status its request fails with."""
    code = next(c for kind, c in _SESSION_STATUSES if isinstance(exc, kind))
    return BadRequest(code, str(exc))


# gRPC's own RESOURCE_EXHAUSTED for a message over a channel's limit ("Received message larger
# than max (N vs. M)", "Sent message larger than max"): not a busy stage, and retrying the same
# step cannot help, so it must not read as SessionsBusyError
_GRPC_TOO_LARGE = "message larger than max"


def session_error(code: grpc.StatusCode, message: str) -> SessionError | None:
    """The client's error for a stage's session status (None: another failure)."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _GRPC_TOO_LARGE in message:
        return None
    return next((kind(message) for kind, c in _SESSION_STATUSES if c == code), None)


def message(plan_id: str, version: int, request_id: int,
            tensors: Mapping[str, torch.Tensor], timings: dict[str, float] | None = None
            ) -> Message:
    """A step's message; hidden states travel at their own precision (32 or 16 bits)."""
    parts = [Part(name, encode_tensor(t, 16 if t.dtype in (torch.float16, torch.bfloat16)
                                      else 32)) for name, t in tensors.items()]
    return Message(plan_id, version, request_id, parts, dict(timings or {}))


def decode_int(data: Any, name: str, shape: Sequence[int]) -> torch.Tensor:
    """An int64 tensor of exactly ``shape`` (BadRequest otherwise, before it is allocated)."""
    try:
        return decode_tensor(data, expect_shape=list(shape), expect_dtype=torch.int64)
    except WireError as exc:
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"tensor {name!r}: {exc}; expected int64 of shape {list(shape)}"
                         ) from None


def decode_step(data: Any, name: str, *, hidden_size: int | None, vocab_size: int,
                max_tokens: int) -> torch.Tensor:
    """The tensor entering a stage: token ids ``[1, T]`` below ``vocab_size``
    (``hidden_size`` None) or a floating hidden state ``[1, T, hidden_size]``, with
    1 <= T <= ``max_tokens``; BadRequest naming what is wrong: OUT_OF_RANGE for more tokens
    than ``max_tokens`` (the plan's max context, as the session's own check answers),
    INVALID_ARGUMENT for anything else."""
    width = 1 if hidden_size is None else hidden_size
    try:  # bounded before anything payload-sized is allocated
        x = decode_tensor(data, max_raw_bytes=max_tokens * width * 8)
    except WireError as exc:
        _check_tokens(name, _declared_tokens(data), max_tokens)  # too long: OUT_OF_RANGE
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT, f"tensor {name!r}: {exc}") from None
    if x.dim() >= 2:
        _check_tokens(name, int(x.shape[1]), max_tokens)
    if hidden_size is None:
        want = "int64 token ids of shape [1, T]"
        ok = x.dtype == torch.int64 and x.dim() == 2 and x.shape[0] == 1
    else:
        want = f"a floating hidden state of shape [1, T, {hidden_size}]"
        ok = x.is_floating_point() and x.dim() == 3 and x.shape[0] == 1 and \
            x.shape[2] == hidden_size
    if not ok or not 1 <= x.shape[1] <= max_tokens:
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"tensor {name!r} is {x.dtype} of shape {list(x.shape)}; expected "
                         f"{want}, 1 <= T <= {max_tokens} (the plan's max context)")
    if hidden_size is None and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"token ids must lie in [0, {vocab_size}), got {int(x.min())}.."
                         f"{int(x.max())}")
    if hidden_size is not None and not bool(torch.isfinite(x).all()):
        # refused before the step: stored in the KV cache, a NaN would make every later
        # token of the session 0 without an error
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"tensor {name!r} holds NaN or infinite values; nothing was cached")
    return x


def _declared_tokens(data: Any) -> int | None:
    """The tokens (second dimension) a step's tensor declares in its header (None: a
    malformed message or no such dimension); read without decoding the payload."""
    try:
        shape = message_info(data)["shape"]
    except WireError:
        return None
    return int(shape[1]) if len(shape) >= 2 else None


def _check_tokens(name: str, tokens: int | None, max_tokens: int) -> None:
    """OUT_OF_RANGE (ContextLimitError at the client, as for any step past the context)
    when a step carries more tokens than the plan's max context."""
    if tokens is not None and tokens > max_tokens:
        raise BadRequest(_CONTEXT_STATUS,
                         f"tensor {name!r} carries {tokens} tokens, more than the plan's max "
                         f"context of {max_tokens}: send a shorter prompt, or plan with a "
                         f"larger {option('max_context', flag='--max-context')}")


def decode_sampling(data: Any) -> Sampling:
    """A step's sampling settings (BadRequest when malformed or out of range)."""
    t = decode_int(data, SAMPLING, [4])
    try:
        return Sampling.from_tensor(t)
    except ConfigError as exc:
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT, f"tensor {SAMPLING!r}: {exc}"
                         ) from None


def step_tensors(name: str, x: torch.Tensor, position: int, sampling: Sampling | None
                 ) -> dict[str, torch.Tensor]:
    """A step's tensors: ``x`` as ``name``, the position, and sampling unless greedy."""
    tensors = {name: x, POSITION: torch.tensor([position], dtype=torch.int64)}
    if sampling is not None and not sampling.greedy:
        tensors[SAMPLING] = sampling.to_tensor()
    return tensors


class DecodeCodec:
    """A decode step's messages (one token: the hidden state ``[1, 1, hidden_size]`` float32
    or the token id ``[1, 1]``, the position, the reply's token), their headers built once:
    what a stage and the client encode and decode every step, right after compute, where
    caches are cold and each torch call costs tens of microseconds (measured: a step's
    codec took ~1 ms of a 2-stage SmolLM2 decode step's ~15). Bytes, checks and errors are
    :func:`message`'s, :func:`decode_int`'s and :func:`decode_step`'s: anything else (a
    prefill, another dtype) goes through them."""

    def __init__(self, hidden_size: int) -> None:
        self.hidden = PlainCodec([1, 1, hidden_size], torch.float32)
        self.ids = PlainCodec([1, 1], torch.int64)  # a token id: the reply's, or a step's
        self.position = PlainCodec([1], torch.int64)

    def step(self, plan_id: str, version: int, request_id: int, name: str,
             x: torch.Tensor | np.ndarray, position: int, sampling: Sampling | None
             ) -> Message:
        """:func:`message` of :func:`step_tensors` (``x`` a tensor, or a float32 array)."""
        if isinstance(x, np.ndarray):
            codec = self.hidden if x.dtype == np.float32 else self.ids
            data = codec.encode_array(x)
        elif x.dtype == torch.float32 and x.is_cpu and not x.requires_grad and \
                tuple(x.shape) == self.hidden.shape:  # else (on a GPU, say) the general way
            data = self.hidden.encode_array(x.numpy())
        else:
            return message(plan_id, version, request_id, step_tensors(name, x, position,
                                                                      sampling))
        parts = [Part(name, data),
                 Part(POSITION, self.position.encode_array(np.array([position], np.int64)))]
        if sampling is not None and not sampling.greedy:
            parts.append(Part(SAMPLING, encode_tensor(sampling.to_tensor(), 32)))
        return Message(plan_id, version, request_id, parts, {})

    def token_reply(self, plan_id: str, version: int, request_id: int, token: int,
                    timings: dict[str, float]) -> Message:
        """:func:`message` of ``{TOKEN: [[token]]}`` with ``timings``."""
        data = self.ids.encode_array(np.array([[token]], np.int64))
        return Message(plan_id, version, request_id, [Part(TOKEN, data)], dict(timings))

    def read_position(self, data: Any) -> int:
        """``decode_int(data, POSITION, [1])``'s value."""
        return int(self._ints(self.position, data, POSITION)[0])

    def read_token(self, data: Any) -> int:
        """``decode_int(data, TOKEN, [1, 1])``'s value."""
        return int(self._ints(self.ids, data, TOKEN)[0, 0])

    @staticmethod
    def _ints(codec: PlainCodec, data: Any, name: str) -> np.ndarray:
        try:
            return codec.decode_array(data)
        except WireError as exc:
            raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                             f"tensor {name!r}: {exc}; expected int64 of shape "
                             f"{list(codec.shape)}") from None

    def read_hidden(self, data: Any, name: str, *, vocab_size: int, max_tokens: int
                    ) -> torch.Tensor:
        """:func:`decode_step` of a decode step's hidden state (checked finite); any other
        message (a prefill's, another dtype) through :func:`decode_step` itself."""
        try:
            x = self.hidden.decode_array(data) if _is_plain(self.hidden, data) else None
        except WireError:
            x = None
        if x is None:
            return decode_step(data, name, hidden_size=self.hidden.shape[2],
                               vocab_size=vocab_size, max_tokens=max_tokens)
        if not np.isfinite(x).all():  # as decode_step refuses it
            raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                             f"tensor {name!r} holds NaN or infinite values; nothing was "
                             "cached")
        return torch.from_numpy(x)


def _is_plain(codec: PlainCodec, data: Any) -> bool:
    """Whether ``data`` starts with ``codec``'s header (else the general decoder reads it and
    says what is wrong)."""
    plain = codec.plain
    return plain is not None and type(data) in (bytes, bytearray, memoryview) and \
        memoryview(data)[: len(plain[0])] == plain[0]
