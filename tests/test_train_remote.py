"""Two-process split training over gRPC (L2S): the sync protocol, link emulation, errors and a
short real run on the digits data."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from edgesplit.data._digits import TRAIN_SAMPLES, digits_arrays
from edgesplit.errors import ConfigError, RemoteError
from edgesplit.quant.wire import encode_tensor
from edgesplit.train.proto import edgesplit_train_pb2 as pb
from edgesplit.train.remote import RemoteSplitTrainer, TrainServer, untrained_model
from edgesplit.train.session import (FixedCutPolicy, epoch_batches, evaluate,
                                     profile_device_ms, run_split_training)
from edgesplit.train.split import as_chain, tensor_bytes

SEED = 0
N = 10  # chain elements of DigitsCNN


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    return digits_arrays()


def _batches(digits, size: int, count: int, start: int = 0):
    images, labels = digits
    return [(images[start + k * size:start + (k + 1) * size],
             labels[start + k * size:start + (k + 1) * size]) for k in range(count)]


@pytest.fixture
def serve():
    """Start TrainServers on free ports (gRPC threads in this process); stop them after."""
    servers = []

    def start(**kwargs) -> str:
        kwargs.setdefault("lr", 0.05)
        server = TrainServer(lambda: untrained_model("digits_cnn", SEED), seed=SEED, **kwargs)
        servers.append(server)
        return f"127.0.0.1:{server.start()}"

    yield start
    for server in servers:
        server.stop(0)


def _model(seed: int = SEED):
    return untrained_model("digits_cnn", seed)


def _unsplit(batches, lr: float, momentum: float = 0.0, epochs=None):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _assert_same_state(a, b, atol: float = 1e-6) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.allclose(sa[key].double(), sb[key].double(), atol=atol, rtol=0), key


def _fetch(trainer: RemoteSplitTrainer, indices):
    reply = trainer._call(trainer._stub.Fetch, pb.FetchRequest(indices=list(indices)))
    return trainer._read_reply(reply.layers, list(indices))


# ---- the sync protocol ---------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fws_equals_unsplit_sgd(digits, serve, momentum):
    """L2S-FWS syncs the elements that change sides, with their momentum: it is unsplit
    training."""
    batches = _batches(digits, 16, 8)
    cuts = [2, 5, 9, 0, 6, 3, 9, 2]
    with RemoteSplitTrainer(_model(), serve(momentum=momentum), lr=0.05, momentum=momentum,
                            seed=SEED, sync="fws") as trainer:
        stats = [trainer.step(x, y, cut) for (x, y), cut in zip(batches, cuts, strict=True)]
        trained = trainer.final_model()
    assert stats[0].synced == ()
    assert stats[1].synced == (3, 4, 5) and stats[1].sync_bytes > 0
    assert stats[3].synced == tuple(range(1, 10))
    _assert_same_state(trained, _unsplit(batches, lr=0.05, momentum=momentum))


def test_sync_before_a_settled_cut_brings_the_layers_that_will_move(digits, serve):
    """When L2S settles on a cut, the elements about to change sides are sent by the side
    that trained them, so the new owner starts from current weights."""
    batches = _batches(digits, 16, 3)
    with RemoteSplitTrainer(_model(), serve(), lr=0.05, seed=SEED) as trainer:
        for x, y in batches:
            trainer.step(x, y, 3)  # the server trains 4..9
        result = trainer.sync_now(next_cut=6)
        assert result.indices == (4, 5, 6) and result.bytes_down > result.bytes_up
        server = _fetch(trainer, range(4, 7))
        for i in range(4, 7):
            for name, p in trainer.replica.chain[i].named_parameters():
                assert torch.equal(p.detach(), server[i][0][0][name])
        assert trainer.sync_now(next_cut=6).indices == ()  # nothing left to send
        model = trainer.final_model()
    _assert_same_state(model, _unsplit(batches, lr=0.05))


def test_periodic_merges_both_sides(digits, serve):
    """Elements trained on both sides between syncs end as base + delta_dev + delta_srv on
    both sides, and the sync costs the tensors' bytes plus little overhead."""
    (x1, y1), (x2, y2) = _batches(digits, 16, 2)
    init = as_chain(_model())
    with RemoteSplitTrainer(_model(), serve(), lr=0.05, seed=SEED) as trainer:
        first = trainer.step(x1, y1, 3)   # server trains 4..9
        second = trainer.step(x2, y2, 6)  # device trains 0..6 (4..6 from its stale copy)
        assert first.synced == second.synced == () and second.sync_bytes == 0
        chain = trainer.replica.chain
        dev = {i: {n: p.detach().clone() for n, p in chain[i].named_parameters()}
               for i in range(4, 7)}
        srv = _fetch(trainer, range(4, 7))
        result = trainer.sync_now()
        assert result.indices == (4, 5, 6)
        after = _fetch(trainer, range(4, 7))
        payload = 0
        for i in range(4, 7):
            for name, p in chain[i].named_parameters():
                base = dict(init[i].named_parameters())[name].detach()
                expected = base + (dev[i][name] - base) + (srv[i][0][0][name] - base)
                assert torch.allclose(p.detach(), expected, atol=1e-6)
                assert torch.equal(after[i][0][0][name], p.detach())  # bit-identical copies
                payload += 2 * tensor_bytes(p)  # a delta each way
            for name, b in chain[i].named_buffers():  # the device owns 4..6 under cut 6
                assert torch.equal(after[i][1][name], b)
                payload += tensor_bytes(b)
        assert result.payload_bytes == payload
        tensors = sum(2 * len(list(chain[i].parameters())) + len(list(chain[i].buffers()))
                      for i in range(4, 7))
        assert payload < result.total_bytes < payload + 160 * tensors
        assert trainer.sync_now().indices == ()  # nothing trained on both sides any more


def test_periodic_sync_every(digits, serve):
    batches = _batches(digits, 8, 4)
    with RemoteSplitTrainer(_model(), serve(), lr=0.05, seed=SEED, sync_every=2) as trainer:
        stats = [trainer.step(x, y, cut) for (x, y), cut in zip(batches, [2, 4, 4, 4], strict=True)]
    assert [s.synced for s in stats] == [(), (3, 4), (), ()]
    assert stats[1].sync_ms > 0 and stats[1].sync_bytes > 0


# ---- timing and the emulated link ----------------------------------------------------------
def test_on_device_rounds_send_nothing_real_process(digits):
    """A real server process (serve_training); pure on-device rounds make no RPC."""
    code = ("import logging; from edgesplit.train.remote import serve_training; "
            "serve_training('digits_cnn', lr=0.05, seed=0, "
            "on_ready=lambda p: print(p, flush=True))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        (x1, y1), (x2, y2) = _batches(digits, 8, 2)
        with RemoteSplitTrainer(_model(), f"127.0.0.1:{port}", lr=0.05, seed=SEED,
                                sync="fws") as trainer:
            local = trainer.step(x1, y1, N - 1)
            split = trainer.step(x2, y2, 5)  # first syncs 6..9 to the server
            model = trainer.final_model()
        assert split.synced == (6, 7, 8, 9) and split.sync_bytes > 0
        assert split.bytes_up > tensor_bytes(torch.zeros(8, 16, 8, 8)) and split.edge_ms > 0
        assert split.bytes_down > 0 and split.server_ms > 0
        assert (local.bytes_up, local.bytes_down, local.sync_bytes) == (0, 0, 0)
        assert local.edge_ms == 0 and local.server_ms == 0 and local.device_ms > 0
        _assert_same_state(model, _unsplit([(x1, y1), (x2, y2)], lr=0.05))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode is not None


def test_bandwidth_change_shows_in_edge_ms(digits, serve):
    (x, y), = _batches(digits, 32, 1)
    with RemoteSplitTrainer(_model(), serve(), lr=0.0, seed=SEED, link_mbps=200) as trainer:
        trainer.step(x, y, 5)  # warm-up
        fast = trainer.step(x, y, 5)
        trainer.set_bandwidth_mbps(4)
        slow = trainer.step(x, y, 5)
    assert trainer.bandwidth_mbps == 4
    expected = (slow.bytes_up + slow.bytes_down) * 8 / 1e3 * (1 / 4 - 1 / 200)  # ms
    assert expected > 400
    assert 0.9 * expected < slow.edge_ms - fast.edge_ms < expected + 400


def test_device_slowdown_and_profile(digits, serve):
    (x, y), = _batches(digits, 16, 1)
    with RemoteSplitTrainer(_model(), serve(), lr=0.0, seed=SEED,
                            device_slowdown=3.0) as trainer:
        stats = trainer.step(x, y, N - 1)
    assert stats.device_ms > 0
    profiled = profile_device_ms(_model(), x, y, [-1, 0, 5, N - 1], repeats=1)
    assert profiled[0] < 1.0 and all(ms > 0 for ms in profiled[1:])
    assert profiled[3] > profiled[1]


# ---- errors --------------------------------------------------------------------------------
def test_errors_are_clear_and_the_server_keeps_serving(digits, serve):
    address = serve(token="s3cret")
    with pytest.raises(RemoteError, match="token"):
        RemoteSplitTrainer(_model(), address, lr=0.05, seed=SEED, token="wrong")
    with pytest.raises(RemoteError, match=r"model mismatch.*seed 1"):
        RemoteSplitTrainer(_model(seed=1), address, lr=0.05, seed=1, token="s3cret")
    with pytest.raises(ConfigError, match="sync policy"):
        RemoteSplitTrainer(_model(), address, lr=0.05, seed=SEED, sync="sometimes")
    (x, y), = _batches(digits, 8, 1)
    with RemoteSplitTrainer(_model(), address, lr=0.05, seed=SEED, token="s3cret") as trainer:
        with pytest.raises(ConfigError, match="cut 42 is not valid"):
            trainer.step(x, y, 42)
        labels = encode_tensor(y, 32)
        bad = [
            (pb.StepRequest(round=1, cut=42, activation=encode_tensor(x, 32), labels=labels),
             "INVALID_ARGUMENT: cut 42 is out of range"),
            (pb.StepRequest(round=1, cut=5, activation=encode_tensor(torch.randn(8, 3, 8, 8), 32),
                            labels=labels), "INVALID_ARGUMENT: chain elements 6..9 cannot train"),
            (pb.StepRequest(round=1, cut=5, activation=b"garbage", labels=labels),
             "INVALID_ARGUMENT: activation"),
            (pb.StepRequest(round=1, cut=-1, activation=encode_tensor(x, 32),
                            labels=encode_tensor(y[:3], 32)), "INVALID_ARGUMENT: labels"),
        ]
        for request, message in bad:
            with pytest.raises(RemoteError, match=message):
                trainer._call(trainer._stub.Step, request)
        stats = trainer.step(x, y, 5)
        assert stats.loss > 0 and stats.bytes_down > 0
    with pytest.raises(RemoteError, match="unavailable"):
        RemoteSplitTrainer(_model(), "127.0.0.1:1", lr=0.05, seed=SEED, timeout_s=5)


# ---- a short real run ----------------------------------------------------------------------
def test_split_training_matches_unsplit_accuracy(digits, serve):
    """DigitsCNN, SGD with momentum, cut fixed after `reduce`: held-out accuracy equals
    unsplit training's (within 2 points) and both learn the task."""
    images, labels = digits
    batches = epoch_batches(images[:TRAIN_SAMPLES], labels[:TRAIN_SAMPLES], 32, seed=SEED)
    epochs, lr, momentum = 4, 0.05, 0.9  # ~97% after 4 epochs (77% after 2)
    with RemoteSplitTrainer(_model(), serve(lr=lr, momentum=momentum), lr=lr,
                            momentum=momentum, seed=SEED) as trainer:
        log = run_split_training(trainer, batches, FixedCutPolicy(0), [5], epochs=epochs)
        split = trainer.final_model()
    assert len(log.partitions) == epochs * 38 and set(log.partitions) == {5}
    assert log.to_json()["rounds"] == epochs * 38 and all(e > 0 for e in log.edge_ms)
    unsplit = _unsplit([b for e in range(epochs) for b in batches(e)], lr, momentum)
    held_out = images[TRAIN_SAMPLES:], labels[TRAIN_SAMPLES:]
    acc_split, acc_unsplit = evaluate(split, *held_out), evaluate(unsplit, *held_out)
    assert acc_split > 90 and acc_unsplit > 90
    assert abs(acc_split - acc_unsplit) <= 2.0


def test_driver_calls_observe_and_syncs_when_due(digits, serve):
    class Policy:
        sync_due = False

        def __init__(self):
            self.updates, self.observed = [], []

        def select(self, t):
            return t % 2

        def update(self, arm, edge_ms):
            self.updates.append((arm, edge_ms))

        def observe(self, t, total_ms):
            self.observed.append(t)
            self.sync_due = t == 2

    policy = Policy()
    with RemoteSplitTrainer(_model(), serve(), lr=0.05, seed=SEED) as trainer:
        log = run_split_training(trainer, _batches(digits, 8, 3), policy, [3, 6],
                                 bandwidth_schedule=lambda t: 100.0 * t, progress=True)
    assert policy.observed == [1, 2, 3] and [a for a, _ in policy.updates] == [1, 0, 1]
    assert log.partitions == [6, 3, 6] and log.bandwidth_mbps == [100.0, 200.0, 300.0]
    assert log.synced == [[], [4, 5, 6], []] and log.sync_bytes[1] > 0
    with pytest.raises(ConfigError, match="one-shot"):
        run_split_training(trainer, iter([]), policy, [3], epochs=2)
