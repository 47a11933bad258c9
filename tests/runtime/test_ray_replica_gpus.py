"""``serve --engine ray --replica-gpus G`` (issue 39, accelerators): Ray replicas that hold GPUs
compute on cuda. Checked without a Ray cluster: the deployment options Ray receives, the
replica's torch device, and the refusals (a cluster without a GPU would leave Serve waiting
for one forever). On a machine with CUDA (skipped elsewhere) a replica made as Serve makes it
computes on the GPU and answers the CPU's outputs within tolerance."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.runtime.ray_engine import RayEngine, RayOptions

pytest.importorskip("ray", reason="the Ray engine needs edgesplit[ray]")

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
no_cuda = pytest.mark.skipif(CUDA, reason="this machine has CUDA")


# ---- the options Ray receives -------------------------------------------------------------------
def test_replica_gpus_become_rays_num_gpus_and_put_the_replica_on_cuda():
    actor = RayOptions(replicas=2, replica_gpus=0.5).deployment()["ray_actor_options"]
    assert actor["num_gpus"] == 0.5 and actor["num_cpus"] == 1.0
    assert RayOptions(replica_gpus=0.5).replica_device == "cuda"
    assert "num_gpus" not in RayOptions().deployment()["ray_actor_options"]
    assert RayOptions().replica_device is None  # the CPU, as before
    with pytest.raises(ConfigError, match="replica_gpus"):
        RayOptions(replica_gpus=-1)


class _FakeServe:
    """What ``_deploy`` calls on ``ray.serve``; records the replica's constructor arguments."""

    def __init__(self) -> None:
        self.bound: dict = {}
        self.options: dict = {}

    def status(self):
        return SimpleNamespace(applications={})

    def deployment(self, cls, name):
        outer = self

        class _Deployment:
            def options(self, **opts):
                outer.options = opts
                return self

            def bind(self, *args, **kwargs):
                outer.bound = kwargs
                return "app"

        return _Deployment()

    def run(self, app, **_):
        return "handle"


@pytest.mark.parametrize("gpus, device", [(0.0, None), (1.0, "cuda"), (0.25, "cuda")])
def test_the_deployment_binds_the_replica_to_its_device(digits_chain, gpus, device):
    engine = RayEngine.__new__(RayEngine)
    engine.options = RayOptions(replica_gpus=gpus)
    engine.serve, engine.device, engine.app_name = _FakeServe(), "cloud", "test-gpus"
    assert engine._deploy(digits_chain, False, False) == "handle"
    assert engine.serve.bound["torch_device"] == device
    assert engine.serve.options["ray_actor_options"].get("num_gpus", 0.0) == gpus


# ---- room on the cluster ------------------------------------------------------------------------
def _engine(gpus: float, replicas: int, cluster: dict, own: bool) -> RayEngine:
    engine = RayEngine.__new__(RayEngine)
    engine.options = RayOptions(replicas=replicas, replica_gpus=gpus, replica_cpus=0.5)
    engine.ray = SimpleNamespace(cluster_resources=lambda: cluster)
    engine._own_cluster, engine._watcher = own, None
    engine._watch_stop = threading.Event()
    engine.closed = 0

    def close(**_):
        engine.closed += 1

    engine.close = close
    return engine


@pytest.mark.parametrize("own", [True, False])
def test_gpu_replicas_on_a_cluster_without_a_gpu_are_refused_not_left_waiting(own):
    engine = _engine(1, 1, {"CPU": 8.0}, own)
    with pytest.raises(ConfigError, match="the Ray cluster has no GPU"):
        engine._check_room()
    assert engine.closed == 1  # a cluster this engine started is stopped again


def test_too_few_gpus_are_refused_on_an_own_cluster_and_warned_on_a_joined_one(caplog):
    with pytest.raises(ConfigError, match="need 2 GPUs; the Ray cluster has 1: lower"):
        _engine(1, 2, {"CPU": 8.0, "GPU": 1.0}, own=True)._check_room()
    with caplog.at_level(logging.WARNING):
        _engine(1, 2, {"CPU": 8.0, "GPU": 1.0}, own=False)._check_room()
    assert "need 2 GPUs; the Ray cluster has 1" in caplog.text
    _engine(0.5, 2, {"CPU": 8.0, "GPU": 1.0}, own=True)._check_room()  # two halves fit one
    _engine(0, 2, {"CPU": 8.0}, own=True)._check_room()  # no GPUs asked: none needed


# ---- the command line ---------------------------------------------------------------------------
def _serve(program, tmp_path, *flags: str):
    plan = tmp_path / "plan.json"
    program.plan.save(plan)
    return CliRunner().invoke(app, ["serve", str(plan), "--device", "cloud", *flags])


@no_cuda
def test_cli_refuses_replica_gpus_on_a_machine_without_cuda_in_one_line(digits_chain, tmp_path):
    result = _serve(digits_chain, tmp_path, "--engine", "ray", "--replica-gpus", "1")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: --replica-gpus 1: this machine has no CUDA device"), \
        lines[0]


def test_cli_replica_gpus_need_the_ray_engine(digits_chain, tmp_path):
    result = _serve(digits_chain, tmp_path, "--replica-gpus", "1")
    assert result.exit_code == 2
    assert "--replica-gpus configure the Ray engine: add --engine ray" in result.output


# ---- a replica on the GPU -----------------------------------------------------------------------
def _replica(program, device):
    from edgesplit.runtime.ray_replica import PartitionReplica

    return PartitionReplica(program.plan.model_dump_json(), "cloud", torch_device=device)


def _answer(replica, program) -> dict[str, np.ndarray]:
    example = program.example_values()
    arrays = {n: example[n].numpy() for n in replica.step.partition.inputs}
    reply = replica._alone(arrays)
    assert reply.error is None, reply.error
    return reply.outputs


def test_a_replica_without_gpus_computes_on_the_cpu(digits_chain):
    replica = _replica(digits_chain, None)
    assert replica.describe()["torch_device"] == "cpu"


@needs_cuda
def test_a_replica_with_a_gpu_computes_there_and_answers_the_cpus_outputs(digits_chain):
    on_cpu, on_gpu = _replica(digits_chain, None), _replica(digits_chain, "cuda")
    assert on_gpu.describe()["torch_device"].startswith("cuda")
    assert next(on_gpu.step.partition.module.parameters()).is_cuda
    want, got = _answer(on_cpu, digits_chain), _answer(on_gpu, digits_chain)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-2, atol=1e-3)
