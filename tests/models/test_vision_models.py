"""The edgesplit-defined vision models: exact parameter counts, module paths and output shapes.

Reference counts are torchvision's published ones (torchvision is not a dependency), Darknet's
for YOLOv3-tiny and the paper's 19.4 M for the CIFAR-10 ResNet-1202.
"""

from __future__ import annotations

import pytest
import torch

from edgesplit.models import BuiltinModel, create_model

# name -> (exact parameter count, module paths that must exist, output shapes)
CASES: dict[str, tuple[int, tuple[str, ...], tuple[tuple[int, ...], ...]]] = {
    "alexnet": (61_100_840, ("features.0", "classifier.6"), ((1, 1000),)),
    "vgg16": (138_357_544, ("features.28", "classifier.6"), ((1, 1000),)),
    "googlenet": (
        6_624_904,
        ("inception3a.branch1.conv", "inception5b.branch4.1.bn", "fc"),
        ((1, 1000),),
    ),
    "mnasnet": (4_383_312, ("layers.0", "layers.8.0.layers.3", "classifier.1"), ((1, 1000),)),
    "resnext50": (25_028_904, ("layer4.0.conv3", "layer4.0.downsample.0", "fc"), ((1, 1000),)),
    # Darknet/Keras quote 8,858,734 because they count BN running mean/var; checked below.
    "yolov3_tiny": (
        8_852_366,
        ("backbone.0.conv", "backbone.11.1", "head13", "head26"),
        ((1, 255, 13, 13), (1, 255, 26, 26)),
    ),
    "resnet1202": (
        19_421_274,
        ("conv1", "bn1", "layer1.0.conv1", "layer3.199.bn2", "layer2.0.shortcut", "linear"),
        ((1, 10),),
    ),
}


@pytest.fixture(scope="module")
def built() -> dict[str, BuiltinModel]:
    # Built once per module: vgg16 and resnet1202 take a second or two each to construct.
    return {}


def _get(built: dict[str, BuiltinModel], name: str) -> BuiltinModel:
    if name not in built:
        built[name] = create_model(name)
    return built[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_parameter_count(built: dict[str, BuiltinModel], name: str) -> None:
    expected, _, _ = CASES[name]
    module = _get(built, name).module
    assert sum(p.numel() for p in module.parameters()) == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_module_paths_match_reference_names(built: dict[str, BuiltinModel], name: str) -> None:
    _, paths, _ = CASES[name]
    names = dict(_get(built, name).module.named_modules())
    missing = [p for p in paths if p not in names]
    assert not missing, f"{name} lacks {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_shapes(built: dict[str, BuiltinModel], name: str) -> None:
    _, _, shapes = CASES[name]
    model = _get(built, name)
    with torch.no_grad():
        out = model.module(*model.example_inputs)
    outs = out if isinstance(out, tuple) else (out,)
    assert tuple(tuple(o.shape) for o in outs) == shapes
    assert all(torch.isfinite(o).all() for o in outs)


def test_yolov3_tiny_count_with_bn_stats_matches_darknet(built: dict[str, BuiltinModel]) -> None:
    module = _get(built, "yolov3_tiny").module
    stats = sum(
        b.numel()
        for n, b in module.named_buffers()
        if n.endswith(("running_mean", "running_var"))
    )
    assert sum(p.numel() for p in module.parameters()) + stats == 8_858_734


def test_resnet1202_depth(built: dict[str, BuiltinModel]) -> None:
    module = _get(built, "resnet1202").module
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    linears = sum(isinstance(m, torch.nn.Linear) for m in module.modules())
    assert convs + linears == 1202  # 6n+2 weighted layers with n=200; shortcuts have no weights
