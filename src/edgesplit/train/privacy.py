"""L2S's privacy analysis (Section III-C, Fig. 4): how much of the input an intermediate result
still gives away, as the KL divergence between a pre-trained model's outputs on the raw input
and on what the intermediate result shows.

For each cut of the model's chain, the intermediate result (IR) is rendered back into the
input's form, as the paper does to feed IRs to a pre-trained DNN: its channels are averaged
into one map, resized to the input's height and width, given the input's channel count and
scaled to the input's mean and spread. The pre-trained model classifies it, and KL(p_x || p_IR)
is averaged over the samples. A larger divergence means the IR reveals less: the privacy point
P^c is the first cut whose divergence reaches the user's threshold.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError

__all__ = ["render_like_input", "kl_per_cut", "privacy_point"]


def render_like_input(ir: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """An IR (N, C, H, W) or (N, F) as a tensor shaped and scaled like the input ``like``."""
    n = ir.shape[0]
    if ir.dim() == 4:
        image = ir.mean(dim=1, keepdim=True)
    else:  # a vector: lay it out as a square map
        flat = ir.reshape(n, -1)
        side = max(1, int(flat.shape[1] ** 0.5))
        image = flat[:, : side * side].reshape(n, 1, side, side)
    image = F.interpolate(image, size=tuple(like.shape[2:]), mode="bilinear",
                          align_corners=False)
    image = image.expand(n, like.shape[1], *like.shape[2:])
    mean = image.mean(dim=(1, 2, 3), keepdim=True)
    std = image.std(dim=(1, 2, 3), keepdim=True).clamp_min(1e-8)
    target_mean = like.mean(dim=(1, 2, 3), keepdim=True)
    target_std = like.std(dim=(1, 2, 3), keepdim=True)
    return (image - mean) / std * target_std + target_mean


def kl_per_cut(chain: Sequence[nn.Module], reference: nn.Module, x: torch.Tensor
               ) -> list[float]:
    """KL(p(x) || p(render(IR_i))) for the IR after every chain element i (the last is the
    model's output, also rendered), averaged over the samples of ``x`` (N, C, H, W)."""
    if x.dim() != 4:
        raise ConfigError("the privacy analysis renders IRs as images: it needs image inputs "
                          "(N, C, H, W)")
    with torch.no_grad():
        log_p = F.log_softmax(reference(x), dim=1)
        out, values = x, []
        for module in chain:
            out = module(out)
            log_q = F.log_softmax(reference(render_like_input(out, x)), dim=1)
            kl = (log_p.exp() * (log_p - log_q)).sum(dim=1).mean()
            values.append(float(kl))
    return values


def privacy_point(divergences: Sequence[float], threshold: float) -> int:
    """P^c: the number of chain elements that must stay on the device so that the first IR
    sent has KL divergence >= ``threshold`` (cuts after it are allowed too)."""
    for i, value in enumerate(divergences):
        if value >= threshold:
            return i + 1
    raise ConfigError(f"no cut reaches a KL divergence of {threshold}: the largest is "
                      f"{max(divergences):.3g}; lower the threshold or train on the device")
