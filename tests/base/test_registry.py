import warnings

import pytest

from edgesplit.errors import ConfigError, UnknownNameError
from edgesplit.registry import Registry


def test_register_by_call_and_decorator():
    reg: Registry[object] = Registry("model")
    reg.register("a", 1)

    @reg.register("f")
    def f():
        return 2

    assert reg.get("a") == 1 and reg.get("f") is f
    assert reg.names() == ["a", "f"] and "a" in reg and "zz" not in reg and len(reg) == 2


def test_unknown_name_suggests_and_lists():
    reg: Registry[int] = Registry("model", label="Built-in models", hint="(or pass a file).")
    reg.register("resnet18", 1)
    reg.register("vgg16", 2)
    with pytest.raises(UnknownNameError) as info:
        reg.get("resnt18")
    assert str(info.value) == ("unknown model 'resnt18'. Did you mean resnet18? "
                               "Built-in models: resnet18, vgg16 (or pass a file).")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, KeyError)


def test_unknown_name_without_close_match():
    reg: Registry[int] = Registry("planner")
    reg.register("dp", 1)
    assert str(reg.unknown("zzzzz")) == "unknown planner 'zzzzz'. Known planners: dp"


def test_duplicate_warns_unless_replace():
    reg: Registry[int] = Registry("device")
    reg.register("x", 1)
    with pytest.warns(UserWarning, match="device 'x' registered twice"):
        reg.register("x", 2)
    assert reg.get("x") == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.register("x", 3, replace=True)
    assert reg.get("x") == 3


def test_loader_runs_once_on_first_lookup():
    calls = []
    reg: Registry[int] = Registry("link", loader=lambda: (calls.append(1), reg.register("l", 5),
                                                          reg.names()))
    assert calls == []
    assert reg.get("l") == 5 and "l" in reg and reg.names() == ["l"]
    assert calls == [1]


def test_create_model_passes_options_to_the_factory():
    from edgesplit.models import create_model, model_options

    assert model_options("resnet18") == {"num_classes": 1000}
    built = create_model("resnet18", (1, 3, 64, 64), num_classes=7)
    assert built.module(*built.example_inputs).shape == (1, 7)
    with pytest.raises(ConfigError, match=r"no option 'num_class'; it takes num_classes=1000"):
        create_model("resnet18", num_class=7)
    with pytest.raises(ConfigError, match=r"'digits_cnn' has no option 'width'; it takes none"):
        create_model("digits_cnn", width=2)


def test_estimator_for_follows_the_compute_model_registry():
    from edgesplit.hardware import (
        ESTIMATORS,
        RooflineEstimator,
        estimator_for,
        get_device,
        register_estimator,
    )

    assert {"analytical", "measured"} <= set(ESTIMATORS.names())
    assert isinstance(estimator_for(get_device("jetson-nano")), RooflineEstimator)

    class Doubled(RooflineEstimator):
        pass

    original = ESTIMATORS.get("analytical")
    try:
        register_estimator("analytical", lambda device: Doubled(), replace=True)
        assert isinstance(estimator_for(get_device("jetson-nano")), Doubled)
    finally:
        register_estimator("analytical", original, replace=True)
