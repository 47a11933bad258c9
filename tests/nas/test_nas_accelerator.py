"""``--torch-device`` on the trainers (issue 39, accelerators): AdaptiveNet's ElasticTrainer,
SplitNets' SupernetTrainer and JMSNAS. On the CPU the device changes nothing (bit-identical to
the default); a device this machine lacks is refused before any weight moves, and in one line
by the CLI; on a machine with CUDA (skipped elsewhere) each trainer computes on the GPU, gives
the CPU's losses within tolerance and hands its weights back on the CPU, so a checkpoint
written after training loads on a machine without CUDA.

Tolerances on the GPU: convolutions run in TF32 by default and a few hundred steps compound
rounding, so losses are compared to about 1e-2 relative, not bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.data import EvalData
from edgesplit.data.training import LabelledData, load_labelled
from edgesplit.hardware import get_topology
from edgesplit.hardware.accelerator import AcceleratorError
from edgesplit.nas.adaptivenet.checkpoint import build_supernet
from edgesplit.nas.adaptivenet.data import load_elastic_data
from edgesplit.nas.adaptivenet.train import ElasticTrainer
from edgesplit.nas.jmsnas import get_space
from edgesplit.nas.jmsnas.chain_latency import ChainLatency
from edgesplit.nas.jmsnas.search import JMSNAS
from edgesplit.nas.splitnets.space import PhaseSpec, SplitSpace
from edgesplit.nas.splitnets.supernet import SplitSupernet
from edgesplit.nas.splitnets.train import SupernetTrainer

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
no_cuda = pytest.mark.skipif(CUDA, reason="this machine has CUDA")

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest

ABSENT = "cuda:64"  # no machine this runs on has 65 GPUs


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _devices(module: torch.nn.Module) -> set[str]:
    return {t.device.type for t in (*module.parameters(), *module.buffers())}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- AdaptiveNet --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def elastic():
    supernet = build_supernet("digits_cnn")
    data = load_elastic_data("digits", input_shape=(1, 1, 32, 32), teacher=supernet,
                             train_limit=96)
    return supernet, data


def _elastic_fit(elastic, device):
    supernet, data = copy.deepcopy(elastic[0]), elastic[1]
    trainer = ElasticTrainer(distill_epochs=1, tune_epochs=1, batch_size=32,
                             torch_device=device).fit(supernet, data)
    return supernet, [r.loss for r in trainer.history_]


def test_elastic_training_on_the_cpu_device_is_the_default(elastic):
    default, losses = _elastic_fit(elastic, None)
    on_cpu, cpu_losses = _elastic_fit(elastic, "cpu")
    assert losses == cpu_losses
    assert _equal(_state(default), _state(on_cpu))


def test_elastic_training_refuses_a_missing_device_before_moving_anything(elastic):
    supernet = copy.deepcopy(elastic[0])
    before = _state(supernet)
    with pytest.raises(AcceleratorError, match="--torch-device cuda:64"):
        ElasticTrainer(distill_epochs=1, tune_epochs=0, torch_device=ABSENT).fit(supernet,
                                                                                   elastic[1])
    assert _equal(before, _state(supernet)) and _devices(supernet) == {"cpu"}


@needs_cuda
def test_elastic_training_on_the_gpu_gives_the_cpu_losses_and_cpu_weights(elastic):
    on_cpu, cpu_losses = _elastic_fit(elastic, "cpu")
    on_gpu, gpu_losses = _elastic_fit(elastic, "cuda")
    assert _devices(on_gpu) == {"cpu"}  # saved as is, it loads without CUDA
    assert gpu_losses == pytest.approx(cpu_losses, rel=1e-2)
    x = elastic[1].search.example(8)[0]
    with torch.no_grad():
        torch.testing.assert_close(on_gpu(x), on_gpu.cpu()(x))
        assert torch.equal(on_gpu(x), on_cpu(x))  # the pretrained path is frozen


# ---- SplitNets ----------------------------------------------------------------------------------
TINY = SplitSpace("tiny-split", 1, 5, (8, 12), (4, 6),
                  (PhaseSpec((6, 8), (1, 3), (1, 2), (0, 1), (2, 3)),
                   PhaseSpec((10, 12), (3, 4), (1, 2), (1, 2), (2, 4))), (16, 24))


def _split_data(n: int = 24) -> EvalData:
    x = torch.randn(n, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    return EvalData("toy", (x,), torch.arange(n) % TINY.num_classes, "random")


def _split_fit(device):
    torch.manual_seed(0)
    net = SplitSupernet(TINY)
    trainer = SupernetTrainer(epochs=2, batch_size=8, torch_device=device).fit(net,
                                                                               _split_data())
    return net, trainer.history_


def test_split_supernet_training_on_the_cpu_device_is_the_default():
    default, history = _split_fit(None)
    on_cpu, cpu_history = _split_fit("cpu")
    assert history == cpu_history
    assert _equal(_state(default), _state(on_cpu))


def test_split_supernet_training_refuses_a_missing_device_before_moving_anything():
    net = SplitSupernet(TINY)
    before = _state(net)
    with pytest.raises(AcceleratorError, match="--torch-device cuda:64"):
        SupernetTrainer(epochs=1, torch_device=ABSENT).fit(net, _split_data())
    assert _equal(before, _state(net)) and _devices(net) == {"cpu"}


@needs_cuda
def test_split_supernet_training_on_the_gpu_gives_the_cpu_losses_and_cpu_weights():
    _, cpu_history = _split_fit("cpu")
    on_gpu, gpu_history = _split_fit("cuda")
    assert _devices(on_gpu) == {"cpu"}
    for cpu_row, gpu_row in zip(cpu_history, gpu_history, strict=True):
        assert gpu_row == pytest.approx(cpu_row, rel=1e-2)


# ---- JMSNAS -------------------------------------------------------------------------------------
SPACE = get_space("digits-mbconv")


class _MacTable:
    """Latency proportional to MACs (a stand-in for a measured table)."""

    def __init__(self, gmacs_per_ms: float) -> None:
        self.gmacs_per_ms, self.stem_ms, self.head_ms = gmacs_per_ms, 0.05, 0.05

    def layer_vector(self, i: int) -> list[float]:
        h, w = SPACE.in_size(i)
        layer = SPACE.layers[i]
        return [op.macs(SPACE.in_channels(i), layer.out_channels, layer.stride, h, w)
                / (self.gmacs_per_ms * 1e6) for op in layer.ops]


@pytest.fixture(scope="module")
def jmsnas_setup():
    topology = get_topology("jmsnas-chain")
    tables = {d: _MacTable(g) for d, g in zip(topology.chain_order(), (5, 20, 100, 1000),
                                              strict=True)}
    latency = ChainLatency.best_placement(SPACE, topology, tables)
    uniform = [torch.full((len(l.ops),), 1 / len(l.ops)) for l in SPACE.layers]
    data = load_labelled("digits")
    small = LabelledData("digits", data.train.subset(slice(0, 96)),
                         data.test.subset(slice(0, 48)), data.classes)
    return small, latency, 0.8 * float(latency(uniform))


def _jmsnas(setup, device):
    data, latency, budget = setup
    return JMSNAS(latency_budget_ms=budget, warmup_epochs=1, epochs=1, retrain_epochs=1,
                  batch_size=32, torch_device=device).fit(data, SPACE, latency).retrain()


def _jmsnas_losses(search: JMSNAS) -> list[float | None]:
    return [x for h in search.history_ for x in (h.weight_loss, h.arch_loss)] + \
        list(search.retrain_losses_)


def test_jmsnas_on_the_cpu_device_is_the_default(jmsnas_setup):
    default, on_cpu = _jmsnas(jmsnas_setup, None), _jmsnas(jmsnas_setup, "cpu")
    assert [h.to_dict() for h in default.history_] == [h.to_dict() for h in on_cpu.history_]
    assert default.retrain_losses_ == on_cpu.retrain_losses_
    assert default.accuracy_ == on_cpu.accuracy_
    assert _equal(_state(default.model_), _state(on_cpu.model_))
    assert all(torch.equal(a, b) for a, b in zip(default.alpha_, on_cpu.alpha_, strict=True))


def test_jmsnas_refuses_a_missing_device_before_training(jmsnas_setup):
    data, latency, budget = jmsnas_setup
    search = JMSNAS(latency_budget_ms=budget, torch_device=ABSENT)
    with pytest.raises(AcceleratorError, match="--torch-device cuda:64"):
        search.fit(data, SPACE, latency)
    assert not hasattr(search, "supernet_")


@needs_cuda
def test_jmsnas_on_the_gpu_gives_the_cpu_losses_and_cpu_weights(jmsnas_setup):
    on_cpu, on_gpu = _jmsnas(jmsnas_setup, "cpu"), _jmsnas(jmsnas_setup, "cuda")
    assert _devices(on_gpu.model_) == _devices(on_gpu.supernet_) == {"cpu"}
    assert [a.device.type for a in on_gpu.alpha_] == ["cpu"] * len(on_gpu.alpha_)
    assert str(on_gpu.arch_) == str(on_cpu.arch_)  # one epoch barely moves alpha
    assert _jmsnas_losses(on_gpu) == pytest.approx(_jmsnas_losses(on_cpu), rel=1e-2)


# ---- the CLI ------------------------------------------------------------------------------------
TRAINING_COMMANDS = [
    ["nas", "adaptivenet", "elastify", "digits_cnn", "--out", "{tmp}/a"],
    ["nas", "splitnets", "train", "--out", "{tmp}/s"],
    ["nas", "jmsnas", "--topology", "jmsnas-chain", "--latency-budget-ms", "5"],
]


@no_cuda
@pytest.mark.parametrize("argv", TRAINING_COMMANDS, ids=lambda a: a[1])
def test_the_training_commands_refuse_a_missing_gpu_in_one_line(argv, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in argv]
    result = CliRunner().invoke(app, [*argv, "--torch-device", "cuda"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: --torch-device cuda: this machine has"), lines[0]
    assert not any(tmp_path.iterdir())  # nothing written: refused before any work
