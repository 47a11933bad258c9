"""Streaming text: the incremental detokenizer emits exactly what one decode of all the ids
gives, never half a character, and the stop matcher cuts just before the earliest stop string
however the text is split."""

from __future__ import annotations

import random

import pytest

from edgesplit.errors import ConfigError
from edgesplit.llm.generate.text import IncrementalDetokenizer, StopMatcher

CORPUS = [
    "Hello world, this is a test of streaming text.",
    "Café crème brûlée à la façon de Zoë, naïve résumé über straße.",
    # the full-width comma is meant: CJK punctuation is multi-byte too
    "日本語のテキストと中文文本，还有한국어 문장。",  # noqa: RUF001
    "emoji 😀🎉👍🏽 and a family 👨‍👩‍👧 in one line",
]
# single characters the corpus never shows: the byte-level BPE keeps them as byte tokens
UNSEEN = ["🦀", "𝄞", "ℵ", "Ω", "漢", "ﬁ"]


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE trained in memory (deterministic: one thread's merges over a fixed
    corpus), as transformers wraps it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def _stream(tokenizer, ids, skip_special_tokens=True) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    pushes = [detok.push(i) for i in ids]
    tail = detok.flush()
    assert detok.text == "".join(pushes) + tail
    return pushes, tail


def _texts() -> list[str]:
    rng = random.Random(0)
    words = [w for line in CORPUS for w in line.split()] + UNSEEN + ["👩🏾‍🚀", "漢字"]
    return CORPUS + UNSEEN + [" ".join(rng.choices(words, k=rng.randint(1, 12)))
                              for _ in range(60)]


def test_streamed_text_equals_one_decode(tokenizer) -> None:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    for text in _texts():
        ids = [bos, *tokenizer.encode(text), eos]
        for skip in (True, False):
            pushes, tail = _stream(tokenizer, ids, skip)
            assert "".join(pushes) + tail == tokenizer.decode(ids, skip_special_tokens=skip)
            assert tail == ""  # the text ends on a whole character: nothing left held
            assert not any("\ufffd" in p for p in pushes)
        assert "".join(_stream(tokenizer, ids)[0]) == text  # specials skipped


def test_multibyte_characters_wait_for_their_last_token(tokenizer) -> None:
    for char in UNSEEN:
        ids = tokenizer.encode(char)
        assert len(ids) > 1  # the test needs characters split over tokens
        pushes, tail = _stream(tokenizer, ids)
        assert pushes[:-1] == [""] * (len(ids) - 1) and pushes[-1] == char and tail == ""


def test_random_ids_keep_the_invariant(tokenizer) -> None:
    """Arbitrary ids (invalid UTF-8, specials anywhere) still stream to the one decode; an
    incomplete character at the end comes out of flush as decode writes it."""
    rng = random.Random(1)
    vocab = len(tokenizer)
    held_at_end = 0
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        for skip in (True, False):
            pushes, tail = _stream(tokenizer, ids, skip)
            assert "".join(pushes) + tail == tokenizer.decode(ids, skip_special_tokens=skip)
            held_at_end += tail != ""
    assert held_at_end > 0  # some sequences did end mid-character


def test_no_ids_decode_to_nothing(tokenizer) -> None:
    assert _stream(tokenizer, []) == ([], "")
    assert _stream(tokenizer, [tokenizer.eos_token_id]) == ([""], "")


def _stop_reference(text: str, stops: list[str]) -> tuple[str, bool]:
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[:min(cuts)], True) if cuts else (text, False)


def _run_stops(stops: list[str], pieces: list[str]) -> tuple[list[str], str, bool]:
    matcher = StopMatcher(stops)
    out, stopped = [], False
    for piece in pieces:
        emitted, stopped = matcher.push(piece)
        out.append(emitted)
    return out, matcher.flush(), stopped


def test_stop_split_across_pushes() -> None:
    out, tail, stopped = _run_stops(["</end>"], ["hello </e", "nd> more", "even more"])
    assert out == ["hello ", "", ""] and tail == "" and stopped


def test_stop_at_the_very_start() -> None:
    assert _run_stops(["STOP"], ["STOP and the rest"]) == ([""], "", True)
    assert _run_stops(["STOP"], ["S", "T", "O", "P", "x"]) == (["", "", "", "", ""], "", True)


def test_overlapping_stops_and_the_earliest_wins() -> None:
    assert _run_stops(["aab"], ["a", "a", "ab"]) == (["", "", "a"], "", True)
    assert _run_stops(["bcd", "abcz"], list("abcd")) == (["", "", "", "a"], "", True)
    assert _run_stops(["world", "lo"], ["hello world"]) == (["hel"], "", True)
    assert _run_stops(["lo", "hello"], ["hello"]) == ([""], "", True)


def test_held_text_is_released() -> None:
    # a false start is emitted as soon as it stops matching, and the tail at the end on flush
    assert _run_stops(["</end>"], ["x </e", "xyz"]) == (["x ", "</exyz"], "", False)
    assert _run_stops(["</end>"], ["done </"]) == (["done "], "</", False)
    assert _run_stops(["ab"], ["xa", "a", "c"]) == (["x", "a", "ac"], "", False)


def test_no_stops_pass_through() -> None:
    assert _run_stops([], ["a", "", "bc"]) == (["a", "", "bc"], "", False)


@pytest.mark.parametrize("stops", [[""], ["ok", ""], "stop"])
def test_bad_stops_are_refused(stops) -> None:
    with pytest.raises(ConfigError, match="stop"):
        StopMatcher(stops)


def test_any_split_emits_the_text_before_the_first_stop() -> None:
    rng = random.Random(2)
    alphabet = "ab</>é日"
    for _ in range(500):
        stops = ["".join(rng.choices(alphabet, k=rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 20)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, 4)))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        out, tail, stopped = _run_stops(stops, pieces)
        assert ("".join(out) + tail, stopped) == _stop_reference(text, stops)
