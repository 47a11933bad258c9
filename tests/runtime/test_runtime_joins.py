"""Star joins over the data plane, and the sink batching complete joins (issue 39, 2).

The star of ``test_runtime_star`` (three camera sensors, one aggregator), served on real
ports: the client reaches the sensors, and the sensors the aggregator, over the data plane
(``data_plane="tcp"`` insists on it: a call it cannot take fails rather than going over
gRPC). Batching and failures are shown with an instrumented backend, never with wall-clock
times; every answer is compared with the unsplit model in the same run.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pytest
import torch

from edgesplit.cli import app
from edgesplit.errors import RemoteError
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.backends import TorchBackend
from edgesplit.runtime.star import StarClient
from helpers import free_port, server_for, wait_until
from test_runtime import ServerProc
from test_runtime_star import (  # noqa: F401 - fixtures
    SENSORS,
    TOL,
    _views,
    graph,
    model_file,
    module,
    plan,
    runner,
)


@pytest.fixture
def program(plan, graph) -> PlanProgram:  # noqa: F811
    """A fresh program per test: tests swap backends."""
    return PlanProgram.load(plan, graph)


class PortStar:
    """The aggregator and the three sensors, each a server on its own port."""

    def __init__(self, program: PlanProgram, sink: Mapping[str, Any] | None = None,
                 **sources: Any) -> None:
        self.program = program
        self.sink = server_for(program, "aggregator", shape=False, **(sink or {}))
        at = f"127.0.0.1:{self.sink.start()}"
        self.sensors = {s: server_for(program, s, next_address=at, shape=False,
                                      **sources) for s in SENSORS}
        self.addresses = {s: f"127.0.0.1:{server.start()}" for s, server in self.sensors.items()}

    def client(self, **options: Any) -> StarClient:
        return StarClient(self.program, self.addresses, **{"timeout_s": 30.0, **options})

    def stop(self) -> None:
        for server in (*self.sensors.values(), self.sink):
            server.stop(0)


class Hooked(TorchBackend):
    """The torch backend, with ``hook(step)`` run inside every compute first."""

    def __init__(self, hook: Callable[[str], None]) -> None:
        super().__init__()
        self.hook = hook

    def run(self, step, values, state):
        self.hook(step.name)
        return super().run(step, values, state)


class _Counted(queue.Queue):
    """The batcher's queue, counting what was put in it (its worker takes the first out)."""

    puts = 0

    def put(self, item, block=True, timeout=None) -> None:
        self.puts += 1
        super().put(item, block, timeout)


def hold_the_first_until_two_queue(program: PlanProgram, step: str, batcher: Any) -> None:
    """The first compute of ``step`` (a lone request's path) waits inside until two more
    requests are queued at ``batcher``, so those two run as one batch."""
    batcher._queue = queued = _Counted()
    first = threading.Event()

    def hold_the_first(_: str) -> None:
        if not first.is_set():
            first.set()
            assert wait_until(lambda: queued.puts >= 2, 20)

    program.step(step).backend = Hooked(hold_the_first)


def test_a_star_over_the_data_plane_equals_the_unsplit_model(program):
    star = PortStar(program, data_plane="tcp")
    try:
        with star.client(data_plane="tcp") as client:
            for seed in range(3):
                xs = _views(seed)
                result = client.request(xs)
                assert torch.allclose(result.outputs[0], program.unsplit(xs)[0], atol=TOL)
            assert client.data_plane.count(": tcp 127.0.0.1:") == len(SENSORS)
        assert {f"{s}.compute_ms" for s in SENSORS} | {"aggregator.compute_ms"} <= \
            set(result.hops_ms)
        for server in star.sensors.values():  # each sensor reached the sink's data plane
            assert server.handler.next_hop.data_plane == f"tcp 127.0.0.1:{star.sink.data_port}"
        join = star.sink.handler.join
        assert (join.computed, join.pending, join.parked, join.busy) == (3, 0, 0, 0)
    finally:
        star.stop()


def test_the_sink_batches_complete_joins_and_each_answer_equals_the_unsplit_model(program):
    """The first complete join computes alone and waits inside its compute until two more
    are queued at the sink's batcher: those two run as one batch. Every answer equals the
    unsplit model on its own inputs."""
    star = PortStar(program, {"max_batch": 8}, data_plane="tcp")
    batcher = star.sink.handler.batcher
    assert batcher is not None, star.sink.handler.batching
    hold_the_first_until_two_queue(program, "aggregator", batcher)
    try:
        with star.client(data_plane="tcp") as client:
            def one(seed: int) -> float:
                xs = _views(seed)
                out = client.request(xs).outputs[0]
                return float((out - program.unsplit(xs)[0]).abs().max())

            with ThreadPoolExecutor(3) as pool:
                diffs = list(pool.map(one, range(20, 23)))
        assert max(diffs) <= TOL
        assert (batcher.batches_run, batcher.requests_batched) == (1, 2)
        assert (star.sink.handler.join.computed, star.sink.handler.join.pending) == (3, 0)
    finally:
        star.stop()


def _fail_sensor2_once_the_others_park(program: PlanProgram, star: PortStar) -> None:
    """sensor2 fails once the other sensors' parts wait at the sink: only a cancellation of
    their calls drops that join before its timeout (a minute here)."""
    join = star.sink.handler.join

    def fail(name: str) -> None:
        assert wait_until(lambda: join.pending == 1 and join.parked == 2)
        raise RuntimeError("sensor exploded")

    program.step("sensor2").backend = Hooked(fail)


@pytest.mark.parametrize("client_plane", ["tcp", "grpc"])
def test_a_failing_source_fails_the_request_and_its_parked_parts_are_dropped(program,
                                                                             client_plane):
    """The sensors reach the sink over the data plane; the client reaches them over it too,
    or over gRPC (then a sensor's data-plane call to the sink is cancelled through the gRPC
    call's callback). The client names the failing source, cancels the other calls, and
    the sink drops their parts at once, computing nothing; the next request goes through."""
    star = PortStar(program, {"join_timeout_s": 60.0}, data_plane="tcp")
    try:
        _fail_sensor2_once_the_others_park(program, star)
        with star.client(data_plane=client_plane) as client, \
                pytest.raises(RemoteError, match=r"(?s)source sensor2.*sensor exploded"):
            client.request(_views(3))
        join = star.sink.handler.join
        assert wait_until(lambda: join.pending == 0 and join.parked == 0)
        assert (join.computed, join.busy) == (0, 0)
        program.step("sensor2").backend = TorchBackend()
        with star.client(data_plane=client_plane) as client:
            xs = _views(4)
            assert torch.allclose(client.request(xs).outputs[0], program.unsplit(xs)[0],
                                  atol=TOL)
    finally:
        star.stop()


def test_a_source_slower_than_the_deadline_times_out_and_leaves_no_join(program):
    """sensor2 computes past the client's 1 s deadline: the request fails DEADLINE_EXCEEDED,
    the other parts are dropped, and sensor2's late result is never joined."""
    star = PortStar(program, {"join_timeout_s": 60.0}, data_plane="tcp")
    release = threading.Event()
    program.step("sensor2").backend = Hooked(lambda _: release.wait(20) and None)
    try:
        with star.client(data_plane="tcp", timeout_s=1.0) as client, \
                pytest.raises(RemoteError, match="did not answer in time"):
            client.request(_views(5))
        join = star.sink.handler.join
        assert wait_until(lambda: join.pending == 0 and join.parked == 0)
        sensor2 = star.sensors["sensor2"]._frames
        assert sensor2 is not None and sensor2._busy == 1  # still computing
        release.set()  # it finishes for a caller that left: nothing computes at the sink
        assert wait_until(lambda: sensor2._busy == 0)
        assert (join.computed, join.pending, join.busy) == (0, 0, 0)
    finally:
        release.set()
        star.stop()


class _Recorded(ServerProc):
    """A server process whose stdout lines are kept (the ready line says how it batches)."""

    lines: ClassVar[list[str]] = []

    @staticmethod
    def _pump(proc, lines) -> None:
        for line in proc.stdout:
            _Recorded.lines.append(line)
            lines.put(line)
        lines.put(None)


@pytest.mark.xdist_group("runtime")
def test_cli_serves_a_batching_sink_and_runs_the_star_over_the_data_plane(plan,  # noqa: F811
                                                                          tmp_path):
    path = tmp_path / "star.json"
    plan.save(path)
    port = free_port()
    aggregator = _Recorded(path, "aggregator", "--no-shape", "--max-batch", "4",
                           log_dir=tmp_path, port=port)
    sensors = {}
    try:
        for s in SENSORS:
            sensors[s] = ServerProc(path, s, "--no-shape", "--next", f"127.0.0.1:{port}",
                                    "--data-plane", "tcp", log_dir=tmp_path)
        assert aggregator.address == f"127.0.0.1:{port}"
        ready = [line for line in _Recorded.lines if "device=aggregator" in line]
        assert ready and " batch=4 " in ready[-1], ready
        result = runner.invoke(app, ["run", str(path), "--no-shape", "-n", "6", "-c", "3",
                                     "--timeout-s", "30", "--json", "--data-plane", "tcp",
                                     *(f"--source={s}={p.address}" for s, p in sensors.items())])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert (doc["ok"], doc["errors"]) == (6, 0)
        assert doc["max_abs_diff"] <= TOL
    finally:
        for proc in (*sensors.values(), aggregator):
            proc.kill()
