"""Streaming text out of a token stream: whole characters only, cut before a stop string.

:class:`IncrementalDetokenizer` turns token ids into text one token at a time. A byte-level
tokenizer can split one character (an accent, a CJK character, an emoji) over several tokens,
so decoding each token alone would emit U+FFFD halves; it uses the prefix/read offset method of
vLLM and transformers' ``TextStreamer`` instead: decode a short window of recent ids with and
without the new ones and emit only the difference, once it no longer ends in U+FFFD.

:class:`StopMatcher` cuts the emitted text just before the first stop string, holding back a
tail that could still become one so that no part of a stop string is ever emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgesplit.errors import ConfigError, option

__all__ = ["IncrementalDetokenizer", "StopMatcher"]

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Text from token ids pushed one at a time, for any transformers tokenizer.

    The concatenation of every :meth:`push` and the final :meth:`flush` equals
    ``tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)`` of all the ids, for
    any decoder whose text of a sequence joins at whole characters (byte-level BPE,
    SentencePiece with byte fallback). A clean-up that rewrites across token boundaries
    (WordPiece's ``clean_up_tokenization_spaces``, dropping a space before punctuation) can
    leave such a space in the stream."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        # ids[prefix_offset:read_offset] were decoded and emitted already; they are decoded
        # again with the new ids because a token's text can depend on its left neighbour
        # (SentencePiece's leading space, a multi-byte character's first bytes)
        self._prefix_offset = 0
        self._read_offset = 0
        self._text: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._text)

    def _decode(self, ids: list[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return text

    def push(self, token_id: int) -> str:
        """The new text ``token_id`` completes ("" while a character is still incomplete)."""
        self.ids.append(int(token_id))
        prefix = self._decode(self.ids[self._prefix_offset:self._read_offset])
        full = self._decode(self.ids[self._prefix_offset:])
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ""  # held: an incomplete character, or a token with no text (special)
        new = full[len(prefix):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        self._text.append(new)
        return new

    def flush(self) -> str:
        """Whatever the last tokens hold at the end of the stream (an incomplete character
        decodes to U+FFFD here, as ``tokenizer.decode`` would)."""
        prefix = self._decode(self.ids[self._prefix_offset:self._read_offset])
        full = self._decode(self.ids[self._prefix_offset:])
        new = full[len(prefix):]
        self._prefix_offset = self._read_offset = len(self.ids)
        self._text.append(new)
        return new


class StopMatcher:
    """Cuts streamed text just before the first of ``stops``.

    :meth:`push` returns the text safe to emit and whether a stop string was reached; it holds
    back the longest tail that is a prefix of some stop string until later text decides it.
    With no stops, text passes straight through."""

    def __init__(self, stops: Sequence[str]) -> None:
        if isinstance(stops, str):
            raise ConfigError(f"{option('stop', stops)}: give a list of stop strings, not one "
                              "string")
        if any(not s for s in stops):
            raise ConfigError(f"{option('stop', list(stops))}: stop strings must not be empty")
        self.stops = tuple(stops)
        self.stopped = False
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """``(text to emit now, stop reached)``. After a stop every later push returns
        ``("", True)``."""
        if self.stopped:
            return "", True
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:  # the earliest stop in the text wins
            self.stopped, self._held = True, ""
            return buf[:cut], True
        keep = self._held_length(buf)
        self._held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep], False

    def _held_length(self, buf: str) -> int:
        """The length of the longest tail of ``buf`` that begins some stop string (no stop
        occurs in ``buf``, so the tail is shorter than the stop)."""
        longest = min(len(buf), max((len(s) for s in self.stops), default=0))
        for n in range(longest, 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        """The held tail at the end of the stream ("" after a stop: it was never emitted)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
