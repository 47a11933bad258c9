"""DecodeCodec: a decode step's messages with their headers built once are the general
functions' own, bytes and errors alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgesplit.llm.stage.sampling import Sampling
from edgesplit.llm.stage.wire import (
    POSITION,
    TOKEN,
    DecodeCodec,
    decode_int,
    decode_step,
    message,
    step_tensors,
)
from edgesplit.transport import BadRequest

H = 8


def _bytes(msg):
    return [(p.name, bytes(p.data)) for p in msg.tensors], msg.timings_ms


@pytest.mark.parametrize("sampling", [None, Sampling(temperature=0.7, top_k=5, seed=3)])
@pytest.mark.parametrize("x", [torch.randn(1, 1, H), torch.randn(1, 1, H).numpy(),
                               torch.randn(1, 4, H), torch.tensor([[7]]),
                               torch.randn(1, 1, H).half(),
                               torch.randn(1, 1, H).requires_grad_()],
                         # ids by kind, not value: xdist's workers must collect the same ids
                         ids=["decode", "numpy", "prefill", "tokens", "half", "grad"])
def test_a_step_message_is_the_general_one(x, sampling):
    codec = DecodeCodec(H)
    general = message("plan", 1, 9, step_tensors("h", torch.as_tensor(x).detach(), 40,
                                                  sampling))
    assert _bytes(codec.step("plan", 1, 9, "h", x, 40, sampling)) == _bytes(general)


def test_the_token_reply_and_reads_are_the_general_ones():
    codec = DecodeCodec(H)
    general = message("plan", 1, 9, {TOKEN: torch.tensor([[1234]])}, {"a.compute_ms": 1.5})
    reply = codec.token_reply("plan", 1, 9, 1234, {"a.compute_ms": 1.5})
    assert _bytes(reply) == _bytes(general)
    assert codec.read_token(reply.tensors[0].data) == 1234
    step = message("plan", 1, 9, step_tensors("h", torch.randn(1, 1, H), 40, None))
    data = {p.name: p.data for p in step.tensors}
    assert codec.read_position(memoryview(data[POSITION])) == 40
    x = codec.read_hidden(data["h"], "h", vocab_size=10, max_tokens=64)
    assert torch.equal(x, decode_step(data["h"], "h", hidden_size=H, vocab_size=10,
                                      max_tokens=64))


def _error(call):
    with pytest.raises(BadRequest) as got:
        call()
    return got.value.code, str(got.value)


@pytest.mark.parametrize("damage", ["nan", "checksum", "truncated", "shape"])
def test_a_bad_hidden_state_is_refused_in_the_general_words(damage):
    codec = DecodeCodec(H)
    x = torch.randn(1, 1, H)
    if damage == "nan":
        x[0, 0, 3] = float("nan")
    data = bytearray(codec.step("p", 1, 1, "h", x, 0, None).tensors[0].data)
    if damage == "checksum":
        data[-1] ^= 1
    elif damage == "truncated":
        data = data[:-4]
    elif damage == "shape":
        data = bytearray(message("p", 1, 1, {"h": torch.randn(1, 1, H + 1)}).tensors[0].data)
    mine = _error(lambda: codec.read_hidden(bytes(data), "h", vocab_size=10, max_tokens=64))
    assert mine == _error(lambda: decode_step(bytes(data), "h", hidden_size=H, vocab_size=10,
                                              max_tokens=64))


def test_a_bad_position_or_token_is_refused_in_the_general_words():
    codec = DecodeCodec(H)
    for bad, shape, read in ((np.array([1, 2]), [1], codec.read_position),
                             (np.array([[1.0]], np.float32), [1, 1], codec.read_token)):
        data = message("p", 1, 1, {"t": torch.from_numpy(bad)}).tensors[0].data
        name = POSITION if len(shape) == 1 else TOKEN
        assert _error(lambda d=data, r=read: r(d)) == \
            _error(lambda d=data, s=shape, n=name: decode_int(d, n, s))
