"""Token sampling at the head's stage: settings validate and cross the wire intact, the filtered
distribution is transformers' own, and a draw depends only on (logits, settings, seed,
position)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesplit.errors import ConfigError, cli_options
from edgesplit.llm.stage.sampling import Sampling, filtered_probs, mix_seed, sample


def _logits(v: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(v, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(("kwargs", "name"), [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(temperature="1.0"), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.0), "top_k"),
    (dict(top_k=True), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=math.nan), "top_p"),
    (dict(seed=-1), "seed"),
    (dict(seed=2**63), "seed"),
    (dict(seed=1.0), "seed"),
])
def test_invalid_settings_name_the_option(kwargs, name) -> None:
    with pytest.raises(ConfigError, match=name):
        Sampling(**kwargs)
    with cli_options(), pytest.raises(ConfigError, match="--" + name.replace("_", "-")):
        Sampling(**kwargs)


def test_valid_edges_are_accepted() -> None:
    s = Sampling(temperature=1, top_k=0, top_p=1.0, seed=2**63 - 1)
    assert s.temperature == 1.0 and isinstance(s.temperature, float)
    assert Sampling().greedy and not s.greedy


_samplings = st.builds(
    Sampling,
    temperature=st.floats(min_value=0, max_value=1e300, allow_nan=False),
    top_k=st.integers(min_value=0, max_value=2**63 - 1),
    top_p=st.floats(min_value=0, max_value=1, exclude_min=True),
    seed=st.integers(min_value=0, max_value=2**63 - 1),
)


@settings(max_examples=200, deadline=None)
@given(_samplings)
def test_tensor_round_trip(s: Sampling) -> None:
    t = s.to_tensor()
    assert t.dtype == torch.int64 and t.shape == (4,)
    back = Sampling.from_tensor(t)
    assert back == s
    assert torch.equal(back.to_tensor(), t)  # bit-exact, not merely equal


def _bits(x: float) -> int:
    return int(torch.tensor([x], dtype=torch.float64).view(torch.int64))


@pytest.mark.parametrize("t", [
    torch.zeros(3, dtype=torch.int64),
    torch.zeros(5, dtype=torch.int64),
    torch.zeros(1, 4, dtype=torch.int64),
    torch.zeros(4, dtype=torch.int32),
    torch.zeros(4, dtype=torch.float64),
    torch.tensor([_bits(math.nan), 0, _bits(1.0), 0]),  # NaN temperature
    torch.tensor([_bits(math.inf), 0, _bits(1.0), 0]),
    torch.tensor([_bits(-1.0), 0, _bits(1.0), 0]),
    torch.tensor([0, -5, _bits(1.0), 0]),  # negative top_k
    torch.tensor([0, 0, _bits(math.nan), 0]),
    torch.tensor([0, 0, 0, 0]),  # top_p 0.0
    torch.tensor([0, 0, _bits(1.0), -1]),  # negative seed
    [0, 0, 0, 0],
])
def test_malformed_tensors_are_refused(t) -> None:
    with pytest.raises(ConfigError):
        Sampling.from_tensor(t)


@pytest.mark.parametrize("shape", [(64,), (1, 64), (1, 1, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_is_argmax(shape, dtype) -> None:
    logits = _logits().to(dtype).reshape(shape)
    for position in (0, 7, 1000):
        assert sample(logits, Sampling(seed=5), position) == int(logits.argmax())


def test_batched_logits_are_refused() -> None:
    with pytest.raises(ValueError, match="one row"):
        sample(torch.zeros(2, 8), Sampling(temperature=1.0), 0)


@settings(max_examples=60, deadline=None)
@given(temperature=st.floats(min_value=1e-3, max_value=1e3), seed=st.integers(0, 2**63 - 1),
       position=st.integers(0, 10**9), which=st.integers(0, 20))
def test_top_k_1_and_tiny_top_p_are_greedy(temperature, seed, position, which) -> None:
    logits = _logits(v=500, seed=which)
    best = int(logits.argmax())
    for s in (Sampling(temperature, top_k=1, seed=seed),
              Sampling(temperature, top_p=1e-4, seed=seed)):
        assert sample(logits, s, position) == best
        probs = filtered_probs(logits, s)
        assert probs[best] == 1.0 and probs.sum() == 1.0


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 10, 1.0), (1.0, 0, 0.9), (0.5, 20, 0.8),
    (2.0, 5, 0.5), (1.0, 1000, 0.95), (0.05, 0, 0.99), (5.0, 3, 0.3),
])
@pytest.mark.parametrize("ties", [False, True])
def test_filtered_probs_equal_transformers_warpers(temperature, top_k, top_p, ties) -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = _logits(v=200, seed=11)
    if ties:  # rounded logits tie often: top-k keeps every tie of its k-th value
        logits = logits.round()
    scores = logits[None, :].clone()
    ids = torch.zeros(1, 1, dtype=torch.long)
    scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    expected = scores.softmax(dim=-1)[0]
    got = filtered_probs(logits, Sampling(temperature, top_k, top_p, seed=1))
    assert got.dtype == torch.float32 and got.shape == (200,)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert torch.equal(got == 0, expected == 0)  # the same tokens filtered


def test_same_seed_and_position_give_the_same_token() -> None:
    logits, s = _logits(), Sampling(temperature=1.5, seed=42)
    for position in range(50):
        tokens = {sample(logits, s, position) for _ in range(3)}
        assert len(tokens) == 1
        # on another dtype's copy of the same values, and fed as [1, 1, V]
        assert sample(logits.double()[None, None], s, position) == tokens.pop()


def test_positions_and_seeds_change_the_draw() -> None:
    logits = torch.zeros(16)  # uniform: 200 draws of one token would be a broken generator
    by_position = [sample(logits, Sampling(1.0, seed=7), p) for p in range(200)]
    by_seed = [sample(logits, Sampling(1.0, seed=s), 3) for s in range(200)]
    assert len(set(by_position)) == 16 and len(set(by_seed)) == 16
    assert by_position != [sample(logits, Sampling(1.0, seed=8), p) for p in range(200)]


def test_mix_seed_is_63_bit_and_distinct_over_positions() -> None:
    seeds = [mix_seed(s, p) for s in (0, 1, 2**63 - 1) for p in range(2000)]
    assert all(0 <= x < 2**63 for x in seeds)
    assert len(set(seeds)) == len(seeds)
    assert mix_seed(0, 0) == mix_seed(0, 0) != mix_seed(0, 1)


def test_empirical_frequencies_match_the_distribution() -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    s = Sampling(temperature=0.8, top_k=6, top_p=0.9, seed=1234)
    probs = filtered_probs(logits, s)
    n = 20_000
    counts = torch.bincount(torch.tensor([sample(logits, s, p) for p in range(n)]),
                            minlength=8)
    freq = counts.double() / n
    assert torch.equal(counts == 0, probs == 0)  # filtered tokens never drawn, others are
    # 5 standard deviations of a binomial frequency at p = 0.5: about 0.018
    assert float((freq - probs.double()).abs().max()) < 5 * math.sqrt(0.25 / n)


@pytest.mark.parametrize(("logits", "temperature"), [
    ([10.0, 0.0, -1.0], 1e-300),  # rounds to 0 in float32: 0/0 is NaN
    ([10.0, 0.0, -1.0], 1e-40),  # 10/1e-40 overflows to inf
    ([-1.0, -2.0], 1e-300),  # every logit to -inf
])
def test_overflowing_temperature_is_a_config_error(logits, temperature) -> None:
    with pytest.raises(ConfigError, match="temperature"):
        sample(torch.tensor(logits), Sampling(temperature), 0)


def test_masked_logits_stay_masked() -> None:
    logits = torch.tensor([1.0, -math.inf, 0.5, -math.inf])
    probs = filtered_probs(logits, Sampling(1e-3))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert {sample(logits, Sampling(2.0), p) for p in range(100)} == {0, 2}
