"""Concurrent sessions batched at a quantized stage (issue 53, item 3): the KV pool's rows, the
leader/follower :class:`StepBatcher`, decode steps of several sessions as one ONNX Runtime run
(each row what it would be alone), the session table giving a row back before it admits the
next session, and generations on threads through a served split, each with the tokens it
has alone.

Batches are made deterministic where they are asserted: a compute held on an event until the
other steps queued; no timing is asserted."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("onnxruntime")

from edgesplit.errors import ConfigError, SessionsBusyError
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.model.gguf import GGUFModel
from edgesplit.llm.stage.batching import StepBatcher
from edgesplit.llm.stage.kv_pool import KVPool
from edgesplit.llm.stage.kv_sessions import LLMSessions
from edgesplit.llm.stage.onnx_stage import OnnxStage, RowStep
from edgesplit.runtime.sessions import SessionTable
from helpers import server_for
from tiny_gguf import TINY, write_tiny_gguf

LAYERS = int(TINY["layers"])


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    """A tiny GGUF, and the checkpoint cache beside it (planning dequantises it once there,
    for its config)."""
    where = tmp_path_factory.mktemp("batch")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGESPLIT_CACHE_DIR", str(where / "cache"))
        yield write_tiny_gguf(where / "tiny.gguf", "Q4_1", tied=False)


# ---- the pool -----------------------------------------------------------------------------------
def test_rows_go_lowest_first_and_come_back_on_close_or_when_dropped():
    pool = KVPool(2, 1, 8, 4, capacity=3)
    a, b, c = pool.take(), pool.take(), pool.take()
    assert [a.row, b.row, c.row] == [0, 1, 2]
    with pytest.raises(SessionsBusyError, match="all 3 KV cache rows"):
        pool.take()
    b.length = 5
    b.close()
    b.close()  # harmless
    assert b.closed and pool.free == 1
    again = pool.take()
    assert again.row == 1 and again.length == 0  # a fresh row holds nothing
    del a
    gc.collect()
    assert pool.take().row == 0  # a dropped slot's row came back
    assert pool.rows(1, 3)[0][0].shape == (2, 1, 8, 4)
    assert np.shares_memory(pool.rows(1, 3)[0][0], pool.keys[0])  # views, not copies


def test_a_session_table_lets_a_value_go_before_admitting_the_next():
    gone: list[str] = []
    table: SessionTable[str] = SessionTable(1, device="d", let_go=gone.append)
    with table.held("s1", None, lambda: "v1"):
        pass
    with table.held("s2", None, lambda: "v2"):  # evicts s1: let go first
        assert gone == ["v1"]
        table.end("s2")  # held: let go once the call ends
        assert gone == ["v1"]
    assert gone == ["v1", "v2"]


def test_kv_sessions_give_a_row_back_so_a_one_row_stage_serves_one_session_after_another(
        gguf_path):
    stage = OnnxStage(GGUFModel(gguf_path), 0, LAYERS, embed=True, head=True, max_context=16)
    sessions = LLMSessions("d", stage.new_cache, max_sessions=1, max_context=16)
    for name in ("a", "b", "c"):  # each evicts the one before; its row is the next one's
        with sessions.step(name, 0, 3) as state:
            stage.step(np.array([[1, 2, 3]]), 0, state.cache)
    assert stage.pool is not None and stage.pool.free == 0 and len(sessions) == 1


# ---- the batcher ------------------------------------------------------------------------------
class _HeldCompute:
    """A compute that records each batch and holds the first until ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, steps: list[str]) -> list[str]:
        self.batches.append(list(steps))
        self.entered.set()
        self.release.wait(5)
        if any(s.startswith("bad") for s in steps):
            raise ValueError(f"{steps} failed")
        return [s.upper() for s in steps]


def _run_all(batcher: StepBatcher[str], compute: _HeldCompute, first: str,
             rest: list[str]) -> dict[str, object]:
    """``first`` computes (held) while ``rest`` queue; then all finish: each step's outcome."""
    out: dict[str, object] = {}

    def go(step: str) -> None:
        try:
            out[step] = batcher.run(step)
        except ValueError as exc:
            out[step] = exc

    threads = [threading.Thread(target=go, args=(first,))]
    threads[0].start()
    assert compute.entered.wait(5)
    for step in rest:
        threads.append(threading.Thread(target=go, args=(step,)))
        threads[-1].start()
    while len(batcher._queue) < len(rest):  # all queued behind the held compute
        threading.Event().wait(0.01)
    compute.release.set()
    for t in threads:
        t.join(5)
    return out


def test_steps_queued_while_one_computes_run_as_one_batch_and_prefills_alone():
    compute = _HeldCompute()
    batcher = StepBatcher(compute, lambda s: not s.startswith("p"), max_batch=3)
    out = _run_all(batcher, compute, "d0", ["d1", "p1", "d2", "d3", "d4"])
    assert all(out[s] == s.upper() for s in out)  # each its own result
    assert compute.batches[0] == ["d0"]  # a lone step runs at once
    assert compute.batches[1] == ["d1", "d2", "d3"]  # the queue's decodes, up to max_batch
    assert sorted(map(tuple, compute.batches[2:])) == [("d4",), ("p1",)]
    assert batcher.batches == 1 and batcher.batched == 3


def test_a_failing_batch_runs_again_step_by_step_so_a_failure_is_its_own():
    compute = _HeldCompute()
    batcher = StepBatcher(compute, lambda s: True, max_batch=4)
    out = _run_all(batcher, compute, "d0", ["d1", "bad", "d2"])
    assert out["d1"] == "D1" and out["d2"] == "D2" and isinstance(out["bad"], ValueError)
    assert ["d1", "bad", "d2"] in compute.batches and ["d1"] in compute.batches


# ---- batched decode ----------------------------------------------------------------------------
@pytest.mark.parametrize("activations", ["exact", "int8"])
def test_decode_steps_of_several_sessions_as_one_run_equal_each_alone(gguf_path, activations):
    """Rows 0, 2 and 3 decode as one run while row 1 sits idle in the span; each gets what
    it gets alone on another stage, and row 1 then continues as if nothing ran beside it."""
    model, rng = GGUFModel(gguf_path), np.random.default_rng(0)
    kw = {"max_context": 32, "activations": activations, "sessions": 4}
    batched = OnnxStage(model, 0, LAYERS, embed=True, head=True, **kw)
    alone = OnnxStage(model, 0, LAYERS, embed=True, head=True, **kw)
    ours, refs = [batched.new_cache() for _ in range(4)], [alone.new_cache() for _ in range(4)]
    for mine, ref, n in zip(ours, refs, (5, 9, 3, 7), strict=True):
        prompt = rng.integers(0, TINY["vocab"], (1, n))
        batched.step(prompt, 0, mine)
        alone.step(prompt, 0, ref)
    tol = {"rtol": 1e-4, "atol": 1e-4} if activations == "exact" else {"rtol": 0, "atol": 0}
    for rows in ([0, 2, 3], [0, 1, 2, 3], [1]):
        tokens = rng.integers(0, TINY["vocab"], len(rows))
        got = batched.step_batch([RowStep(np.array([[t]]), ours[r].length, ours[r])
                                  for r, t in zip(rows, tokens, strict=True)])
        for r, t, logits in zip(rows, tokens, got, strict=True):
            expected = alone.step(np.array([[t]]), refs[r].length, refs[r])
            np.testing.assert_allclose(logits, expected, **tol)
            assert ours[r].length == refs[r].length
    assert [c.length for c in ours] == [7, 11, 5, 9]


def test_a_stage_without_the_head_batches_hidden_states(gguf_path):
    model = GGUFModel(gguf_path)
    stage = OnnxStage(model, 1, LAYERS, embed=False, head=False, max_context=16, sessions=2,
                      activations="exact")
    caches = [stage.new_cache(), stage.new_cache()]
    xs = [np.random.default_rng(i).standard_normal((1, 1, TINY["hidden"])).astype(np.float32)
          for i in range(2)]
    got = stage.step_batch([RowStep(x, 0, c) for x, c in zip(xs, caches, strict=True)])
    for c in caches:
        c.crop(0)
    for x, c, out in zip(xs, caches, got, strict=True):
        assert out.shape == (1, 1, TINY["hidden"])
        np.testing.assert_allclose(out, stage.step(x, 0, c), rtol=1e-4, atol=1e-4)


def test_a_batch_of_prompts_or_of_one_session_twice_is_refused(gguf_path):
    stage = OnnxStage(GGUFModel(gguf_path), 0, LAYERS, embed=True, head=True, max_context=16,
                      sessions=2)
    a, b = stage.new_cache(), stage.new_cache()
    with pytest.raises(ConfigError, match="one token of each of distinct sessions"):
        stage.step_batch([RowStep(np.array([[1, 2]]), 0, a), RowStep(np.array([[1]]), 0, b)])
    with pytest.raises(ConfigError, match="one token of each of distinct sessions"):
        stage.step_batch([RowStep(np.array([[1]]), 0, a), RowStep(np.array([[1]]), 1, a)])


# ---- served -------------------------------------------------------------------------------------
def _wait_for_company(batcher: StepBatcher, others: int) -> None:
    """Make ``batcher``'s first lone decode step wait (up to 2 s) until ``others`` steps
    queued behind it, so the next batch holds them: a tiny model computes in microseconds,
    and threads would rarely meet otherwise."""
    compute, held = batcher.compute, threading.Event()

    def holding(steps):
        if not held.is_set() and len(steps) == 1 and steps[0].x.shape[1] == 1:
            held.set()
            for _ in range(200):
                if len(batcher._queue) >= others:
                    break
                threading.Event().wait(0.01)
        return compute(steps)

    batcher.compute = holding


def test_concurrent_generations_through_a_served_split_each_get_their_own_tokens(gguf_path):
    """Four sessions generate at once over two stages (the first in the client, shared by the
    threads; the second served): each gets the tokens it gets alone, with decode steps of
    several of them batched."""
    full = get_topology("home-wifi")
    plan = plan_llm_at(str(gguf_path), chain("t", full.devices[:2], [full.links[0].link]),
                       (0, 3, LAYERS + 2),
                       # int8 activations: a batch's rows equal each alone bit for bit (a
                       # float batch rounds apart, and a near tie could flip a token)
                       LLMWorkload(prompt_tokens=4, new_tokens=12, max_context=32, sessions=4,
                                   activations="int8"),
                       dtype="gguf", method="test")
    prompts = [[3, 17, 99, 5], [42, 7, 150, 1], [9, 8, 7, 6], [11, 12, 13, 14]]
    server = server_for(plan, plan.devices[1].name, data_port=None)
    try:
        with LLMClient(plan, server.loopback_channel()) as client:
            alone = [[t.token for t in client.generate(p, 12, session=f"alone{i}")]
                     for i, p in enumerate(prompts)]
            for i in range(len(prompts)):
                client.end_session(f"alone{i}")
            together: dict[int, list[int]] = {}
            _wait_for_company(client.stage.steps, len(prompts) - 1)

            def chat(i: int) -> None:
                together[i] = [t.token for t in client.generate(prompts[i], 12,
                                                                session=f"s{i}")]

            threads = [threading.Thread(target=chat, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            batched = client.stage.steps.batched
    finally:
        server.stop(0)
    assert [together[i] for i in range(len(prompts))] == alone
    assert batched > 0


def test_more_sessions_than_a_device_holds_are_refused_before_any_cache(gguf_path):
    """A stage served with more sessions than its plan device's memory holds (each a KV
    cache row at the max context) is refused in one line, naming how many fit."""
    from edgesplit.llm.stage.server import check_sessions_fit

    full = get_topology("home-wifi")
    plan = plan_llm_at(str(gguf_path), chain("t", full.devices[:2], [full.links[0].link]),
                       (0, 3, LAYERS + 2),
                       LLMWorkload(prompt_tokens=4, new_tokens=12, max_context=256),
                       dtype="gguf", method="test")
    llm = plan.llm
    assert llm is not None
    stage = llm.stages[1]
    per_session = stage.kv_cache_bytes
    limit = stage.memory_bytes + 2 * per_session  # room for 3 sessions
    llm.stages[1] = stage.model_copy(update={"memory_limit_bytes": limit})
    check_sessions_fit(llm, 1, "d", 3)
    with pytest.raises(ConfigError, match="max_sessions=3 or fewer") as info:
        check_sessions_fit(llm, 1, "d", 4)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="or fewer"):
        server_for(plan.model_copy(update={"llm": llm}), plan.devices[1].name, data_port=None,
                   max_sessions=50)
