"""AdaptiveNet elastification, training and checkpoints (paper 003, section 4)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from torch import nn

from edgesplit.errors import ConfigError, GraphError
from edgesplit.graph import capture
from edgesplit.nas.adaptivenet import (
    ElasticConfig,
    ElasticSpace,
    channel_groups,
    elastify,
    find_blocks,
)
from edgesplit.nas.adaptivenet.checkpoint import (
    SUPERNET_FILE,
    build_supernet,
    load_supernet,
    save_supernet,
)
from edgesplit.nas.adaptivenet.data import TensorPart, batches, load_elastic_data
from edgesplit.nas.adaptivenet.train import (
    ElasticTrainer,
    latency_range_accuracy,
    subnet_accuracy,
)

MODELS = {
    "digits_cnn": None,
    "resnet18": (1, 3, 32, 32),
    "mobilenet_v2": (1, 3, 32, 32),
    "all_minilm_l6_v2": None,
}


@pytest.fixture(scope="module")
def digits_graph():
    return capture("digits_cnn")


@pytest.fixture(scope="module")
def digits_supernet():
    return build_supernet("digits_cnn")


def _reference(graph, inputs):
    out = graph.program(*inputs)
    return out[0] if isinstance(out, (tuple, list)) else out


def _batch_of(graph, size=3):
    """``size`` different samples of the graph's input kind."""
    ex = graph.example_inputs
    gen = torch.Generator().manual_seed(5)
    if ex[0].is_floating_point():
        return (torch.randn(size, *ex[0].shape[1:], generator=gen),)
    from edgesplit.data.sentences import load_sentences

    return tuple(x[:size] for x in load_sentences().inputs)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_subnet_runs_and_the_original_path_is_the_model(name):
    graph = capture(name, input_shape=MODELS[name])
    supernet = elastify(graph)
    space = supernet.space
    assert {b.kind for b in space.branches} == {"original", "merged", "shrunk"}
    inputs = _batch_of(graph)
    with torch.no_grad():
        original = supernet(*inputs)
        expected = torch.cat([_reference(graph, tuple(x[i:i + 1] for x in inputs))
                              for i in range(inputs[0].shape[0])])
        assert torch.allclose(original, expected, rtol=1e-4, atol=1e-5)
        rng = np.random.default_rng(0)
        for _ in range(12):
            arch = space.random_arch(rng)
            out = supernet(*inputs, arch=arch)
            assert out.shape == original.shape and torch.isfinite(out).all()


def test_blocks_chain_from_input_to_output(digits_graph):
    split = find_blocks(digits_graph)
    blocks = split.blocks
    assert blocks[0].input == digits_graph.inputs[0]
    assert blocks[-1].output == digits_graph.outputs[0]
    for before, after in itertools.pairwise(blocks):
        assert before.output == after.input and before.out_shape == after.in_shape
    covered = [name for b in blocks for name in b.layers]
    assert covered == [layer.name for layer in digits_graph.layers]
    assert sum(b.params for b in blocks) == digits_graph.total_params
    # a residual block is never cut inside: its two branches join in one block
    assert any(any(n.endswith(".add") for n in b.layers) and len(b.layers) == 3 for b in blocks)


def test_gamma_bounds_blocks_where_cuts_allow(digits_graph):
    coarse = find_blocks(digits_graph, gamma=1.0)
    fine = find_blocks(digits_graph, gamma=0.05, min_fraction=0.0)
    assert len(fine.blocks) >= len(coarse.blocks)
    limit = 0.05 * digits_graph.total_params
    for block in fine.blocks:
        assert block.params <= limit or len(block.layers) <= 3  # an uncuttable block


def test_transformer_blocks_read_the_mask_as_a_side_input():
    graph = capture("all_minilm_l6_v2")
    split = find_blocks(graph)
    assert split.side_layers  # the attention mask's layers run once, beside the blocks
    assert len(split.blocks) >= 12  # attention and feed-forward halves of six layers


def test_shrunk_branches_keep_shapes_and_cost_less(digits_supernet):
    macs = digits_supernet.meta["branch_macs"]
    shrunk = [b for b in digits_supernet.space.branches if b.kind == "shrunk"]
    assert shrunk
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        side = digits_supernet.side_tensors(x)
        feats = [x]
        for name in digits_supernet.space.original:
            feats.append(digits_supernet.branch(name)(feats[-1], side))
        for b in shrunk:
            out = digits_supernet.branch(b.name)(feats[b.start], side)
            assert out.shape == feats[b.end].shape
            assert macs[b.name] < macs[f"b{b.start}"]
            assert digits_supernet.branch(b.name).num_params < \
                digits_supernet.branch(f"b{b.start}").num_params


def test_merged_branch_replaces_blocks_with_matching_shapes(digits_supernet):
    merged = [b for b in digits_supernet.space.branches if b.kind == "merged"]
    blocks = digits_supernet.meta["blocks"]
    assert merged
    for b in merged:
        assert b.end - b.start == b.level + 1
        assert blocks[b.donor]["in_shape"] == blocks[b.start]["in_shape"]
        assert blocks[b.donor]["out_shape"] == blocks[b.end - 1]["out_shape"]


def test_channel_groups_of_a_residual_block(digits_supernet):
    # conv1 -> relu -> conv2 inside the residual block; conv2 feeds the add: one group
    groups = channel_groups(digits_supernet.branch("b1").gm)
    assert len(groups) == 1 and groups[0].channels == 32


def test_space_paths_and_errors(digits_supernet):
    space = digits_supernet.space
    rng = np.random.default_rng(1)
    drawn = {space.random_arch(rng) for _ in range(400)}
    assert all(space.check(a) == a for a in drawn)
    assert len(drawn) <= space.count()
    assert ElasticSpace.from_dict(json.loads(json.dumps(space.to_dict()))) == space
    with pytest.raises(ConfigError, match="unknown branch"):
        space.check(("b0", "nope"))
    with pytest.raises(ConfigError, match="stops at block"):
        space.check(("b0",))
    with pytest.raises(ConfigError, match="starts at block"):
        space.check(("b1",))


def test_config_is_checked():
    with pytest.raises(ConfigError, match="shrink"):
        ElasticConfig(shrink=(0.25, 0.5))
    with pytest.raises(ConfigError, match="merge"):
        ElasticConfig(merge=-1)
    with pytest.raises(ConfigError, match="gamma"):
        ElasticConfig(gamma=0.0)


def test_models_with_several_outputs_are_refused():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            y = self.a(x)
            return y, self.b(y)

    with pytest.raises(GraphError, match="one output"):
        elastify(capture(Two(), torch.randn(1, 4)))


def test_training_changes_only_added_branches_and_helps(digits_supernet):
    supernet = build_supernet("digits_cnn")
    data = load_elastic_data("digits", input_shape=(1, 1, 32, 32), teacher=supernet)
    assert data.task == "labels"
    frozen = {k: v.clone() for k, v in supernet.named_buffers()}
    x = data.search.example(8)[0]
    with torch.no_grad():
        before = supernet(x)
    indicator_before = latency_range_accuracy(supernet, data, samples=12, ranges=2)
    trainer = ElasticTrainer(distill_epochs=3, tune_epochs=2).fit(supernet, data)
    distill = [r.loss for r in trainer.history_ if r.phase == "distill"]
    assert len(distill) == 3 and distill[-1] < distill[0]
    with torch.no_grad():
        assert torch.equal(supernet(x), before)  # the pretrained path never changes
    assert all(torch.equal(v, frozen[k]) for k, v in supernet.named_buffers())
    after = latency_range_accuracy(supernet, data, samples=12, ranges=2)
    mean = lambda rows: np.mean([r["accuracy"] for r in rows])  # noqa: E731
    assert mean(after) > mean(indicator_before)


def test_checkpoint_round_trip(tmp_path, digits_supernet):
    supernet = build_supernet("digits_cnn", config=ElasticConfig(merge=1, shrink=(0.5,)))
    with torch.no_grad():
        for p in supernet.parameters():
            p.add_(0.01)
    save_supernet(tmp_path / "s", supernet, {"epochs": 1})
    loaded, doc = load_supernet(tmp_path / "s")
    assert doc["training"] == {"epochs": 1} and loaded.space == supernet.space
    x = torch.randn(3, 1, 32, 32)
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for _ in range(6):
            arch = supernet.space.random_arch(rng)
            assert torch.equal(loaded(x, arch=arch), supernet(x, arch=arch))


def test_checkpoint_errors(tmp_path, digits_supernet):
    with pytest.raises(ConfigError, match="holds no elastified supernet"):
        load_supernet(tmp_path)
    save_supernet(tmp_path / "s", digits_supernet)
    doc = json.loads((tmp_path / "s" / SUPERNET_FILE).read_text())
    (tmp_path / "s" / SUPERNET_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="not readable JSON"):
        load_supernet(tmp_path / "s")
    doc["format"] = "something/9"
    (tmp_path / "s" / SUPERNET_FILE).write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="format"):
        load_supernet(tmp_path / "s")
    doc["format"] = "edgesplit.nas.adaptivenet.supernet/1"
    (tmp_path / "s" / SUPERNET_FILE).write_text(json.dumps(doc))
    (tmp_path / "s" / "supernet.safetensors").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="safetensors"):
        load_supernet(tmp_path / "s")


def test_checkpoint_refuses_a_changed_model_file(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                          nn.Linear(8, 4))
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model.eval(), (torch.randn(1, 8),)), str(path))
    supernet = build_supernet(str(path))
    save_supernet(tmp_path / "s", supernet)
    other = nn.Sequential(nn.Linear(8, 4))
    torch.export.save(torch.export.export(other.eval(), (torch.randn(1, 8),)), str(path))
    with pytest.raises(ConfigError, match="changed since"):
        load_supernet(tmp_path / "s")


def test_subnet_accuracy_of_the_original_equals_the_model(digits_supernet):
    data = load_elastic_data("digits", input_shape=(1, 1, 32, 32), teacher=digits_supernet)
    parts = batches(data.test, 64)
    assert isinstance(data.test, TensorPart)
    with torch.no_grad():
        logits = torch.cat([digits_supernet.subnet(digits_supernet.space.original)(*i)
                            for i, _ in parts])
    expected = float((logits.argmax(1) == data.test.targets).float().mean())
    got = subnet_accuracy(digits_supernet, digits_supernet.space.original, parts, data.metric)
    assert got == pytest.approx(expected)


@pytest.fixture(scope="module")
def slow_edge():
    from edgesplit.hardware.catalog import resolve_device, resolve_link
    from edgesplit.plan.cost import EdgeCloudSetting

    return EdgeCloudSetting(edge=resolve_device("raspberry-pi-4"),
                            cloud=resolve_device("v100-server"), link=resolve_link("5g"))


def test_joint_latency_equals_the_plan_at_every_cut(digits_supernet, slow_edge):
    from edgesplit.nas.adaptivenet.placement import JointLatency, plan_subnet

    example = (torch.randn(1, 1, 32, 32),)
    joint = JointLatency(digits_supernet, slow_edge, example)
    rng = np.random.default_rng(3)
    for _ in range(3):
        arch = digits_supernet.space.random_arch(rng)
        totals = []
        for k in range(len(arch) + 1):
            _, plan = plan_subnet(digits_supernet, arch, slow_edge, example, edge_blocks=k)
            assert joint.at(arch, k).total_ms == pytest.approx(plan.predicted.total_ms,
                                                               rel=1e-9)
            totals.append(plan.predicted.total_ms)
        best = joint.split(arch)
        assert best.total_ms == pytest.approx(min(totals), rel=1e-9)
        assert joint.predict(arch) == pytest.approx(best.total_ms / 1000)


def test_joint_latency_of_a_transformer_is_close_to_its_plan(slow_edge):
    from edgesplit.models._minilm import sentence_inputs
    from edgesplit.nas.adaptivenet.placement import JointLatency, plan_subnet

    supernet = build_supernet("all_minilm_l6_v2", config=ElasticConfig(merge=1, shrink=()))
    example = sentence_inputs((1, 32))
    joint = JointLatency(supernet, slow_edge, example)
    arch = supernet.space.random_arch(np.random.default_rng(0))
    for k in (0, 3, len(arch)):
        _, plan = plan_subnet(supernet, arch, slow_edge, example, edge_blocks=k)
        # side layers fuse into their neighbours inside a whole subnet: a few per cent
        assert joint.at(arch, k).total_ms == pytest.approx(plan.predicted.total_ms, rel=0.03)
