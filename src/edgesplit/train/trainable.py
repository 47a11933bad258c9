"""Which model split training trains, named the same way on the device and on the server.

A spec reads ``name[:option,...]`` with the options ``pretrained`` (the backbone's ImageNet
weights from its package, a fresh classifier), ``classes=N`` and ``input=CxHxW`` (one sample,
no batch dimension), e.g. ``mobilenet_v2:pretrained,classes=10,input=3x32x32``. Both sides
build it with :meth:`TrainModelSpec.build` after ``torch.manual_seed(seed)``: every weight that
is not pretrained (all of them, or the fresh classifier) comes from the seed, so the two copies
are identical (the training ``Hello`` checks their fingerprint). ``digits_cnn`` is the
from-scratch model of the digits, as before: no options, samples [1, 32, 32], 10 classes.
Any other built-in whose chain :func:`~edgesplit.train.split.as_chain` can form is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from edgesplit.errors import ConfigError

__all__ = ["DIGITS_MODEL", "TrainModelSpec"]

DIGITS_MODEL = "digits_cnn"
_DIGITS_SAMPLE = (1, 32, 32)
_DIGITS_CLASSES = 10


@dataclass(frozen=True)
class TrainModelSpec:
    """A model to split-train: a built-in ``name``, whether its backbone is ``pretrained``, its
    number of ``classes`` (None: the model's own) and one input sample's ``input_shape``
    (None: the model's default)."""

    name: str
    pretrained: bool = False
    classes: int | None = None
    input_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a model spec needs a model name, e.g. digits_cnn or "
                              "mobilenet_v2:pretrained")
        if self.classes is not None and self.classes < 2:
            raise ConfigError(f"classes={self.classes}: a classifier needs at least 2 classes")
        if self.input_shape is not None and (not self.input_shape
                                             or any(d < 1 for d in self.input_shape)):
            raise ConfigError(f"input={self.input_shape}: give one sample's shape with "
                              "positive sizes, e.g. input=3x32x32")
        if self.name == DIGITS_MODEL and self.pretrained:
            raise ConfigError(f"{DIGITS_MODEL} is trained from scratch: it has no pretrained "
                              "weights (drop the pretrained option)")

    # ---- text form ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> TrainModelSpec:
        """``name[:pretrained,classes=N,input=CxHxW]`` (every option optional)."""
        name, _, options = text.strip().partition(":")
        fields: dict = {}
        for item in filter(None, (o.strip() for o in options.split(","))):
            key, eq, value = item.partition("=")
            try:
                if key == "pretrained" and not eq:
                    fields["pretrained"] = True
                elif key == "classes" and eq:
                    fields["classes"] = int(value)
                elif key == "input" and eq:
                    fields["input_shape"] = tuple(int(d) for d in value.split("x"))
                else:
                    raise ValueError(item)
            except ValueError:
                raise ConfigError(f"model {text!r}: cannot read option {item!r}; the options "
                                  "are pretrained, classes=N and input=CxHxW, e.g. "
                                  "mobilenet_v2:pretrained,classes=10,input=3x32x32") from None
        return cls(name.strip(), **fields)

    def __str__(self) -> str:
        options = (["pretrained"] if self.pretrained else []) \
            + ([f"classes={self.classes}"] if self.classes is not None else []) \
            + ([f"input={'x'.join(map(str, self.input_shape))}"] if self.input_shape else [])
        return self.name + (":" + ",".join(options) if options else "")

    # ---- what it takes -----------------------------------------------------------------------
    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One input sample's shape (no batch dimension)."""
        if self.input_shape is not None:
            return self.input_shape
        if self.name == DIGITS_MODEL:
            return _DIGITS_SAMPLE
        from edgesplit.models import get_model_spec

        return tuple(get_model_spec(self.name).input_shape[1:])

    def for_data(self, sample_shape: Sequence[int], classes: int, data: str) -> TrainModelSpec:
        """This model sized for data of ``sample_shape`` and ``classes`` (named ``data`` in
        messages): the input and class count come from the data; a model that cannot take them
        is refused in one line."""
        shape = tuple(int(d) for d in sample_shape)
        if self.name == DIGITS_MODEL:
            if shape != _DIGITS_SAMPLE or classes != _DIGITS_CLASSES:
                raise ConfigError(f"{DIGITS_MODEL} takes samples of shape "
                                  f"{list(_DIGITS_SAMPLE)} in {_DIGITS_CLASSES} classes; {data} "
                                  f"gives {list(shape)} in {classes} classes: use --data "
                                  "digits, or another --model")
            return self
        for given, wanted, what in ((self.classes, classes, "classes"),
                                    (self.input_shape, shape, "input")):
            if given is not None and given != wanted:
                raise ConfigError(f"model {self} has {what} {given}, but {data} gives "
                                  f"{wanted}: leave {what} out of the model spec")
        return replace(self, classes=classes, input_shape=shape)

    # ---- building ----------------------------------------------------------------------------
    def build(self, seed: int) -> nn.Module:
        """The model to train, built after ``torch.manual_seed(seed)`` (same spec and seed:
        identical weights); ``digits_cnn`` exactly as before (never cached trained weights)."""
        if self.name == DIGITS_MODEL:
            from edgesplit.models.digits import DigitsCNN

            torch.manual_seed(seed)
            return DigitsCNN()
        from edgesplit.models import get_model_spec, list_models, model_options

        if self.name not in list_models():
            raise ConfigError(f"model {self.name!r} is not a built-in model; split training "
                              f"takes {DIGITS_MODEL} or one of {', '.join(list_models())}")
        accepted = model_options(self.name)
        options: dict = {}
        for key, value, wanted in (("pretrained", self.pretrained, "pretrained"),
                                   ("num_classes", self.classes, "classes=N")):
            if value in (None, False):
                continue
            if key not in accepted:
                raise ConfigError(f"model {self.name} cannot be built with {wanted}; it takes "
                                  f"{', '.join(sorted(accepted)) or 'no options'}")
            options[key] = value
        torch.manual_seed(seed)
        model = get_model_spec(self.name).factory(**options)
        return model

