"""The LLM runtime: stages served by llm_stage_server, driven by LLMClient, against
single-process ``model.generate``; sessions (context limit, interleaving, eviction, ending) and
malformed requests.

Stages run in-process over the loopback transport (the servicer code without sockets), one
test over real sockets and the data plane. The weights are the registered tiny models' with a
seeded perturbation of 0.3 (their random initialisation makes GPT-2 repeat one token, and
0.1 still left Gemma and Qwen2 repeating one, which would make equality trivial), shared by
reference, stages and client.
"""

from __future__ import annotations

import itertools

import grpc
import pytest
import torch

from edgesplit.errors import ConfigError, ContextLimitError, SessionError
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.llm.generate.client import LLMClient
from edgesplit.llm.stage.kv_sessions import OWNER_KEY
from edgesplit.llm.stage.wire import END_SESSION, POSITION, message
from edgesplit.models.causal_lm import create_causal_lm
from edgesplit.plan.model import PLAN_VERSION, Plan
from edgesplit.runtime.dataplane import Hop
from edgesplit.runtime.options import CallOptions
from edgesplit.runtime.planned import SESSION_KEY
from edgesplit.runtime.program import PlanProgram
from edgesplit.runtime.shell import ServingShell
from helpers import listening, perturbed, server_for

PROMPT = 8
NEW = 10
MAX_CONTEXT = 32  # PROMPT, NEW and MAX_CONTEXT are two_stage_plan's too (conftest.py)
# one tiny model per supported family (llama_tiny and gpt2_tiny also run the session tests)
FAMILIES = ("llama_tiny", "gpt2_tiny", "mistral_tiny", "qwen2_tiny", "qwen3_tiny", "gemma_tiny",
            "phi3_tiny")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    out = {}
    for name in FAMILIES:
        model = perturbed(create_causal_lm(name))
        out[name] = model
    return out


def _plan(model: str, boundaries: tuple[int, ...], *, sessions: int = 1,
          max_context: int = MAX_CONTEXT) -> Plan:
    """``model`` split at ``boundaries`` over the first len-1 devices of home-wifi."""
    full = get_topology("home-wifi")
    m = len(boundaries) - 1
    topology = chain("test", full.devices[:m], [tl.link for tl in full.links[:m - 1]])
    return plan_llm_at(model, topology, boundaries,
                       LLMWorkload(prompt_tokens=PROMPT, new_tokens=NEW, max_context=max_context,
                                   sessions=sessions), method="test")


def _reference(model: torch.nn.Module, prompt: torch.Tensor, new: int = NEW) -> list[int]:
    # an explicit mask: generate would otherwise take prompt tokens equal to the pad id
    # for padding; min_new_tokens: no early stop at a random model's EOS
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                         min_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


def _prompt(model: torch.nn.Module, seed: int = 0, n: int = PROMPT) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, n), generator=g)


class Chain:
    """Servers for every stage after the first, each calling the next in-process; the
    client's address is the second device's loopback channel."""

    def __init__(self, plan: Plan, model: torch.nn.Module, **options) -> None:
        from edgesplit.llm.stage.server import head_stage

        assert plan.llm is not None
        head = head_stage(plan.llm)
        self.servers: list[ServingShell] = []
        nxt = None
        for i in range(head, 0, -1):
            server = server_for(plan, plan.devices[i].name, next_address=nxt, model=model,
                                data_port=None, **options)
            self.servers.insert(0, server)
            nxt = server.loopback_channel()
        self.address = nxt
        self.plan, self.model = plan, model

    def client(self, **options) -> LLMClient:
        return LLMClient(self.plan, self.address, model=self.model, **options)

    def stop(self) -> None:
        for s in self.servers:
            s.stop(0)


def _tokens(client: LLMClient, prompt: torch.Tensor, new: int = NEW) -> list[int]:
    return [t.token for t in client.generate(prompt[0].tolist(), new)]


# ---- token equality -------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("boundaries", [(0, 3, 6), (0, 2, 4, 6)], ids=["2-stage", "3-stage"])
def test_tokens_equal_generate(models, name, boundaries):
    model = models[name]
    prompt = _prompt(model)
    expected = _reference(model, prompt)
    assert len(set(expected)) > 2  # the perturbed weights do not repeat one token
    line = Chain(_plan(name, boundaries), model)
    try:
        with line.client() as client:
            got = list(client.generate(prompt[0].tolist(), NEW))
    finally:
        line.stop()
    assert [t.token for t in got] == expected
    assert [t.phase for t in got] == ["prefill"] + ["decode"] * (NEW - 1)
    assert [t.index for t in got] == list(range(NEW))
    devices = [d.name for d in line.plan.devices]
    assert all(set(t.compute_ms) == set(devices) for t in got)  # every stage reports
    assert all(a.elapsed_ms <= b.elapsed_ms for a, b in itertools.pairwise(got))


@pytest.mark.parametrize("boundaries", [(0, 0, 3, 6), (0, 3, 3, 6), (0, 3, 6, 6)],
                         ids=["client-relays", "middle-relays", "last-empty"])
def test_relaying_stages(models, boundaries):
    model = models["llama_tiny"]
    prompt = _prompt(model, 3)
    line = Chain(_plan("llama_tiny", boundaries), model)
    try:
        with line.client() as client:
            assert _tokens(client, prompt) == _reference(model, prompt)
    finally:
        line.stop()


def test_single_device_plan_needs_no_server(models):
    model = models["gpt2_tiny"]
    prompt = _prompt(model, 4)
    with LLMClient(_plan("gpt2_tiny", (0, 6)), model=model) as client:
        assert _tokens(client, prompt) == _reference(model, prompt)


def test_over_sockets_and_the_data_plane(models):
    """Three stages as real servers on 127.0.0.1: gRPC for Describe, the data plane for the
    steps, a bearer token on every hop."""
    model = models["gpt2_tiny"]
    plan = _plan("gpt2_tiny", (0, 2, 4, 6))
    with (listening(plan, "jetson", model=model, token="s3cret") as (_, last),
          listening(plan, "laptop", next_address=last, model=model,
                    token="s3cret") as (_, address)):
        prompt = _prompt(model, 5)
        with LLMClient(plan, address, model=model,
                       calls=CallOptions(token="s3cret")) as client:
            assert _tokens(client, prompt) == _reference(model, prompt)
            assert client._hop is not None and client._hop.data_plane.startswith("tcp ")
        with LLMClient(plan, address, model=model,
                       calls=CallOptions(token="wrong")) as client, \
                pytest.raises(Exception, match="UNAUTHENTICATED"):
            _tokens(client, prompt, 2)


# ---- sessions -------------------------------------------------------------------------------
def test_context_limit_is_checked_before_anything_runs(models, two_stage_plan):
    model = models["llama_tiny"]
    line = Chain(two_stage_plan, model)
    try:
        with line.client() as client:
            prompt = _prompt(model, 1, n=30)
            with pytest.raises(ContextLimitError, match=r"33 tokens.*max context of 32.*"
                                                        r"max_context"):
                list(client.generate(prompt[0].tolist(), 4))
            assert len(line.servers[0].handler.sessions) == 0  # nothing was sent
            # 30 + 3 - 1 = 32 tokens fit exactly
            assert len(_tokens(client, prompt, 3)) == 3
    finally:
        line.stop()


RAW_SECRET = "raw-secret"  # the raw steps' own session secret (every step carries one)


def _raw(server: ServingShell, tensors: dict[str, torch.Tensor], session: str | None,
         plan_id: str | None = None, secret: str | None = RAW_SECRET):
    hop = Hop(server.loopback_channel(), server.limit, None)
    md = [(SESSION_KEY, session)] if session else []
    md += [(OWNER_KEY, secret)] if secret else []  # a session a client made answers only it
    return hop.run(message(plan_id or server.handler.plan_id, PLAN_VERSION, 1, tensors), 10.0, md)


def test_a_step_past_the_context_fails_and_leaves_the_session_as_it_was(models, two_stage_plan):
    model = models["llama_tiny"]
    line = Chain(two_stage_plan, model)
    server = line.servers[0]
    try:
        with line.client(session="s1") as client:
            _tokens(client, _prompt(model), 4)  # the cache holds 8 + 3 tokens
        assert server.handler.sessions.length("s1") == 11
        hidden = torch.randn(1, 30, model.config.hidden_size)
        secret = client._secret  # the raw steps below continue the client's session
        with pytest.raises(grpc.RpcError) as info:
            _raw(server, {"block.1.out": hidden, POSITION: torch.tensor([11])}, "s1",
                 secret=secret)
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "would hold 41 tokens" in info.value.details()
        assert "start a new session" in info.value.details()
        assert server.handler.sessions.length("s1") == 11  # untouched
        reply = _raw(server, {"block.1.out": hidden[:, :1], POSITION: torch.tensor([11])}, "s1",
                     secret=secret)
        assert [t.name for t in reply.tensors] == ["token"]
        assert server.handler.sessions.length("s1") == 12
    finally:
        line.stop()


def test_interleaved_sessions_equal_each_alone(models):
    model = models["gpt2_tiny"]
    line = Chain(_plan("gpt2_tiny", (0, 2, 4, 6), sessions=2), model)
    prompts = [_prompt(model, 7), _prompt(model, 8, n=5)]
    try:
        a, b = line.client(session="a"), line.client(session="b")
        streams = [a.generate(prompts[0][0].tolist(), NEW), b.generate(prompts[1][0].tolist(),
                                                                          NEW)]
        got: list[list[int]] = [[], []]
        for _ in range(NEW):
            for i, stream in enumerate(streams):
                got[i].append(next(stream).token)
        assert got == [_reference(model, p) for p in prompts]
        assert all(len(s.handler.sessions) == 2 for s in line.servers)
        a.end_session()
        tables = [s.handler.sessions for s in line.servers]
        assert all("a" not in t and "b" in t for t in tables)
    finally:
        line.stop()


def test_eviction_of_the_least_recently_used_session(models):
    model = models["llama_tiny"]
    line = Chain(_plan("llama_tiny", (0, 2, 4, 6), sessions=1), model)
    try:
        a, b = line.client(session="a"), line.client(session="b")
        stream = a.generate(_prompt(model, 1)[0].tolist(), NEW)
        next(stream), next(stream)
        _tokens(b, _prompt(model, 2))  # room for one session: "a" goes
        assert [s.handler.sessions.evicted for s in line.servers] == [1, 1]
        with pytest.raises(SessionError, match=r"session 'a' is not on device 'laptop' "
                                               r"\(evicted.*send its prompt again"):
            next(stream)
        prompt = _prompt(model, 1)
        assert _tokens(a, prompt) == _reference(model, prompt)  # a new generation works
    finally:
        line.stop()


# ---- malformed requests and configuration ---------------------------------------------------
def test_malformed_requests_get_clear_statuses(models):
    model = models["llama_tiny"]
    line = Chain(_plan("llama_tiny", (0, 0, 3, 6)), model)  # the laptop starts at the embedding
    server = line.servers[0]
    ids = {"input_ids": torch.tensor([[1, 2, 3]]), POSITION: torch.tensor([0])}
    cases = [
        (ids, None, None, grpc.StatusCode.INVALID_ARGUMENT, "metadata 'edgesplit-session'"),
        (ids, "s", "0" * 16, grpc.StatusCode.FAILED_PRECONDITION, "plan mismatch"),
        ({"input_ids": ids["input_ids"]}, "s", None, grpc.StatusCode.INVALID_ARGUMENT,
         "expects tensors 'input_ids' and 'position'"),
        ({"input_ids": torch.tensor([[1, 2, 10**6]]), POSITION: torch.tensor([0])}, "s", None,
         grpc.StatusCode.INVALID_ARGUMENT, "token ids must lie in"),
        ({"input_ids": torch.randn(1, 3, 4), POSITION: torch.tensor([0])}, "s", None,
         grpc.StatusCode.INVALID_ARGUMENT, "expected int64 token ids of shape [1, T]"),
        ({"input_ids": ids["input_ids"], POSITION: torch.tensor([0, 1])}, "s", None,
         grpc.StatusCode.INVALID_ARGUMENT, "'position'"),
        ({"input_ids": ids["input_ids"], POSITION: torch.tensor([5])}, "never", None,
         grpc.StatusCode.ABORTED, "session 'never' is not on device 'laptop'"),
    ]
    try:
        for tensors, session, pid, code, text in cases:
            with pytest.raises(grpc.RpcError) as info:
                _raw(server, tensors, session, pid)
            assert info.value.code() == code, (text, info.value.details())
            assert text in info.value.details()
        _raw(server, ids, "s")
        with pytest.raises(grpc.RpcError) as info:  # out of step: the session holds 3
            _raw(server, {**ids, POSITION: torch.tensor([7])}, "s")
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert "holds 3 tokens" in info.value.details()
        _raw(server, {END_SESSION: torch.zeros(1, dtype=torch.int64)}, "s")
        assert all("s" not in s.handler.sessions for s in line.servers)
    finally:
        line.stop()


def test_wrong_hidden_shape(models):
    model = models["gpt2_tiny"]
    line = Chain(_plan("gpt2_tiny", (0, 3, 6)), model)
    try:
        with pytest.raises(grpc.RpcError) as info:
            _raw(line.servers[0], {"block.1.out": torch.randn(1, 2, 5),
                                   POSITION: torch.tensor([0])}, "s")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"[1, T, {model.config.hidden_size}]" in info.value.details()
    finally:
        line.stop()


def test_a_non_finite_hidden_state_is_refused_before_the_cache(models, two_stage_plan):
    """A NaN stored in a stage's KV cache made every later token of the session 0 without an
    error (issue 39): it is refused, nothing cached, and the session goes on."""
    model = models["llama_tiny"]
    line = Chain(two_stage_plan, model)
    server, hidden = line.servers[0], model.config.hidden_size
    try:
        good = torch.randn(1, 2, hidden)
        _raw(server, {"block.1.out": good, POSITION: torch.tensor([0])}, "s")
        for bad in (float("nan"), float("inf")):
            x = torch.randn(1, 1, hidden)
            x[0, 0, 3] = bad
            with pytest.raises(grpc.RpcError) as info:
                _raw(server, {"block.1.out": x, POSITION: torch.tensor([2])}, "s")
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "NaN or infinite" in info.value.details()
        assert server.handler.sessions.length("s") == 2  # nothing was cached
        _raw(server, {"block.1.out": torch.randn(1, 1, hidden), POSITION: torch.tensor([2])},
             "s")
    finally:
        line.stop()


def test_a_session_answers_only_the_client_that_made_it(models):
    """Two clients that pick one session id used to decode on each other's cache (wrong
    tokens, no error), and anyone knowing an id could continue or end it (issue 39). Each
    client's secret now binds its sessions: the other is refused on every stage, in one
    SessionError, and the owner's generation is untouched."""
    model = models["llama_tiny"]
    line = Chain(_plan("llama_tiny", (0, 2, 4, 6)), model)
    prompt = _prompt(model, 5)
    try:
        with line.client(session="shared") as owner, line.client(session="shared") as other:
            first = list(owner.generate(prompt[0].tolist(), 4))
            with pytest.raises(SessionError, match="belongs to another client"):
                _tokens(other, _prompt(model, 6), 2)  # a fresh start would take the id
            with pytest.raises(SessionError, match="belongs to another client"):
                other.end_session()
            assert all(s.handler.sessions.length("shared") > 0 for s in line.servers)
            more = [*prompt[0].tolist(), *(t.token for t in first)]
            assert [t.token for t in owner.generate(more, 3)] == _reference(
                model, torch.tensor([more]), 3)
    finally:
        line.stop()


def test_configuration_errors(models):
    plan = _plan("llama_tiny", (0, 2, 4, 6))
    model = models["llama_tiny"]
    with pytest.raises(ConfigError, match=r"first of the chain.*llm generate"):
        server_for(plan, "phone", model=model)
    with pytest.raises(ConfigError, match="next_address"):
        server_for(plan, "laptop", model=model)
    with pytest.raises(ConfigError, match="not in the plan"):
        server_for(plan, "toaster", model=model)
    with pytest.raises(ConfigError, match="nothing to serve"):
        server_for(_plan("llama_tiny", (0, 3, 6, 6)), "jetson", model=model)
    with pytest.raises(ConfigError, match="address"):
        LLMClient(plan, model=model)
    with pytest.raises(ConfigError, match=r"llm serve.*llm generate"):
        PlanProgram.load(plan)


def test_a_failure_further_down_the_chain_rolls_every_stage_back(models):
    """The last stage keeps one session, the middle one two: "a" evicted at the end only.
    Its next step fails there, and the middle stage's cache for "a" is as it was."""
    model = models["llama_tiny"]
    plan = _plan("llama_tiny", (0, 2, 4, 6), sessions=2)
    with (server_for(plan, "jetson", model=model, data_port=None, max_sessions=1) as last,
          server_for(plan, "laptop", next_address=last.loopback_channel(), model=model,
                     data_port=None) as middle):
        a = LLMClient(plan, middle.loopback_channel(), model=model, session="a")
        b = LLMClient(plan, middle.loopback_channel(), model=model, session="b")
        stream = a.generate(_prompt(model, 1)[0].tolist(), NEW)
        next(stream)
        held = middle.handler.sessions.length("a")
        _tokens(b, _prompt(model, 2), 2)
        with pytest.raises(SessionError, match="not on device 'jetson'"):
            next(stream)
        assert middle.handler.sessions.length("a") == held == PROMPT
        layer = middle.handler.sessions.state("a").cache.layers[2]  # the middle stage's first
        assert layer.get_seq_length() == held
        assert a.sessions.length("a") == held  # the client's own stage too


def test_a_stream_of_steps_gives_the_tokens_of_single_calls_and_a_bad_step_fails_alone(models):
    """RunStream: one call carrying a session's steps; each reply's token equals the one the
    same step gets as its own Run call, and a malformed step in the middle fails alone."""
    from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc

    model = models["llama_tiny"]
    line = Chain(_plan("llama_tiny", (0, 3, 6), sessions=2), model)
    server = line.servers[0]
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(1, 6, model.config.hidden_size, generator=g)
    steps = [{"block.1.out": hidden[:, :4], POSITION: torch.tensor([0])},
             {"block.1.out": hidden[:, 4:5], POSITION: torch.tensor([4])},
             {"block.1.out": torch.randn(1, 1, 3), POSITION: torch.tensor([5])},  # bad width
             {"block.1.out": hidden[:, 5:6], POSITION: torch.tensor([5])}]
    try:
        singles = [_raw(server, s, "alone") for i, s in enumerate(steps) if i != 2]
        bundles = [message(server.handler.plan_id, PLAN_VERSION, i + 1, s).to_pb()
                   for i, s in enumerate(steps)]
        stub = pb_grpc.PartitionServiceStub(server.loopback_channel())
        replies = list(stub.RunStream(iter(bundles), timeout=30,
                                      metadata=[(SESSION_KEY, "streamed"),
                                                (OWNER_KEY, RAW_SECRET)]))
        assert [r.request_id for r in replies] == [1, 2, 3, 4]
        assert "hidden state" in replies[2].error and not replies[2].tensors
        got = [bytes(r.tensors[0].data) for i, r in enumerate(replies) if i != 2]
        assert got == [bytes(s.tensors[0].data) for s in singles]
    finally:
        line.stop()


# ---- issue 39: sessions bound to their creator, finite caches, context limits ----------------
def test_a_session_is_refused_to_any_other_secret_and_to_none(models, two_stage_plan):
    """Every step and end carries the session's secret: without one INVALID_ARGUMENT before
    anything is allocated; with another PERMISSION_DENIED, whether it continues, opens the id
    afresh (never joined) or ends it; the owner's cache stays as it was."""
    model = models["llama_tiny"]
    line = Chain(two_stage_plan, model)
    server, hidden = line.servers[0], model.config.hidden_size
    step = {"block.1.out": torch.randn(1, 3, hidden), POSITION: torch.tensor([0])}
    try:
        with pytest.raises(grpc.RpcError) as info:
            _raw(server, step, "s", secret=None)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert OWNER_KEY in info.value.details()
        assert len(server.handler.sessions) == 0
        _raw(server, step, "s")  # the owner opens it
        more = {"block.1.out": torch.randn(1, 1, hidden), POSITION: torch.tensor([3])}
        for tensors in (step, more, {END_SESSION: torch.zeros(1, dtype=torch.int64)}):
            with pytest.raises(grpc.RpcError) as info:
                _raw(server, tensors, "s", secret="someone else")
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "belongs to another client" in info.value.details()
        assert server.handler.sessions.length("s") == 3
        _raw(server, more, "s")
        assert server.handler.sessions.length("s") == 4
    finally:
        line.stop()


def test_a_client_on_another_clients_session_gets_a_session_owner_error(models, two_stage_plan):
    """The client's error is SessionOwnerError, at once: no re-prefill from position 0."""
    from edgesplit.errors import SessionOwnerError

    model = models["llama_tiny"]
    line = Chain(two_stage_plan, model)
    prompt = _prompt(model, 2)[0].tolist()
    try:
        with line.client(session="x") as owner, line.client(session="x") as other:
            _tokens(owner, torch.tensor([prompt]), 2)
            other._conversations["x"] = prompt[:4]  # as if it had made the session: it continues
            with pytest.raises(SessionOwnerError):
                _tokens(other, torch.tensor([prompt]), 2)
            assert line.servers[0].handler.sessions.length("x") == PROMPT + 1
    finally:
        line.stop()


def test_owner_digests_are_compared_in_constant_time(monkeypatch):
    import hmac

    from edgesplit.llm.stage import kv_sessions as llm_sessions


    calls = []

    def compare(a, b):
        calls.append((a, b))
        return a == b

    monkeypatch.setattr(hmac, "compare_digest", compare)
    sessions = llm_sessions.LLMSessions("d", lambda: None, max_sessions=2, max_context=8)
    mine, theirs = llm_sessions.owner_digest("mine"), llm_sessions.owner_digest("theirs")
    with sessions.step("s", 0, 1, mine):
        pass
    calls.clear()
    with pytest.raises(SessionError, match="another client"):
        sessions.check_owner("s", theirs)
    assert calls  # the digests went through hmac.compare_digest
    with pytest.raises(SessionError, match="another client"):
        sessions.end("s", None)
    assert sessions.end("s", mine)


def test_a_stage_whose_blocks_overflow_caches_nothing(models, two_stage_plan):
    """A finite hidden state that the stage's own blocks turn into NaN/inf (a half-precision
    overflow, broken weights) used to be cached: refused, and the cache keeps its length."""
    import copy

    model = copy.deepcopy(models["llama_tiny"])  # the shared weights stay unbroken
    line = Chain(two_stage_plan, model)
    server, hidden = line.servers[0], model.config.hidden_size
    try:
        _raw(server, {"block.1.out": torch.randn(1, 2, hidden), POSITION: torch.tensor([0])},
             "s")
        layers = server.handler.sessions.state("s").cache.layers
        with torch.no_grad():  # the stage's second layer: its keys and values turn infinite
            model.model.layers[3].input_layernorm.weight.fill_(float("inf"))
        with pytest.raises(grpc.RpcError) as info:
            _raw(server, {"block.1.out": torch.randn(1, 1, hidden),
                          POSITION: torch.tensor([2])}, "s")
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "NaN or infinite" in info.value.details()
        assert server.handler.sessions.length("s") == 2
        assert {layer.get_seq_length() for layer in layers[2:4]} == {2}
    finally:
        line.stop()


def test_a_step_over_the_context_is_out_of_range_as_documented(models, two_stage_plan):
    """docs/systems/llm.md: past the plan's max context a step fails OUT_OF_RANGE; a step
    carrying more tokens than the context got INVALID_ARGUMENT (token ids: over the wire
    bound; a float32 hidden state: the shape check)."""
    model = models["llama_tiny"]
    line = Chain(_plan("llama_tiny", (0, 0, 3, 6)), model)  # the laptop takes input_ids
    mid = Chain(two_stage_plan, model)  # the laptop takes a hidden state
    too_long = MAX_CONTEXT + 1
    try:
        for server, tensors in [
                (line.servers[0], {"input_ids": torch.zeros(1, too_long, dtype=torch.int64)}),
                (mid.servers[0], {"block.1.out": torch.randn(1, too_long,
                                                             model.config.hidden_size)})]:
            with pytest.raises(grpc.RpcError) as info:
                _raw(server, {**tensors, POSITION: torch.tensor([0])}, "s")
            assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE, info.value.details()
            assert f"{too_long} tokens" in info.value.details()
            assert f"max context of {MAX_CONTEXT}" in info.value.details()
            assert len(server.handler.sessions) == 0
    finally:
        line.stop()
        mid.stop()


def test_a_max_context_past_the_models_positions_is_refused(models, tmp_path, two_stage_plan):
    """An edited plan's max_context past the model's positions failed with a traceback (or
    gRPC's message limit) only when served: refused on loading, on serving (against the
    model itself) and when its largest step passes what a message carries."""
    from edgesplit.llm.stage.server import llm_message_bytes
    from edgesplit.plan import load_plan

    model = models["llama_tiny"]
    plan = two_stage_plan
    assert plan.llm is not None
    positions = model.config.max_position_embeddings
    doc = plan.model_dump(mode="json")
    doc["llm"]["max_context"] = positions + 1
    path = tmp_path / "edited.json"
    path.write_text(__import__("json").dumps(doc))
    with pytest.raises(ConfigError, match=rf"{positions} positions \(max_position_embeddings\)"
                                          rf".*--max-context {positions} or less"):
        load_plan(path)
    # the plan claims more positions than the model has: the stage checks the model's own
    edited = plan.llm.model_copy(update={"max_context": positions + 1,
                                         "max_positions": positions + 1})
    with pytest.raises(ConfigError, match=rf"this model's {positions} positions"):
        server_for(plan.model_copy(update={"llm": edited}), "laptop", model=model,
                   data_port=None)
    huge = plan.llm.model_copy(update={"max_context": 10**8, "max_positions": 10**8})
    with pytest.raises(ConfigError, match=r"2 GiB a message carries.*--max-context \d+"):
        llm_message_bytes(huge)
