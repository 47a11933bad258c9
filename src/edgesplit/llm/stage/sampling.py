"""Sampling the next token where the logits are (the stage holding the head).

A token is a pure function of ``(logits, settings, seed, position)``: greedy takes the argmax,
sampling filters the logits exactly as transformers' ``TemperatureLogitsWarper`` ->
``TopKLogitsWarper`` -> ``TopPLogitsWarper`` do (``min_tokens_to_keep=1``) and draws from a
fresh generator seeded by :func:`mix_seed` of the seed and the position. No generator state
outlives a call, so a retried step, a resumed session or another process draws the same token.

What this means for equality: a split's tokens equal single-process sampling when the same
logits go through :func:`sample` with the same seed and positions. Greedy equals transformers'
greedy ``generate``. Sampling does NOT reproduce ``generate(do_sample=True)``, which draws from
the global generator's stream; only the filtered distribution (:func:`filtered_probs`) matches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from edgesplit.errors import ConfigError, option

__all__ = ["Sampling", "filtered_probs", "mix_seed", "sample"]

_SEED_LIMIT = 2**63
_MASK64 = (1 << 64) - 1


def _is_int(x: object) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Sampling:
    """How the head's stage picks each token: ``temperature`` 0 is greedy (argmax);
    otherwise temperature, then top-k (0: off), then top-p (1.0: off), then a draw seeded by
    ``seed`` and the token's position."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        t, k, p, s = self.temperature, self.top_k, self.top_p, self.seed
        if not (_is_real(t) and math.isfinite(t) and t >= 0):
            raise ConfigError(f"{option('temperature', t)}: the temperature must be a finite "
                              "number >= 0 (0 is greedy decoding)")
        if not (_is_int(k) and k >= 0):
            raise ConfigError(f"{option('top_k', k)}: top-k must be an integer >= 0 "
                              "(0 turns it off)")
        if not (_is_real(p) and 0 < p <= 1):
            raise ConfigError(f"{option('top_p', p)}: top-p must be in (0, 1] "
                              "(1 turns it off)")
        if not (_is_int(s) and 0 <= s < _SEED_LIMIT):
            raise ConfigError(f"{option('seed', s)}: the seed must be an integer in "
                              "[0, 2**63)")
        # numpy scalars and ints pass the checks; store plain Python types so equal settings
        # print, hash and encode alike
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_k", int(k))
        object.__setattr__(self, "top_p", float(p))
        object.__setattr__(self, "seed", int(s))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_tensor(self) -> torch.Tensor:
        """int64 [4] for the wire: float64 bits of temperature, top_k, float64 bits of top_p,
        seed."""
        return torch.cat([_float_bits(self.temperature), torch.tensor([self.top_k]),
                          _float_bits(self.top_p), torch.tensor([self.seed])])

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Sampling:
        """The settings :meth:`to_tensor` encoded; ConfigError for anything else (wrong type,
        dtype or shape, or values the constructor refuses: NaN, negative top_k...)."""
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.shape != (4,):
            got = (f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor)
                   else type(t).__name__)
            raise ConfigError(f"sampling settings must be an int64 tensor of shape [4], got "
                              f"{got}")
        t = t.detach().cpu().contiguous()
        bits = t.view(torch.float64)
        return cls(temperature=float(bits[0]), top_k=int(t[1]), top_p=float(bits[2]),
                   seed=int(t[3]))


def _float_bits(x: float) -> torch.Tensor:
    return torch.tensor([x], dtype=torch.float64).view(torch.int64)


def mix_seed(seed: int, position: int) -> int:
    """The generator seed for the token at ``position``: splitmix64 of the seed, XOR the
    position, splitmix64 again, the top 63 bits. Plain integer arithmetic, so the same on
    every machine; splitmix64 is a bijection on 64 bits, so for one seed no two positions
    collide before the final shift, and neighbouring positions get unrelated streams."""
    z = _splitmix64(seed & _MASK64) ^ (position & _MASK64)
    return _splitmix64(z) >> 1


def _splitmix64(x: int) -> int:
    """splitmix64 (Steele, Lea, Flood 2014): add the golden-ratio increment, then a bijective
    xor-shift-multiply finaliser on 64 bits."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _flat(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() == 0 or any(d != 1 for d in logits.shape[:-1]):
        raise ValueError(f"expected one row of logits ([V], [1, V] or [1, 1, V]), got "
                         f"{list(logits.shape)}")
    return logits.reshape(-1)


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    # TopKLogitsWarper: ties with the k-th value are kept
    kth = torch.topk(scores, min(k, scores.size(-1)))[0][..., -1, None]
    return scores.masked_fill(scores < kth, -math.inf)


def _top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    # TopPLogitsWarper: drop the low tail whose mass is <= 1 - p, always keep the top token
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - p)
    remove[..., -1:] = False
    remove = remove.scatter(1, sorted_indices, remove)
    return scores.masked_fill(remove, -math.inf)


def _overflowed(raw: torch.Tensor, scores: torch.Tensor) -> bool:
    """Whether dividing by the temperature turned finite logits into NaN (0/0 when it rounds
    to 0 in float32) or pushed the largest one to +-inf (softmax would then give NaN)."""
    if bool(torch.isnan(raw).any()) or not math.isfinite(float(raw.max())):
        return False  # the model's own values: not the temperature's doing
    return bool(torch.isnan(scores).any()) or not math.isfinite(float(scores.max()))


def filtered_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The float32 CPU distribution ``[V]`` that :func:`sample` draws from: ``logits`` divided
    by the temperature, then top-k, then top-p (filtered tokens get probability 0), softmax.
    Computed on the CPU so the result does not depend on an accelerator's kernels.

    Raises ConfigError when the temperature is so small that the scaled logits overflow
    float32 (where transformers would produce NaN)."""
    if sampling.greedy:
        raise ValueError("greedy settings (temperature 0) have no distribution: use sample()")
    raw = _flat(logits).detach().to("cpu", torch.float32)[None, :]  # [1, V], as transformers
    scores = raw / sampling.temperature
    if _overflowed(raw, scores):
        raise ConfigError(f"{option('temperature', sampling.temperature)} is too small for "
                          "these logits (they overflow float32 when divided by it): use a "
                          f"larger temperature, or {option('temperature', 0.0)} for greedy")
    if sampling.top_k != 0:
        scores = _top_k(scores, sampling.top_k)
    if sampling.top_p < 1.0:
        scores = _top_p(scores, sampling.top_p)
    return scores.softmax(dim=-1)[0]


def sample(logits: torch.Tensor, sampling: Sampling, position: int) -> int:
    """The token at ``position`` (the sequence length before it) from ``logits`` ``[V]``
    (``[1, V]`` and ``[1, 1, V]`` are flattened), any float dtype: the argmax when greedy,
    else one draw from :func:`filtered_probs` with a generator seeded by
    ``mix_seed(sampling.seed, position)``."""
    if sampling.greedy:
        return int(_flat(logits).argmax())
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    probs = filtered_probs(logits, sampling)
    g = torch.Generator().manual_seed(mix_seed(sampling.seed, position))
    return int(torch.multinomial(probs, 1, generator=g))
