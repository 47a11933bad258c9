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

import copy
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.errors import ConfigError, EdgesplitError

__all__ = [
    "analyse_chain_privacy",
    "analyse_privacy",
    "graph_split_for_chain",
    "kl_per_cut",
    "privacy_point",
    "render_like_input",
]


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
    """P^c: the number of chain elements that must stay on the device so that *every* cut in
    the domain {P^c, ..., P} has KL divergence >= ``threshold``. (Divergence is not monotone
    in the depth on real models, e.g. a stride-2 convolution can reveal more than the stem
    before it; the paper's domain assumes every later cut is at least as private.)"""
    point = len(divergences)
    for i in range(len(divergences) - 1, -1, -1):
        if divergences[i] < threshold:
            break
        point = i
    if point == len(divergences):
        raise ConfigError(f"no cut reaches a KL divergence of {threshold} with every later cut "
                          f"as well (the last is {divergences[-1]:.3g}); lower the threshold or "
                          "train on the device")
    return point + 1


def graph_split_for_chain(graph, model: nn.Module, chain_elements: int) -> int:
    """How many layers of ``graph`` (captured from ``model``) the first ``chain_elements``
    elements of the model's chain cover: the privacy split in the graph's terms."""
    from edgesplit.train.split import as_chain

    # the module paths of everything the elements call (a traced element may call several
    # children, or the grandchildren of a wrapper), as capture names them
    paths = {id(m): name for name, m in model.named_modules() if name}
    strip = getattr(model, "edgesplit_strip_prefix", "")
    held = {paths[id(s)].removeprefix(strip) for c in as_chain(model)[:chain_elements]
            for s in c.modules() if id(s) in paths}
    covered = [layer.index for layer in graph.layers
               if any(_within(layer.module_path, path) for path in held)]
    return max(covered) + 1 if covered else 0


def _within(module_path: str, path: str) -> bool:
    return module_path == path or module_path.startswith(path + ".")


def analyse_chain_privacy(chain: Sequence[nn.Module], reference: nn.Module, x: torch.Tensor,
                          threshold: float) -> dict:
    """The KL analysis of any model's ``chain`` on samples ``x`` (N, C, H, W) of the data it
    trains on, ``reference`` being the pre-trained classifier that judges the rendered IRs
    (e.g. the model's own ImageNet classifier, for a model fine-tuned from it): divergence
    per chain cut and P^c in chain elements (at most all of them: training on the device,
    which sends nothing, is always allowed)."""
    layers = [m.eval() for m in copy.deepcopy(list(chain))]  # no batch-norm statistic moves
    kl = kl_per_cut(layers, reference, x)
    # the last cut sends nothing (training on the device), so it never limits the domain
    point = privacy_point([*kl[:-1], math.inf], threshold)
    return {"kl_per_cut": kl, "threshold": threshold, "chain_point": point,
            "samples": len(x)}


def analyse_privacy(model_name: str, threshold: float, graph=None, samples: int = 200) -> dict:
    """The KL analysis of a built-in pre-trained model on its built-in data: divergence per
    chain cut, P^c in chain elements and (given its ``graph``) in graph layers."""
    from edgesplit.data import load_dataset
    from edgesplit.models import create_model
    from edgesplit.train.split import as_chain

    built = create_model(model_name)
    try:
        data = load_dataset(model_name.removesuffix("_cnn"))
    except EdgesplitError as exc:  # no built-in data for this model
        raise ConfigError(f"the KL privacy analysis needs a pre-trained model with built-in data "
                          f"(digits_cnn); for {model_name!r} pass --privacy-split") from exc
    chain = as_chain(built.module)
    kl = kl_per_cut(chain, built.module, data.inputs[0][:samples])
    point = privacy_point(kl, threshold)
    out = {"kl_per_cut": kl, "threshold": threshold, "chain_point": point,
           "samples": min(samples, len(data))}
    if graph is not None:
        out["privacy_split"] = graph_split_for_chain(graph, built.module, point)
    return out
