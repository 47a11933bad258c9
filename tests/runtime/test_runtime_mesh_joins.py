"""A mesh's joins over the data plane, and its aggregator batching (issue 39, 2): the mesh of
``test_runtime_mesh`` served on ports, every hop made to use the data plane
(``data_plane="tcp"`` where it is chosen, and checked where it is found)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from test_runtime_joins import hold_the_first_until_two_queue
from test_runtime_mesh import (  # noqa: F401 - fixtures
    BRANCHES,
    TOL,
    Hooked,
    Mesh,
    _fail_one_branch,
    _input,
    plan,
    problem,
    program,
)


def _data_planes(served: Mesh) -> list[str]:
    """How the root calls each branch, and each branch the aggregator."""
    return [served.root.handler.next_hop.data_plane,
            *(branch.handler.next_hop.data_plane for branch in served.branches.values())]


def test_mesh_joins_over_the_data_plane_equal_unsplit_and_a_failing_branch_fails_cleanly(
        program):  # noqa: F811
    served = Mesh(program, {"join_timeout_s": 60.0}, data_plane="tcp")
    try:
        _fail_one_branch(program, served)  # b0's parked part dropped at once, then one more
        with served.client(data_plane="tcp") as client:
            for seed in range(2):
                out = client.request([_input(seed)]).outputs[0]
                assert torch.allclose(out, program.unsplit([_input(seed)])[0], atol=TOL)
        planes = _data_planes(served)
        assert planes[0] == ", ".join(f"{b}: tcp 127.0.0.1:{served.branches[b].data_port}"
                                      for b in BRANCHES)
        assert planes[1:] == [f"tcp 127.0.0.1:{served.agg.data_port}"] * len(BRANCHES)
    finally:
        served.stop()


def test_the_aggregator_batches_complete_joins_equal_to_the_unsplit_model(program):  # noqa: F811
    """As the star's sink: the first complete join waits inside its compute until two more
    are queued at the aggregator's batcher, which runs them as one batch."""
    served = Mesh(program, {"max_batch": 8})
    batcher = served.agg.handler.batcher
    assert batcher is not None, served.agg.handler.batching
    hold_the_first_until_two_queue(program, "agg", batcher)
    try:
        with served.client() as client, ThreadPoolExecutor(3) as pool:
            outs = list(pool.map(lambda seed: client.request([_input(seed)]).outputs[0],
                                 range(30, 33)))
        for seed, out in zip(range(30, 33), outs, strict=True):
            assert torch.allclose(out, program.unsplit([_input(seed)])[0], atol=TOL)
        assert (batcher.batches_run, batcher.requests_batched) == (1, 2)
        assert (served.agg.handler.join.computed, served.agg.handler.join.pending) == (3, 0)
    finally:
        served.stop()
