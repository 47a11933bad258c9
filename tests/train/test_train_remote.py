"""Two-process split training over gRPC (L2S): the sync protocol, sessions, requests refused
before anything changes, message limits, TLS, link emulation and real runs on the digits.

No verdict here depends on how fast this machine is: split training is compared with unsplit
training in the same run, delays that decide anything are injected, and timings are only
checked from below (a sleep lasts at least its time)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import ClassVar

import grpc
import pytest
import torch
import torch.nn.functional as F

from edgesplit.data.digits import TRAIN_SAMPLES, digits_arrays
from edgesplit.errors import ConfigError, RemoteError
from edgesplit.quant.wire import decode_tensor, encode_tensor
from edgesplit.runtime.options import CallOptions, ServeOptions
from edgesplit.train.proto import edgesplit_train_pb2 as pb
from edgesplit.train.proto import edgesplit_train_pb2_grpc as pb_grpc
from edgesplit.train.remote import (
    Emulation,
    RemoteSplitTrainer,
    TrainHandler,
    TrainOptions,
    train_message_bytes,
    training_server,
    untrained_model,
)
from edgesplit.train.remote.client import _sleep_slowdown
from edgesplit.train.remote.protocol import layer_msg
from edgesplit.train.session import (
    FixedCutPolicy,
    TrainSplitConfig,
    epoch_batches,
    evaluate,
    local_training_server,
    profile_device_ms,
    run_split_training,
    train_unsplit,
)
from edgesplit.train.split import as_chain, tensor_bytes
from edgesplit.transport import TlsFiles, open_channel
from edgesplit.transport.loopback import LoopbackError

SEED = 0
N = 10  # chain elements of DigitsCNN
SAMPLE = (1, 32, 32)


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    return digits_arrays()


def _batches(digits, size: int, count: int, start: int = 0):
    images, labels = digits
    return [(images[start + k * size:start + (k + 1) * size],
             labels[start + k * size:start + (k + 1) * size]) for k in range(count)]


def _training_server(**kwargs):
    """A training server of the digits CNN, not started: the ``ServeOptions`` fields among
    ``kwargs`` (``token``, ``tls``, ...) go to its shell, the rest to ``training_server``."""
    names = {f.name for f in dataclasses.fields(ServeOptions)}
    options = ServeOptions(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})
    return training_server(lambda: untrained_model("digits_cnn", SEED), seed=SEED,
                           options=options, **kwargs)


class _Servers:
    """Start training servers on free ports (gRPC threads in this process); ``last`` is the
    most recent one's handler, for tests that look at its state."""

    def __init__(self) -> None:
        self.servers: list = []

    def __call__(self, loopback: bool = False, **kwargs):
        """The server's address, or with ``loopback`` an in-process channel to it."""
        kwargs.setdefault("lr", 0.05)
        kwargs.setdefault("sample_shape", SAMPLE)
        server = _training_server(**kwargs)
        self.servers.append(server)
        if loopback:
            return server.loopback_channel()
        return f"localhost:{server.start()}"

    @property
    def last(self) -> TrainHandler:
        return self.servers[-1].handler


@pytest.fixture
def serve():
    servers = _Servers()
    yield servers
    for server in servers.servers:
        server.stop(0)


def _model(seed: int = SEED):
    return untrained_model("digits_cnn", seed)


def _unsplit(batches, lr: float, momentum: float = 0.0):
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
    reply = trainer._call(trainer._stub.Fetch, pb.FetchRequest(session_id=trainer.session_id,
                                                                indices=list(indices)))
    return trainer._read_reply(reply.layers, list(indices))


def _server_state(server: TrainHandler) -> dict:
    """Everything a request could change on the server: parameters, buffers, the sync base,
    SGD momentum and which elements it trained since the last sync (copies)."""
    replica, state = server.replica, {}
    for i, module in enumerate(replica.chain):
        for name, t in module.state_dict().items():
            state[f"{i}.{name}"] = t.clone()
        for name, t in replica.base[i].items():
            state[f"base {i}.{name}"] = t.clone()
        for name, p in module.named_parameters():
            buf = replica.opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                state[f"momentum {i}.{name}"] = buf.clone()
    state["trained"] = sorted(replica.trained)
    return state


def _assert_bit_identical(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        same = torch.equal(value, after[key]) if isinstance(value, torch.Tensor) \
            else value == after[key]
        assert same, f"{key} changed"


def _refused(trainer: RemoteSplitTrainer, method: str, request, match: str) -> str:
    """Send a hand-made request in the trainer's session; it must be refused (one line)."""
    request.session_id = trainer.session_id
    with pytest.raises(RemoteError, match=match) as info:
        trainer._call(getattr(trainer._stub, method), request)
    assert "\n" not in str(info.value)
    return str(info.value)


# ---- the sync protocol ---------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fws_equals_unsplit_sgd(digits, serve, momentum):
    """L2S-FWS syncs the elements that change sides, with their momentum: it is unsplit
    training."""
    batches = _batches(digits, 16, 8)
    cuts = [2, 5, 9, 0, 6, 3, 9, 2]
    server = serve(loopback=True, momentum=momentum)  # in-process: no socket needed here
    training = TrainOptions(lr=0.05, seed=SEED, momentum=momentum, sync="fws")
    with RemoteSplitTrainer(_model(), server, training) as trainer:
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
    with RemoteSplitTrainer(_model(), serve(), TrainOptions(lr=0.05, seed=SEED)) as trainer:
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
    with RemoteSplitTrainer(_model(), serve(), TrainOptions(lr=0.05, seed=SEED)) as trainer:
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
    with RemoteSplitTrainer(_model(), serve(),
                            TrainOptions(lr=0.05, seed=SEED, sync_every=2)) as trainer:
        stats = [trainer.step(x, y, cut) for (x, y), cut in zip(batches, [2, 4, 4, 4], strict=True)]
    assert [s.synced for s in stats] == [(), (3, 4), (), ()]
    assert stats[1].sync_ms > 0 and stats[1].sync_bytes > 0


# ---- requests refused before anything changes -----------------------------------------------
def test_a_refused_step_changes_nothing_on_the_server(digits, serve):
    """Bad labels, non-finite, empty, oversized or misshapen activations are refused with
    INVALID_ARGUMENT, and the server's parameters, batch-norm buffers and momentum stay
    bit-identical, also when the forward pass had already run (a finite activation whose
    training overflows)."""
    address = serve(momentum=0.9, max_batch=16)
    (x, y), = _batches(digits, 8, 1)
    with RemoteSplitTrainer(_model(), address,
                            TrainOptions(lr=0.05, seed=SEED, momentum=0.9)) as trainer:
        trainer.step(x, y, 5)  # the server now has momentum and moved statistics
        with torch.no_grad():
            act = trainer.replica.part(0, 6).eval()(x)
        before = _server_state(serve.last)

        def step(a, labels, cut: int = 5, **raw) -> pb.StepRequest:
            return pb.StepRequest(round=2, cut=cut, activation=raw.get("activation") or
                                  encode_tensor(a, 32), labels=encode_tensor(labels, 32))

        nan, inf = act.clone(), act.clone()
        nan[3, 0, 0, 0], inf[0, 1, 2, 3] = float("nan"), float("inf")
        ignore, too_big = y.clone(), y.clone()
        ignore[2], too_big[5] = -100, 10
        cases = [
            (step(act, ignore), r"labels must be class indices 0 to 9, got -100"),
            (step(act, too_big), r"labels must be class indices 0 to 9, got 10"),
            (step(act, y.float()), r"labels .* must be int64 of shape \[8\]: .*float32"),
            (step(act, y[:3]), r"labels .* must be int64 of shape \[8\]: .*shape \[3\]"),
            (step(nan, y), "activation has NaN or infinite values"),
            (step(inf, y), "activation has NaN or infinite values"),
            (step(act[:0], y[:0]), "activation is an empty batch"),
            (step(torch.zeros(17, 16, 8, 8), torch.zeros(17, dtype=torch.int64)),
             "batch of 17 samples; this server trains on 1 to 16 per round"),
            (step(torch.randn(8, 3, 8, 8), y),
             r"activation must be float32 of shape \[batch, 16, 8, 8\] \(what chain element 5 "
             r"outputs\), got float32 of shape \[8, 3, 8, 8\]"),
            (step(act.double(), y), "activation must be float32"),
            (step(act, y, activation=b"garbage"), "activation: "),
            (step(act, y, cut=42), "cut 42 is out of range"),
            (step(torch.full_like(act, 3e38), y), "non-finite .*nothing was updated"),
            (step(torch.full((8, *SAMPLE), 3e38), y, cut=-1), "non-finite"),
        ]
        for request, message in cases:
            _refused(trainer, "Step", request, "INVALID_ARGUMENT: .*" + message)
            _assert_bit_identical(before, _server_state(serve.last))
        stats = trainer.step(x, y, 5)  # the server goes on training
        assert torch.isfinite(torch.tensor(stats.loss)) and stats.loss > 0


class _IgnoresItsInput(torch.nn.Module):
    """Logits that do not depend on the input (one learned bias per class)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(x.shape[0], 3)


def test_a_cut_with_no_gradient_is_refused_and_changes_nothing():
    """A server part whose loss does not depend on the activation has no gradient at the cut
    to send back: the step is refused (INVALID_ARGUMENT) and undone. It used to update the
    server's parameters and then fail with INTERNAL (encoding a None gradient)."""
    def make() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 4), _IgnoresItsInput())

    server = training_server(make, lr=0.1, seed=SEED, sample_shape=(4,))
    try:
        x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
        torch.manual_seed(SEED)  # the same initial weights as the server's (training_server)
        with RemoteSplitTrainer(make(), server.loopback_channel(),
                                TrainOptions(lr=0.1, seed=SEED)) as trainer:
            before = _server_state(server.handler)
            with pytest.raises(RemoteError, match=r"INVALID_ARGUMENT: .*cut 0 do not depend on "
                                                  "the activation"):
                trainer.step(x, y, 0)
            _assert_bit_identical(before, _server_state(server.handler))
            trainer.step(x, y, -1)  # the whole chain on the server still trains
    finally:
        server.stop(0)


def test_a_refused_sync_changes_nothing_on_the_server(digits, serve):
    """A sync whose second element does not fit (NaN, a bool tensor, int momentum, an
    unknown name, sent twice, missing, buffers of an element the server owns) is refused with
    INVALID_ARGUMENT and merges nothing, not even the valid first element (a bool tensor used
    to fail with INTERNAL after element 1 was merged)."""
    batches = _batches(digits, 8, 3)
    with RemoteSplitTrainer(_model(), serve(momentum=0.9),
                            TrainOptions(lr=0.05, seed=SEED, momentum=0.9)) as trainer:
        for x, y in batches[:2]:
            trainer.step(x, y, 0)  # the server trains 1..9
        trainer.step(*batches[2], 5)  # periodic: 1..5 now trained on both sides
        before = _server_state(serve.last)
        replica = trainer.replica

        def layer(i: int, change=None, buffers: bool = True) -> pb.LayerState:
            deltas = {n: p.detach() - replica.base[i][n]
                      for n, p in replica.chain[i].named_parameters()}
            msg = layer_msg(i, (deltas, False), replica.buffers(i) if buffers else None)
            if change is not None:
                change(msg)
            return msg

        def tensor(field: str, name: str, value: torch.Tensor):
            def change(msg):
                entry = next(t for t in getattr(msg, field) if t.name == name)
                entry.data = encode_tensor(value, 32)
            return change

        weight = replica.chain[2].conv1[0].weight
        cases = [
            ([layer(1), layer(2, tensor("params", "conv1.0.weight",
                                        torch.full_like(weight, float("nan"))))],
             "element 2 parameter 'conv1.0.weight' has NaN or infinite values"),
            ([layer(1), layer(2, tensor("params", "conv1.0.weight",
                                        torch.ones_like(weight, dtype=torch.bool)))],
             "element 2 parameter 'conv1.0.weight' must be float32 .*bool"),
            ([layer(1), layer(2, tensor("buffers", "optim:conv1.0.weight",
                                        torch.ones_like(weight, dtype=torch.int64)))],
             "element 2 buffer 'optim:conv1.0.weight' must be float32 .*int64"),
            ([layer(1), layer(2, lambda msg: setattr(msg.params[0], "name", "bogus"))],
             "element 2 has no parameter 'bogus'"),
            ([layer(1), layer(2), layer(2)], "sync sends element 2 twice"),
            ([layer(1)], r"sends no state for elements \[2\]"),
        ]
        for layers, message in cases:
            request = pb.SyncRequest(round=3, cut=5, indices=[1, 2], layers=layers)
            _refused(trainer, "Sync", request, "INVALID_ARGUMENT: .*" + message)
            _assert_bit_identical(before, _server_state(serve.last))
        owned = pb.SyncRequest(round=3, cut=5, indices=[1, 6], layers=[layer(1), layer(6)])
        _refused(trainer, "Sync", owned, "buffers of element 6, which the server owns")
        _assert_bit_identical(before, _server_state(serve.last))
        assert trainer.sync_now().indices == (1, 2, 3, 4, 5)  # a valid sync still merges
        model = trainer.final_model()
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())


def test_the_device_refuses_bad_batches_and_a_refused_round_changes_nothing(digits, serve):
    """The device checks a batch before it changes anything; a round the server refuses
    leaves the device's model as it was too, and the refusal is one line."""
    (x, y), = _batches(digits, 8, 1)
    with RemoteSplitTrainer(_model(), serve(max_batch=16),
                            TrainOptions(lr=0.05, seed=SEED)) as trainer:
        assert (trainer.max_batch, trainer.classes) == (16, 10)
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        ignore, nan = y.clone(), x.clone()
        ignore[0], nan[0, 0, 0, 0] = -100, float("nan")
        for args, message in [
            ((x[:0], y[:0], 5), "at least one"),
            ((x, y[:3], 5), "one label per sample"),
            ((x, ignore, 5), "class indices 0 to 9, got -100"),
            ((x, y.float(), 5), "integer class indices"),
            ((nan, y, N - 1), "NaN or infinite"),
            ((torch.cat([x, x, x]), torch.cat([y, y, y]), 5), "more than the training server "
                                                              "takes per round \\(16\\)"),
            ((torch.full_like(x, 3e38), y, 0), "non-finite activation at cut 0"),
        ]:
            with pytest.raises(ConfigError, match=message):
                trainer.step(*args)
        with pytest.raises(RemoteError, match="INVALID_ARGUMENT: training on this batch gave "
                                              "a non-finite") as refused:
            trainer.step(torch.full_like(x, 3e38), y, -1)
        assert "\n" not in str(refused.value)
        _assert_bit_identical(before, trainer.model.state_dict())
        assert trainer.round == 0
        assert trainer.step(x, y, 5).round == 1


def test_message_limits_come_from_the_model(digits, serve):
    """Both sides use a message limit sized from the model and the batch limit, not a fixed
    512 MiB: a 32 MiB Step is refused by gRPC before it reaches (and locks) the server."""
    address = serve(max_batch=16)
    server = serve.last
    widest = 16 * 32 * 32 * 4  # the stem's output per sample, float32
    assert server.limit == train_message_bytes(server.replica.chain, server.shapes, 16)
    assert 16 * widest < server.limit < 4 * 1024 * 1024
    bigger = training_server(lambda: untrained_model("digits_cnn", SEED), lr=0.05, seed=SEED,
                             sample_shape=SAMPLE, max_batch=256).handler
    assert 256 * widest < bigger.limit < 2 * 256 * widest
    huge = pb.StepRequest(round=1, cut=5, activation=encode_tensor(torch.zeros(8192, 16, 8, 8),
                                                                   32),
                          labels=encode_tensor(torch.zeros(8192, dtype=torch.int64), 32))
    assert huge.ByteSize() > 32 * 1024 * 1024
    with RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED)) as trainer:
        assert trainer.limit == server.limit
        _refused(trainer, "Step", huge, "too large")
        channel = open_channel(address, 64 * 1024 * 1024, None)  # the server's own limit
        try:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.SplitTrainServiceStub(channel).Step(huge, timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            channel.close()
        (x, y), = _batches(digits, 16, 1)
        assert trainer.step(x, y, 0).loss > 0  # a full batch at the widest cut fits


# ---- sessions ------------------------------------------------------------------------------
def test_one_device_at_a_time_and_an_explicit_take_over(digits, serve):
    """A second Hello is refused while a session is open (it used to reset the first
    device's training); take_over ends the open session, whose device is then told so."""
    address = serve()
    batches = _batches(digits, 8, 3)
    first = RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED, sync="fws"))
    try:
        first.step(*batches[0], 5)
        with pytest.raises(RemoteError, match=r"FAILED_PRECONDITION: the server is training "
                                              r"another session .*take_over=True"):
            RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED))
        first.step(*batches[1], 3)  # the refused Hello reset nothing
        _assert_same_state(first.final_model(), _unsplit(batches[:2], lr=0.05))
        with RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED, sync="fws"),
                                take_over=True) as second:
            assert second.session_id != first.session_id
            with pytest.raises(RemoteError, match=r"FAILED_PRECONDITION: training session "
                                                  r"\w+ has ended \(taken over by device"):
                first.step(*batches[2], 5)
            second.step(*batches[2], 5)  # starts from the initial model
            _assert_same_state(second.final_model(), _unsplit(batches[2:], lr=0.05))
    finally:
        first.close()
    # the second device closed its session: a third one may start without taking over
    with RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED)) as third:
        third.step(*batches[0], 5)


def test_requests_outside_the_session_are_refused_clearly(digits, serve):
    address = serve()
    (x, y), = _batches(digits, 8, 1)
    with RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED)) as trainer:
        step = pb.StepRequest(round=1, cut=5, labels=encode_tensor(y, 32),
                              activation=encode_tensor(torch.zeros(8, 16, 8, 8), 32))
        for session, message in [("", "names no training session: the device must call "
                                      "Hello first"),
                                 ("0123abcd" * 4, "unknown training session 0123abcd")]:
            for method, request in [("Step", step), ("Fetch", pb.FetchRequest(indices=[9])),
                                    ("Sync", pb.SyncRequest(cut=5, indices=[]))]:
                request.session_id = session
                with pytest.raises(RemoteError, match="FAILED_PRECONDITION: .*" + message):
                    trainer._call(getattr(trainer._stub, method), request)
        trainer.step(x, y, 5)


def test_an_idle_session_expires_for_another_device(digits, serve):
    """After the session timeout (checked from below: the sleep lasts at least its time),
    another device may start; until then a device that only lost its connection goes on."""
    address = serve(session_timeout_s=0.5)
    (x, y), = _batches(digits, 8, 1)
    first = RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED))
    try:
        first.step(x, y, 5)
        time.sleep(0.6)
        first.step(x, y, 5)  # still its session: nobody else came
        time.sleep(0.6)
        with RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED)) as second:
            second.step(x, y, 5)
            with pytest.raises(RemoteError, match=r"has ended \(expired after"):
                first.step(x, y, 5)
    finally:
        first.close()


# ---- TLS -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple:
    """A self-signed certificate for localhost and 127.0.0.1 (openssl command line)."""
    tmp = tmp_path_factory.mktemp("tls")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def test_tls_with_a_token_end_to_end(digits, serve, certificate):
    cert, key = certificate
    address = serve(tls=TlsFiles(cert=cert.read_bytes(), key=key.read_bytes()), token="s3cret")
    batches = _batches(digits, 8, 2)
    with pytest.raises(RemoteError, match="unavailable"):  # plaintext against a TLS server
        RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED),
                           calls=CallOptions(token="s3cret", timeout_s=5))
    ca = TlsFiles(ca=cert.read_bytes())
    with RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED, sync="fws"),
                            calls=CallOptions(token="s3cret", tls=ca)) as trainer:
        for (x, y), cut in zip(batches, [5, 2], strict=True):
            trainer.step(x, y, cut)
        model = trainer.final_model()
    _assert_same_state(model, _unsplit(batches, lr=0.05))


def test_train_split_reaches_a_tls_server(serve, certificate, tmp_path):
    """`train-split --server --tls-ca --token-file` against a TLS serve-training; the run
    closes its session when done."""
    cert, key = certificate
    address = serve(lr=0.01, momentum=0.9, token="s3cret",
                    tls=TlsFiles(cert=cert.read_bytes(), key=key.read_bytes()))
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    done = subprocess.run(
        [sys.executable, "-m", "edgesplit.cli", "train-split", "--server", address,
         "--tls-ca", str(cert), "--token-file", str(token), "--policy", "fixed", "--cut", "5",
         "--no-privacy", "--no-baseline", "--epochs", "1", "--batch-size", "32",
         "--device-slowdown", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["rounds"]["rounds"] == 38 and set(doc["rounds"]["partitions"]) == {5}
    assert serve.last.current is None  # closed, so the next device needs no take-over
    local = subprocess.run([sys.executable, "-m", "edgesplit.cli", "train-split", "--tls-ca",
                            str(cert), "--epochs", "1"], capture_output=True, text=True,
                           timeout=120)
    assert local.returncode == 2 and "--server" in local.stderr
    assert "Traceback" not in local.stderr


# ---- timing and the emulated link (lower bounds only) --------------------------------------
def test_on_device_rounds_send_nothing_real_process(digits):
    """A real server process (serve_training); pure on-device rounds make no RPC."""
    code = ("import logging; from edgesplit.train.remote import serve_training; "
            "serve_training('digits_cnn', lr=0.05, seed=0, "
            "on_ready=lambda p: print(p, flush=True))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        (x1, y1), (x2, y2) = _batches(digits, 8, 2)
        with RemoteSplitTrainer(_model(), f"127.0.0.1:{port}",
                                TrainOptions(lr=0.05, seed=SEED, sync="fws")) as trainer:
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
    """The emulated link delays each message by its size over the bandwidth set for that
    round: edge_ms is at least that (no upper bound: the rest is this machine's speed)."""
    (x, y), = _batches(digits, 32, 1)
    with RemoteSplitTrainer(_model(), serve(), TrainOptions(lr=0.0, seed=SEED),
                            emulation=Emulation(link_mbps=200)) as trainer:
        fast = trainer.step(x, y, 5)
        trainer.set_bandwidth_mbps(4)
        slow = trainer.step(x, y, 5)
    assert trainer.bandwidth_mbps == 4
    for stats, mbps in ((fast, 200), (slow, 4)):
        link_ms = (stats.bytes_up + stats.bytes_down) * 8 / 1e3 / mbps
        assert stats.edge_ms >= link_ms
    assert (slow.bytes_up + slow.bytes_down) * 8 / 1e3 / 4 > 400  # what the drop costs


def test_device_slowdown_and_profile(digits):
    """A slowdown of 3 reports 3x the measured time and sleeps at least the difference;
    the profile runs on a copy and measures every cut."""
    t0 = time.perf_counter()
    assert _sleep_slowdown(0.05, 3.0) == pytest.approx(0.15)
    assert time.perf_counter() - t0 >= 0.1
    assert _sleep_slowdown(0.05, 1.0) == 0.05
    (x, y), = _batches(digits, 16, 1)
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profiled = profile_device_ms(model, x, y, [-1, 0, 5, N - 1], repeats=1)
    assert len(profiled) == 4 and all(ms >= 0 for ms in profiled) and profiled[3] > 0
    _assert_bit_identical(before, model.state_dict())


# ---- real runs -----------------------------------------------------------------------------
class _CutCycle:
    """A policy that moves the cut every ``every`` rounds through ``arms``."""

    def __init__(self, arms, every: int) -> None:
        self.arms, self.every = arms, every

    def select(self, t: int) -> int:
        return self.arms[(t // self.every) % len(self.arms)]

    def update(self, arm: int, edge_delay_ms: float) -> None:
        pass


def test_split_training_equals_unsplit_training_on_the_digits(digits, serve):
    """Two epochs of the default recipe (lr 0.01, momentum 0.9, batch 32) with the cut moving
    every 10 rounds under FWS: the trained model is unsplit training's, trained in this run on
    the same batches, to float tolerance, and predicts the same held-out digits. No absolute
    accuracy is asserted beyond "learns": the exact figure is this CPU's arithmetic."""
    images, labels = digits
    batches = epoch_batches(images[:TRAIN_SAMPLES], labels[:TRAIN_SAMPLES], 32, seed=SEED)
    epochs, lr, momentum, cuts = 2, 0.01, 0.9, [5, 0, N - 1, 3]
    training = TrainOptions(lr=lr, seed=SEED, momentum=momentum, sync="fws")
    with RemoteSplitTrainer(_model(), serve(lr=lr, momentum=momentum), training) as trainer:
        log = run_split_training(trainer, batches, _CutCycle([0, 1, 2, 3], 10), cuts,
                                 epochs=epochs)
        split = trainer.final_model()
    assert log.to_json()["rounds"] == epochs * 38 and set(log.partitions) == set(cuts)
    unsplit = train_unsplit(_model(), batches, epochs, lr, momentum)
    _assert_same_state(split, unsplit, atol=1e-4)
    held_out = images[TRAIN_SAMPLES:]
    with torch.no_grad():
        agree = (split(held_out).argmax(1) == unsplit(held_out).argmax(1)).float().mean()
    assert agree >= 0.995
    assert evaluate(split, held_out, labels[TRAIN_SAMPLES:]) > 30  # chance is 10 %


class _InjectedDelays:
    """A RemoteSplitTrainer whose rounds report delays from a fixed cost model instead of the
    clock: the real training, bytes and syncs over gRPC, with the delays of a device 40x
    slower than the server on a link of ``bandwidth_mbps`` (no real shaping), so that what L2S
    decides does not depend on this machine."""

    # d_p^m: the device trains chain[0..c]
    DEVICE_MS: ClassVar[list[float]] = [40.0 * (c + 1) for c in range(N)]

    def __init__(self, trainer: RemoteSplitTrainer) -> None:
        self.trainer, self.bandwidth_mbps = trainer, None

    def set_bandwidth_mbps(self, mbps: float) -> None:
        self.bandwidth_mbps = float(mbps)

    def _link_ms(self, nbytes: int) -> float:
        return nbytes * 8 / 1e3 / self.bandwidth_mbps

    def step(self, x, y, cut: int):
        s = self.trainer.step(x, y, cut)
        server_ms = 2.0 * (N - 1 - cut)
        edge_ms = self._link_ms(s.bytes_up + s.bytes_down) + server_ms if cut < N - 1 else 0.0
        return dataclasses.replace(s, device_ms=self.DEVICE_MS[cut], edge_ms=edge_ms,
                                   server_ms=server_ms, sync_ms=self._link_ms(s.sync_bytes))

    def sync_now(self, next_cut=None):
        result = self.trainer.sync_now(next_cut)
        return dataclasses.replace(result, sync_ms=self._link_ms(result.total_bytes))


def test_l2s_moves_the_cut_when_the_bandwidth_drops_with_injected_delays(digits, serve):
    """The real L2S policy over real gRPC training, fed delays from a cost model: at 1 Gb/s
    offloading after the stem wins (about 75 ms a round against 400 on the device), at 20 Mb/s
    its 2 MiB a round cost 0.9 s and L2S moves the cut deeper. Deterministic, unlike the
    measured delays of a loaded machine; FWS keeps the training equal to unsplit training."""
    from edgesplit.train.session import _features, _make_policy

    drop_at = 38
    images, labels = digits
    batches = epoch_batches(images[:TRAIN_SAMPLES], labels[:TRAIN_SAMPLES], 16, seed=SEED)
    config = TrainSplitConfig(epochs=1, batch_size=16, privacy_kl=None, horizon=15,
                              bandwidth_mbps=1000, drop_at=drop_at, drop_to=20, seed=SEED)
    cuts = list(range(N))
    policy = _make_policy(config, _features(_model(), batches(0)[0][0], cuts),
                          _InjectedDelays.DEVICE_MS)
    training = TrainOptions(lr=0.01, seed=SEED, momentum=0.9, sync="fws")
    with RemoteSplitTrainer(_model(), serve(lr=0.01, momentum=0.9), training) as trainer:
        log = run_split_training(_InjectedDelays(trainer), batches, policy, cuts,
                                 bandwidth_schedule=config.trace().at)
        split = trainer.final_model()
    parts = log.partitions
    assert len(parts) == 75 and log.bandwidth_mbps[drop_at - 2:drop_at] == [1000.0, 20.0]
    settled = dict(policy.settled)
    before = [cut for t, cut in settled.items() if t < drop_at]
    after = [cut for t, cut in settled.items() if t > drop_at]
    assert before and after and before[-1] == 0 and after[-1] > 2, (policy.settled, parts)
    assert any(t > drop_at and r == "drift"
               for t, r in zip(policy.adaptations, policy.reasons, strict=True))
    unsplit = train_unsplit(_model(), batches, 1, 0.01, 0.9)
    _assert_same_state(split, unsplit, atol=1e-4)


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
    with RemoteSplitTrainer(_model(), serve(), TrainOptions(lr=0.05, seed=SEED)) as trainer:
        log = run_split_training(trainer, _batches(digits, 8, 3), policy, [3, 6],
                                 bandwidth_schedule=lambda t: 100.0 * t, progress=True)
    assert policy.observed == [1, 2, 3] and [a for a, _ in policy.updates] == [1, 0, 1]
    assert log.partitions == [6, 3, 6] and log.bandwidth_mbps == [100.0, 200.0, 300.0]
    assert log.synced == [[], [4, 5, 6], []] and log.sync_bytes[1] > 0
    with pytest.raises(ConfigError, match="one-shot"):
        run_split_training(trainer, iter([]), policy, [3], epochs=2)


def test_the_training_server_is_a_handler_on_the_serving_shell():
    """The shell serves the training service: the token checked (and throttled) there, each
    call in one of its worker slots (one here: a call that finds it taken for the options'
    wait is refused as busy), gRPC only (no data plane, whatever the options say)."""
    server = _training_server(lr=0.05, sample_shape=SAMPLE, token="t", max_workers=1,
                              next_timeout_s=0.2)
    try:
        assert server.options.data_port is None and server.slots.workers == 1
        stub = pb_grpc.SplitTrainServiceStub(server.loopback_channel())
        close, token = pb.CloseRequest(session_id="none"), [("authorization", "Bearer t")]
        with pytest.raises(LoopbackError) as refused:
            stub.Close(close, metadata=[("authorization", "Bearer wrong")])
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert not stub.Close(close, metadata=token).closed
        server.slots.take(None)  # the one worker is busy
        with pytest.raises(LoopbackError, match="busy") as busy:
            stub.Close(close, metadata=token)
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        server.slots.give()
        assert not stub.Close(close, metadata=token).closed
    finally:
        server.stop(0)


def test_errors_are_clear_and_the_server_keeps_serving(digits, serve):
    address = serve(token="s3cret")
    with pytest.raises(RemoteError, match="token"):
        RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED),
                           calls=CallOptions(token="wrong"))
    with pytest.raises(RemoteError, match=r"model mismatch.*seed 1"):
        RemoteSplitTrainer(_model(seed=1), address, TrainOptions(lr=0.05, seed=1),
                           calls=CallOptions(token="s3cret"))
    with pytest.raises(ConfigError, match="sync policy"):
        RemoteSplitTrainer(_model(), address,
                           TrainOptions(lr=0.05, seed=SEED, sync="sometimes"))
    with pytest.raises(ConfigError, match="does not fit the model"):
        training_server(lambda: untrained_model("digits_cnn", SEED), lr=0.05, seed=SEED,
                        sample_shape=(3, 32, 32))
    (x, y), = _batches(digits, 8, 1)
    with RemoteSplitTrainer(_model(), address, TrainOptions(lr=0.05, seed=SEED),
                            calls=CallOptions(token="s3cret")) as trainer:
        with pytest.raises(ConfigError, match="cut 42 is not valid"):
            trainer.step(x, y, 42)
        stats = trainer.step(x, y, 5)
        assert stats.loss > 0 and stats.bytes_down > 0
    with pytest.raises(RemoteError, match="unavailable"):
        RemoteSplitTrainer(_model(), "127.0.0.1:1", TrainOptions(lr=0.05, seed=SEED),
                           calls=CallOptions(timeout_s=5))


def test_the_fixed_policy_trains_at_its_cut(digits, serve):
    batches = _batches(digits, 8, 3)
    with RemoteSplitTrainer(_model(), serve(), TrainOptions(lr=0.05, seed=SEED)) as trainer:
        log = run_split_training(trainer, batches, FixedCutPolicy(0), [5])
        model = trainer.final_model()
    assert log.partitions == [5, 5, 5] and all(e > 0 for e in log.edge_ms)
    _assert_same_state(model, _unsplit(batches, lr=0.05))


# ---- lost replies, sequence numbers, steps taken back (issue 39) ----------------------------
class _LosesReplies:
    """Stands in for a trainer's stub: every call reaches the server, which applies it, but
    the first ``lose[method]`` replies of ``method`` are lost on the way back (UNAVAILABLE);
    ``sent`` records each attempt's method and sequence number."""

    def __init__(self, stub, **lose: int) -> None:
        self._stub, self.lose, self.sent = stub, lose, []

    def __getattr__(self, method: str):
        real = getattr(self._stub, method)

        def call(request, **kwargs):
            self.sent.append((method, getattr(request, "seq", None)))
            reply = real(request, **kwargs)
            if self.lose.get(method, 0) > 0:
                self.lose[method] -= 1
                raise LoopbackError(grpc.StatusCode.UNAVAILABLE, "connection reset")
            return reply
        return call


def test_a_lost_step_or_sync_reply_is_sent_again_and_applied_once(digits, serve):
    """The device re-sends a request whose reply was lost with the same sequence number and
    the server answers it from its first reply: FWS training with a lost Step reply and a
    lost Sync reply is still exactly unsplit training (a re-sent Sync was merged twice, a
    re-sent Step trained its batch twice)."""
    batches = _batches(digits, 16, 4)
    cuts = [5, 5, 2, 7]  # round 3 syncs 3..5 to the device, round 4 3..7 to the server
    with RemoteSplitTrainer(_model(), serve(loopback=True, momentum=0.9),
                            TrainOptions(lr=0.05, seed=SEED, momentum=0.9, sync="fws"),
                            calls=CallOptions(retry_backoff_s=0)) as trainer:
        trainer._stub = stub = _LosesReplies(trainer._stub, Step=2, Sync=1)
        for (x, y), cut in zip(batches, cuts, strict=True):
            trainer.step(x, y, cut)
        trained = trainer.final_model()
    # the first Step's reply lost twice (within the 2 retries), then the first Sync's once
    assert stub.sent[:7] == [("Step", 1), ("Step", 1), ("Step", 1), ("Step", 2),
                             ("Sync", 3), ("Sync", 3), ("Step", 4)]
    _assert_same_state(trained, _unsplit(batches, lr=0.05, momentum=0.9))


def test_a_lost_periodic_sync_reply_leaves_both_copies_identical(digits, serve):
    """The issue's case: a periodic merge whose reply was lost and which the device sent
    again left device and server differing by the deltas merged twice, for good. Now both
    copies are bit-identical and equal to the same run without the loss."""
    batches = _batches(digits, 16, 2)
    merged = []
    for lose in (0, 1):
        with RemoteSplitTrainer(_model(), serve(loopback=True),
                                TrainOptions(lr=0.05, seed=SEED),
                                calls=CallOptions(retry_backoff_s=0)) as trainer:
            trainer.step(*batches[0], 3)  # the server trains 4..9
            trainer.step(*batches[1], 6)  # the device trains 0..6: 4..6 on both sides
            trainer._stub = _LosesReplies(trainer._stub, Sync=lose)
            assert trainer.sync_now().indices == (4, 5, 6)
            server = _fetch(trainer, range(4, 7))
            device = {i: dict(trainer.replica.chain[i].named_parameters()) for i in range(4, 7)}
            for i in range(4, 7):
                for name, p in device[i].items():
                    assert torch.equal(server[i][0][0][name], p.detach()), (i, name)
            merged.append(device)
    for i in range(4, 7):
        for name, p in merged[0][i].items():
            assert torch.equal(merged[1][i][name], p), (i, name)


def test_sequence_numbers_out_of_step_are_refused_and_change_nothing(digits, serve):
    """A repeat of the last request gets the first reply and changes nothing; a number that
    skips ahead, goes back, or repeats the last one with other content is refused with
    FAILED_PRECONDITION; so is an Undo of anything but the last Step."""
    (x, y), (x2, y2) = _batches(digits, 8, 2)
    with RemoteSplitTrainer(_model(), serve(momentum=0.9),
                            TrainOptions(lr=0.05, seed=SEED, momentum=0.9)) as trainer:
        trainer.step(x, y, 5)  # seq 1
        with torch.no_grad():
            act = trainer.replica.part(0, 6).eval()(x2)
        step = pb.StepRequest(session_id=trainer.session_id, round=2, cut=5, seq=2,
                              activation=encode_tensor(act, 32), labels=encode_tensor(y2, 32))
        first = trainer._call(trainer._stub.Step, step)
        after = _server_state(serve.last)
        assert trainer._call(trainer._stub.Step, step) == first  # re-sent: answered again
        _assert_bit_identical(after, _server_state(serve.last))
        other = pb.StepRequest()
        other.CopyFrom(step)
        other.labels = encode_tensor(y, 32)
        undo = pb.UndoRequest(step_seq=1, seq=3)
        for request, message in [
            (pb.StepRequest(**{**_fields(step), "seq": 4}), "numbered 4, .*expects 3"),
            (pb.StepRequest(**{**_fields(step), "seq": 1}), "numbered 1, .*expects 3"),
            (other, "numbered 2 reuses the number of an earlier, different request"),
            (pb.SyncRequest(cut=5, indices=[], seq=5), "numbered 5, .*expects 3"),
            (undo, r"Undo takes back only the last accepted request, and only a Step: 1 is "
                   r"not \(the last is 2\)"),
        ]:
            message = _refused(trainer, type(request).__name__.removesuffix("Request"),
                               request, "FAILED_PRECONDITION: .*" + message)
            assert "take_over=True" in message or "Undo" in message
            _assert_bit_identical(after, _server_state(serve.last))
        # the device's own next request reuses number 2, which the server gave to `step`
        with pytest.raises(RemoteError, match=r"reuses the number .* out of step"):
            trainer.step(x2, y2, 5)
        _assert_bit_identical(after, _server_state(serve.last))


def _fields(message) -> dict:
    return {field.name: value for field, value in message.ListFields()}


class _CorruptsGradients:
    """Stands in for a trainer's stub: the server steps, but the gradient of the next Step
    reply arrives with a NaN in it."""

    def __init__(self, stub) -> None:
        self._stub, self.corrupt = stub, 1

    def __getattr__(self, method: str):
        real = getattr(self._stub, method)
        if method != "Step":
            return real

        def call(request, **kwargs):
            reply = real(request, **kwargs)
            if self.corrupt:
                self.corrupt -= 1
                grad = decode_tensor(reply.gradient)
                grad.view(-1)[0] = float("nan")
                reply.gradient = encode_tensor(grad, 32)
            return reply
        return call


@pytest.mark.parametrize("where", ["wire", "device"])
def test_a_round_the_device_cannot_finish_is_taken_back_on_the_server(digits, serve, where):
    """A gradient the device finds non-finite (corrupted on the way, or its own backward
    overflowing) after the server stepped: the round fails saying the server's update was
    taken back, the server's parameters, momentum, buffers and trained set are bit-identical
    to before, and training goes on as unsplit training without that batch."""
    batches = _batches(digits, 16, 3)
    with RemoteSplitTrainer(_model(), serve(loopback=True, momentum=0.9),
                            TrainOptions(lr=0.05, seed=SEED, momentum=0.9, sync="fws")) as trainer:
        trainer.step(*batches[0], 5)
        before = _server_state(serve.last)
        device = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        if where == "wire":
            trainer._stub = _CorruptsGradients(trainer._stub)
            error, message = RemoteError, "unusable gradient: the gradient at the cut has NaN"
        else:
            backward = trainer.replica.backward
            trainer.replica.backward = lambda *args: (backward(*args), "gradient")[1]
            error, message = ConfigError, "non-finite gradient; nothing was updated"
        with pytest.raises(error, match=message + ".*the server's update of this round was "
                                                  "taken back"):
            trainer.step(*batches[1], 5)
        _assert_bit_identical(before, _server_state(serve.last))
        _assert_bit_identical(device, trainer.model.state_dict())
        trainer.replica.__dict__.pop("backward", None)
        trainer.step(*batches[2], 3)  # FWS moves 4..5 back to the device
        trained = trainer.final_model()
    _assert_same_state(trained, _unsplit([batches[0], batches[2]], lr=0.05, momentum=0.9))


_POPEN = subprocess.Popen


def _server_script(monkeypatch, script: str) -> list[subprocess.Popen]:
    """local_training_server runs ``script`` (python -c) instead of serve-training."""
    started = []

    def popen(cmd, **kwargs):
        started.append(_POPEN([sys.executable, "-c", script], **kwargs))
        return started[-1]
    monkeypatch.setattr(subprocess, "Popen", popen)
    return started


_CHATTY = "import sys; sys.stderr.write('log line\\n' * 25_000); sys.stderr.flush(); "


def test_the_local_servers_output_is_drained(monkeypatch):
    """The spawned server's stderr was a pipe nobody read: a server that logged more than
    the pipe holds (64 KiB) blocked on its next write, before or after it listened. Now both
    outputs are drained; a server that could not start is quoted by its last lines."""
    started = _server_script(monkeypatch, _CHATTY + "print('listening on 127.0.0.1:1', "
                             "flush=True); " + _CHATTY + "print('x' * 200_000, flush=True)")
    with local_training_server("digits_cnn", lr=0.05, momentum=0.0, seed=SEED,
                               timeout_s=60) as address:
        assert address == "127.0.0.1:1"
        assert started[0].wait(timeout=60) == 0  # it wrote all it had: nothing blocked it
    _server_script(monkeypatch, _CHATTY + "sys.exit('the last words')")
    with pytest.raises(RemoteError, match=r"(?s)did not start: .*log line\nthe last words$"), \
            local_training_server("digits_cnn", lr=0.05, momentum=0.0, seed=SEED, timeout_s=60):
        pass
