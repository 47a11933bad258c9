"""JMSNAS's binary gates (paper 000, section IV-A, Lemma 1), as in ProxylessNAS.

A searchable layer has architecture parameters ``alpha`` (one per candidate op) and path
probabilities ``p = softmax(alpha)``. A one-hot binary gate ``g`` (``g_i = 1`` with probability
``p_i``) picks what the layer runs, so a forward pass costs one path, not R.

- **Weight steps** run one path sampled from ``p`` (:func:`sample_path`).
- **Architecture steps** sample two distinct paths, mask every other one (memory 2x, not Rx),
  and gate the two with :func:`binary_gates`: forward gives the one-hot gate of one of them
  (drawn from ``p`` renormalised over the pair); backward turns ``dL/dg`` (which autograd
  computes from the two outputs, because the gates multiply them) into Lemma 1's

      dL/dalpha_i = sum_j dL/dg_j * p_j * (delta_ij - p_i),

  over the pair, with ``p`` renormalised over the pair; the other alphas get no gradient.

The gates plug into :meth:`edgesplit.nas.jmsnas.supernet.MixedOp.set_paths` (``active`` = the pair,
``gates`` = this function's output). ProxylessNAS additionally shifts the pair's alphas after
each update so the unsampled paths keep their probabilities; JMSNAS does not say it does, and
we do not.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["binary_gates", "lemma1_gradient", "sample_pair", "sample_path"]


def lemma1_gradient(probs: torch.Tensor, grad_gates: torch.Tensor) -> torch.Tensor:
    """``sum_j grad_gates_j * probs_j * (delta_ij - probs_i)`` for every i (Lemma 1, eq. 5)."""
    return probs * grad_gates - probs * torch.dot(probs, grad_gates)


class _BinaryGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, alpha: torch.Tensor, chosen: int) -> torch.Tensor:
        probs = torch.softmax(alpha.detach(), dim=0)
        ctx.save_for_backward(probs)
        gates = torch.zeros_like(probs)
        gates[chosen] = 1.0
        return gates

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        (probs,) = ctx.saved_tensors
        return lemma1_gradient(probs, grads[0]), None


def binary_gates(alpha: torch.Tensor, active: tuple[int, ...],
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """One-hot gates over the paths ``active`` (drawn from softmax(alpha[active])), whose
    backward gives ``alpha[active]`` Lemma 1's gradient."""
    pair = alpha[list(active)]
    probs = torch.softmax(pair.detach(), dim=0)
    chosen = int(torch.multinomial(probs, 1, generator=generator))
    gates: torch.Tensor = _BinaryGate.apply(pair, chosen)
    return gates


def sample_path(alpha: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One path index drawn from softmax(alpha): the op a weight step trains."""
    return int(torch.multinomial(torch.softmax(alpha.detach(), 0), 1, generator=generator))


def sample_pair(alpha: torch.Tensor, generator: torch.Generator | None = None
                ) -> tuple[int, int]:
    """Two distinct path indices drawn from softmax(alpha) without replacement (a layer with
    one candidate gives that candidate twice; callers then run it ungated)."""
    if alpha.numel() == 1:
        return 0, 0
    first, second = torch.multinomial(torch.softmax(alpha.detach(), 0), 2, replacement=False,
                                      generator=generator).tolist()
    return int(first), int(second)
