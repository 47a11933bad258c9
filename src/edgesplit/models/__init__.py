"""Built-in models: a registry in the style of timm (`register_model`, `create_model`,
`list_models`).

Each entry is a factory returning a :class:`BuiltinModel`: an ``nn.Module`` in eval mode with
random (or packaged) weights, and a function that makes example inputs for a given input shape.
Nothing here downloads anything.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from edgesplit.errors import ConfigError
from edgesplit.registry import Registry

F = TypeVar("F", bound=Callable[..., torch.nn.Module])

__all__ = [
    "BuiltinModel",
    "ModelSpec",
    "create_model",
    "get_model_spec",
    "image_inputs",
    "list_models",
    "model_options",
    "register_model",
    "token_inputs",
]


def image_inputs(shape: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """Deterministic float input of ``shape`` (N, C, H, W)."""
    if len(shape) != 4:
        raise ConfigError("image models take a 4-d input shape N,C,H,W; "
                          f"got {','.join(map(str, shape))}")
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(*shape, generator=gen),)


def token_inputs(shape: Sequence[int], vocab_size: int = 1000) -> tuple[torch.Tensor, ...]:
    """Deterministic int64 token ids of ``shape`` (batch, sequence length)."""
    if len(shape) != 2:
        raise ConfigError("token models take a 2-d input shape batch,seq_len; "
                          f"got {','.join(map(str, shape))}")
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab_size, tuple(shape), generator=gen),)


@dataclass(frozen=True)
class ModelSpec:
    """What the registry knows about a built-in model before building it."""

    name: str
    factory: Callable[..., torch.nn.Module]  # options of create_model are its keywords
    input_shape: tuple[int, ...]
    make_inputs: Callable[[Sequence[int]], tuple[torch.Tensor, ...]] = image_inputs
    family: str = "vision"
    source: str = "edgesplit"  # where the definition comes from: "transformers" or "edgesplit"
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class BuiltinModel:
    """A built model and the example inputs for the requested shape."""

    name: str
    module: torch.nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    spec: ModelSpec


_REGISTRY: Registry[ModelSpec] = Registry(
    "model", label="Built-in models",
    hint="(or your own code as my_net.py:MyNet with --input-shape, or a .pt2 file saved "
         "with torch.export.save).", loader=lambda: _ensure_loaded())


def register_model(
    name: str,
    *,
    input_shape: Sequence[int],
    make_inputs: Callable[[Sequence[int]], tuple[torch.Tensor, ...]] = image_inputs,
    family: str = "vision",
    source: str = "edgesplit",
    description: str = "",
) -> Callable[[F], F]:
    """Decorator registering a factory under ``name``: called with no arguments it builds the
    model as listed; its keyword parameters, if any, are the model's options."""

    def deco(factory: F) -> F:
        _REGISTRY.register(name, ModelSpec(
            name=name,
            factory=factory,
            input_shape=tuple(input_shape),
            make_inputs=make_inputs,
            family=family,
            source=source,
            description=description,
        ))
        return factory

    return deco


def _ensure_loaded() -> None:
    # Definitions register themselves on import; importing here keeps `import edgesplit` light.
    from edgesplit.models import (  # noqa: F401
        _causal_lm,
        _efficientnet_lite,
        _hf,
        _minilm,
        _vision,
        digits,
    )


def list_models() -> list[str]:
    """Names of all built-in models, sorted."""
    return _REGISTRY.names()


def get_model_spec(name: str) -> ModelSpec:
    """The registry entry for ``name``; an unknown name lists the close matches and all choices."""
    return _REGISTRY.get(name)


def create_model(name: str, input_shape: Sequence[int] | None = None,
                 **options: Any) -> BuiltinModel:
    """Build the model ``name`` in eval mode with deterministic weights and example inputs.

    ``options`` go to the model's factory, as timm's ``create_model`` passes them on (e.g.
    ``create_model("resnet18", num_classes=10)``); an option the factory does not take is a
    ConfigError listing the ones it does."""
    spec = get_model_spec(name)
    _check_options(spec, options)
    shape = tuple(input_shape) if input_shape is not None else spec.input_shape
    torch.manual_seed(0)
    module = spec.factory(**options).eval()
    return BuiltinModel(name=name, module=module, example_inputs=spec.make_inputs(shape), spec=spec)


def model_options(name: str) -> dict[str, Any]:
    """The options ``create_model(name, **options)`` accepts, with their defaults."""
    params = inspect.signature(get_model_spec(name).factory).parameters.values()
    return {p.name: p.default for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _check_options(spec: ModelSpec, options: dict[str, Any]) -> None:
    accepted = model_options(spec.name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = (f"it takes {', '.join(f'{k}={v!r}' for k, v in accepted.items())}"
                 if accepted else "it takes none")
        raise ConfigError(f"model {spec.name!r} has no option {', '.join(map(repr, unknown))}; "
                          f"{takes}")
