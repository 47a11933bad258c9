"""L2S's privacy analysis: KL divergence of a pre-trained model's outputs on the input and on
what each cut's intermediate result shows (real digits, the trained digits_cnn)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgesplit.data import load_dataset
from edgesplit.errors import ConfigError
from edgesplit.models import create_model
from edgesplit.train.privacy import kl_per_cut, privacy_point, render_like_input
from edgesplit.train.split import as_chain


@pytest.fixture(scope="module")
def digits():
    return create_model("digits_cnn").module, load_dataset("digits").inputs[0][:200]


def test_the_input_itself_reveals_everything(digits):
    model, x = digits
    rendered = render_like_input(x, x)
    with torch.no_grad():
        p, q = F.log_softmax(model(x), 1), F.log_softmax(model(rendered), 1)
    assert float((p.exp() * (p - q)).sum(1).mean()) < 1e-6


def test_later_cuts_reveal_less(digits):
    model, x = digits
    kl = kl_per_cut(as_chain(model), model, x)
    assert len(kl) == len(as_chain(model)) and all(v >= 0 for v in kl)
    assert sum(kl[-3:]) / 3 > sum(kl[:2]) / 2  # the paper's Fig. 4(b) trend


def test_privacy_point_is_the_first_cut_over_the_threshold():
    assert privacy_point([0.1, 0.5, 2.0, 2.5, 3.0], 1.5) == 3
    # every cut of the domain must be private enough: a dip after a private cut moves P^c on
    assert privacy_point([0.1, 0.5, 2.0, 1.0, 3.0], 1.5) == 5
    with pytest.raises(ConfigError, match="lower the threshold"):
        privacy_point([0.1, 0.2], 5.0)


def test_non_image_inputs_are_refused(digits):
    model, _ = digits
    with pytest.raises(ConfigError, match="image"):
        kl_per_cut(as_chain(model), model, torch.zeros(4, 10))


def test_privacy_analysis_maps_the_chain_point_onto_the_captured_graph():
    from edgesplit.graph import capture
    from edgesplit.train.privacy import analyse_privacy

    graph = capture("digits_cnn", optimize=False)
    doc = analyse_privacy("digits_cnn", 1.0, graph, samples=100)
    kl, point = doc["kl_per_cut"], doc["chain_point"]
    assert all(v >= 1.0 for v in kl[point - 1:]) and kl[point - 2] < 1.0
    # the graph layers of the first `point` chain elements, and not one more
    names = {layer.module_path.split(".")[0] for layer in graph.layers[:doc["privacy_split"]]}
    chain_names = ["stem", "down1", "block1", "down2", "block2", "reduce", "expand", "pool"]
    assert names == set(chain_names[:point])
    with pytest.raises(ConfigError, match="--privacy-split"):
        analyse_privacy("alexnet", 1.0)
