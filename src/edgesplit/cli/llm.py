"""`edgesplit llm ...`: causal language models split across devices, a command group of its
own (``llm_app``, mounted as ``llm``). ``plan`` places a model's blocks on a chain; ``serve``
runs one device's stage with its KV caches, ``generate`` runs the first stage and streams the
tokens."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from edgesplit.cli._app import (
    LLM_THREADS_HELP,
    SHAPE_HELP,
    TLS_SERVER_NAME_HELP,
    TOKEN_FILE_HELP,
    TOKEN_HELP,
    TORCH_DEVICE_HELP,
    app,
    check_torch_device,
    emit_json,
    err,
    out,
    rehearsal,
    set_threads,
    tls_files,
    user_errors,
)
from edgesplit.cli.serve_options import serve_options
from edgesplit.errors import ConfigError

if TYPE_CHECKING:
    from edgesplit.runtime.options import ServeOptions

__all__ = ["llm_app"]

llm_app = typer.Typer(no_args_is_help=True,
                      help="Causal LMs split across devices: stage placement with KV caches, "
                           "real checkpoints served stage by stage, chat and an OpenAI-compatible "
                           "API.")
app.add_typer(llm_app, name="llm")

_WORKLOAD = "Workload"
_TEXT = "Text"
_SAMPLING = "Sampling"
_EMULATE_HELP = ("Compute emulation: this device's stage runs its real blocks, then is slowed "
                 "by the cost model's ratio of the planned device's time for them to this "
                 "machine's (prefill and decode), so this machine runs at that device's speed "
                 "(it cannot speed up a slower one).")


@llm_app.command("plan")
@user_errors
def plan(
    model: str = typer.Argument(..., help="A real checkpoint: smollm2-135m-instruct "
                                          "(built in), a transformers folder (config.json, "
                                          "safetensors, tokenizer) or a .gguf file; or, "
                                          "random weights: a causal LM name (llama_tiny, "
                                          "llama3_8b, ...) or a config.json."),
    topology: str = typer.Option(..., "--topology", "-t",
                                 help="A chain of devices: preset (`edgesplit topologies`) or "
                                      "a YAML/TOML/JSON file. The prompt starts and the tokens "
                                      "end on its first device."),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", "-p", min=1,
                                      help="Prompt length (prefill).",
                                      rich_help_panel=_WORKLOAD),
    new_tokens: int = typer.Option(128, "--new-tokens", "-n", min=1,
                                   help="Tokens generated per request (1 prefill + N-1 decode "
                                        "steps).", rich_help_panel=_WORKLOAD),
    max_context: int | None = typer.Option(None, "--max-context", min=1,
                                           help="Tokens each KV cache holds; default prompt + "
                                                "new tokens.", rich_help_panel=_WORKLOAD),
    sessions: int = typer.Option(1, "--sessions", min=1,
                                 help="KV caches each stage keeps at once.",
                                 rich_help_panel=_WORKLOAD),
    objective: str = typer.Option("latency", "--objective",
                                  help="latency (TTFT + (N-1) x TPOT of a request) or "
                                       "throughput (tokens/s of a stream: the slowest stage).",
                                  rich_help_panel=_WORKLOAD),
    dtype: str | None = typer.Option(None, "--precision", "--dtype",
                              help="Default: gguf for a .gguf (or the built-in SmolLM2) of "
                                   "Q8_0/Q4_0/Q4_1 linears, else float32. "
                                   "float32, float16 or bfloat16 (torch stages: weights, "
                                   "activations and KV cache at that width); q8_0, q4_0 or "
                                   "q4_1 (weights in llama.cpp's groups of 32 on ONNX "
                                   "Runtime stages, activations and KV cache float32; a "
                                   ".gguf whose linears are of that type runs as stored, "
                                   "other checkpoints are quantized as a stage loads); gguf "
                                   "(a .gguf's own types)."),
    activations: str = typer.Option("auto", "--activations",
                                    help="Quantized weights' stages (default auto: mixed, "
                                         "float for float weights): float (float32 inputs to "
                                         "the 4-bit kernels, closest to the float model), "
                                         "int8 (inputs quantized per block of 32 as "
                                         "llama.cpp does: fastest, and concurrent sessions "
                                         "batch best) or mixed (int8 but the attention's "
                                         "q/k/v projection: a little closer to the float "
                                         "model, ~5 % slower than int8)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document instead of "
                                                       "tables."),
    out_path: Path | None = typer.Option(None, "--out", "-o",
                                         help="Write the chosen plan (a Plan file: `llm serve` "
                                              "runs it)."),
    method: str = typer.Option("dp", "--method", "-m",
                               help="The plan --out writes: dp (default), memory_proportional, "
                                    "equal_split or single_device."),
    calibrate: bool = typer.Option(False, "--calibrate",
                                   help="First measure this machine's block times for this "
                                        "model at this precision and --activations "
                                        "(seconds; cached; needs a quiet machine): a "
                                        "this-machine device is then priced from them, not "
                                        "the roofline. A cached measurement is used without "
                                        "it."),
) -> None:
    """Place a causal LM's blocks on a chain of devices (exact DP over TTFT and TPOT under
    each device's memory and KV cache) and compare with the baselines."""
    from edgesplit.hardware import resolve_topology
    from edgesplit.llm import LLM_METHODS, LLMWorkload, llm_plan_document, plan_llm

    if method not in LLM_METHODS:  # before any planning
        raise ConfigError(f"--method takes {', '.join(LLM_METHODS)}, not {method!r}")

    workload = LLMWorkload(prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                           max_context=max_context, sessions=sessions,
                           objective=objective,  # type: ignore[arg-type]  # checked there
                           activations=activations)  # type: ignore[arg-type]
    if dtype is None:
        from edgesplit.llm.model.precision import default_precision

        dtype = default_precision(model)
    chain = resolve_topology(topology)
    if calibrate:
        from edgesplit.llm.stage.calibration import calibrate_this_machine

        calibrate_this_machine(model, dtype, activations=workload.activations, remeasure=True)
    result = plan_llm(model, chain, workload, dtype=dtype)
    if out_path is not None:
        if not result.placements[method].feasible:
            raise ConfigError(f"the {method} placement is infeasible here "
                              f"({result.plans[method].reason}): choose another --method")
        result.plans[method].save(out_path)
    if as_json:
        emit_json(llm_plan_document(result))
        return
    from edgesplit.report.llm_tables import llm_methods_table, llm_stages_table

    out.print(llm_stages_table(result.plans[method]))
    out.print(llm_methods_table(result))
    if out_path is not None:
        out.print(f"{method} plan written to {out_path}")


@llm_app.command("serve")
@user_errors
@serve_options(work="steps", workers=8)
def serve(
    plan_path: Path = typer.Argument(..., help="An LLM plan (`edgesplit llm plan --out`)."),
    device: str = typer.Option(..., "--device", "-d", help="The plan device this server runs "
                                                           "(any but the first: that one is "
                                                           "`llm generate`)."),
    port: int = typer.Option(50061, "--port", "-p", help="Port (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: all)."),
    next_hop: str | None = typer.Option(None, "--next", help="HOST:PORT of the next device's "
                                                             "server (every stage before the "
                                                             "one holding the head)."),
    max_sessions: int | None = typer.Option(None, "--max-sessions", min=1,
                                            help="KV caches kept at once, the least recently "
                                                 "used evicted first (default: the plan's "
                                                 "sessions, what its memory was planned for)."),
    emulate_device: bool = typer.Option(False, "--emulate-device", help=_EMULATE_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help=LLM_THREADS_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
    *,
    options: ServeOptions,
) -> None:
    """Serve one device's stage of an LLM plan until interrupted: its blocks of the model the
    plan names, one KV cache per client session (up to the plan's max context)."""
    from edgesplit.llm.stage.server import llm_stage_server
    from edgesplit.plan import load_plan
    from edgesplit.transport import serve_forever

    set_threads(threads)
    check_torch_device(torch_device)
    plan = load_plan(plan_path)
    server = llm_stage_server(plan, device, options, next_address=next_hop,
                              max_sessions=max_sessions, emulate=emulate_device,
                              torch_device=torch_device, threads=threads)
    stage = server.handler
    if stage.pacer is not None:
        _say_emulating(plan, stage.device, stage.pacer)
    bound = server.start(host, port)
    data = f"{host}:{server.data_port}" if server.data_port else "off"
    # one machine-readable line on stdout: scripts and tests wait for it (fields by position)
    print(f"listening on {host}:{bound} device={stage.device} plan={stage.plan_id} "
          f"data={data} sessions={stage.sessions.max_sessions} "
          f"torch_device={stage.stage.torch_device} "
          f"{rehearsal(options.shape, emulate_device)}", flush=True)
    serve_forever(server)


@llm_app.command("generate")
@user_errors
def generate(
    plan_path: Path = typer.Argument(..., help="An LLM plan (`edgesplit llm plan --out`)."),
    server: str | None = typer.Option(None, "--server", help="HOST:PORT of the second "
                                                             "device's `llm serve` (not needed "
                                                             "when the first holds every "
                                                             "block)."),
    prompt_text: str | None = typer.Option(None, "--prompt", help="The prompt as text (the "
                                           "checkpoint's tokenizer); text is printed as it "
                                           "decodes.", rich_help_panel=_TEXT),
    chat: bool = typer.Option(False, "--chat", help="Send --prompt as a user message through "
                              "the tokenizer's chat template.", rich_help_panel=_TEXT),
    system: str | None = typer.Option(None, "--system", help="A system message first "
                                      "(with --chat).", rich_help_panel=_TEXT),
    stop: list[str] = typer.Option([], "--stop", help="End the text before this string "
                                   "(repeatable).", rich_help_panel=_TEXT),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy; else sample at "
                                      "this temperature.", rich_help_panel=_SAMPLING),
    top_k: int = typer.Option(0, "--top-k", help="Sample among the k likeliest (0: all).",
                              rich_help_panel=_SAMPLING),
    top_p: float = typer.Option(1.0, "--top-p", help="Sample within this probability mass "
                                "(1: all).", rich_help_panel=_SAMPLING),
    prompt_ids: str | None = typer.Option(None, "--prompt-ids",
                                          help="The prompt as token ids, comma-separated."),
    prompt_tokens: int | None = typer.Option(None, "--prompt-tokens", "-p", min=1,
                                             help="A random prompt of this many tokens "
                                                  "(--seed); default the plan's."),
    new_tokens: int | None = typer.Option(None, "--new-tokens", "-n", min=1,
                                          help="Tokens to generate; default the plan's."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling and of a random "
                             "prompt."),
    session: str | None = typer.Option(None, "--session", help="Session id (default: a "
                                                               "random one)."),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
    token_file: Path | None = typer.Option(None, "--token-file", help=TOKEN_FILE_HELP),
    tls_server_name: str | None = typer.Option(None, "--tls-server-name",
                                               help=TLS_SERVER_NAME_HELP),
    tls_ca: Path | None = typer.Option(None, "--tls-ca", help="Use TLS, trusting this CA."),
    retries: int = typer.Option(0, "--retries", help="Retry an unavailable server this often."),
    timeout_s: float = typer.Option(60.0, "--timeout-s", help="Per-step deadline."),
    data_plane: str = typer.Option("auto", "--data-plane", help="auto (the server's data "
                                   "plane if it has one), grpc or tcp."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (no "
                                                       "streaming)."),
    emulate_device: bool = typer.Option(False, "--emulate-device", help=_EMULATE_HELP),
    shape: bool = typer.Option(False, "--shape/--no-shape", help=SHAPE_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help=LLM_THREADS_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
) -> None:
    """Generate with an LLM plan: run its first stage here, the rest on the `llm serve` chain
    at --server; print the text (or token ids) as it decodes, then time to first token,
    tokens/s and each stage's compute against the plan's."""
    from edgesplit.cli.serving import _data_plane
    from edgesplit.llm.generate.client import LLMClient
    from edgesplit.llm.stage.sampling import Sampling
    from edgesplit.plan import load_plan
    from edgesplit.runtime.options import CallOptions
    from edgesplit.transport import read_token

    set_threads(threads)
    check_torch_device(torch_device)
    plan = load_plan(plan_path)
    sampling = Sampling(temperature, top_k, top_p, seed)
    text = prompt_text is not None
    if not text and (chat or system is not None or stop):
        raise ConfigError("--chat, --system and --stop take text: give --prompt TEXT")
    if text and (prompt_ids is not None or prompt_tokens is not None):
        raise ConfigError("give --prompt, --prompt-ids or --prompt-tokens, not several")
    # refused before connecting; token ids of a real checkpoint read as text in --json too
    real = plan.llm is not None and plan.llm.fingerprint is not None
    tokenizer = _tokenizer(plan) if text or (as_json and real) else None
    count = new_tokens or (plan.llm.new_tokens if plan.llm is not None else 1)
    calls = CallOptions(token=read_token(token, token_file), timeout_s=timeout_s,
                        tls=tls_files(None, None, tls_ca, tls_server_name), retries=retries)
    client = LLMClient(plan, server, session=session, calls=calls,
                       data_plane=_data_plane(data_plane), emulate=emulate_device,
                       shape=shape, torch_device=torch_device, threads=threads)
    if client.pacer is not None:
        _say_emulating(plan, client.device, client.pacer)
    said: str | None
    with client:
        if text:
            from edgesplit.llm.generate.engine import LLMEngine

            engine = LLMEngine(client, tokenizer, slot_ids=[client.session])
            assert prompt_text is not None
            messages = _messages(prompt_text, system) if chat else None
            prompt = engine.chat_ids(messages) if messages else engine.text_ids(prompt_text)
            got, said = _stream_text(engine, prompt, count, sampling, stop, as_json)
        else:
            prompt = _prompt(plan, prompt_ids, prompt_tokens, seed)
            got = _stream_ids(client, prompt, count, sampling, as_json)
            said = tokenizer.decode([t.token for t in got]) if tokenizer is not None else None
        client.end_session()
    prompt_said = tokenizer.decode(prompt) if tokenizer is not None else None
    _report(plan, prompt, got, client, as_json, text, (said, prompt_said))


@llm_app.command("chat")
@user_errors
def chat_command(
    plan_path: Path = typer.Argument(..., help="An LLM plan of a real checkpoint."),
    server: str | None = typer.Option(None, "--server", help="HOST:PORT of the second "
                                                             "device's `llm serve`."),
    system: str | None = typer.Option(None, "--system", help="A system message first."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n", min=1,
                                       help="Tokens a reply may take at most."),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy.",
                                      rich_help_panel=_SAMPLING),
    top_k: int = typer.Option(0, "--top-k", rich_help_panel=_SAMPLING),
    top_p: float = typer.Option(1.0, "--top-p", rich_help_panel=_SAMPLING),
    seed: int = typer.Option(0, "--seed", rich_help_panel=_SAMPLING),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
    token_file: Path | None = typer.Option(None, "--token-file", help=TOKEN_FILE_HELP),
    tls_server_name: str | None = typer.Option(None, "--tls-server-name",
                                               help=TLS_SERVER_NAME_HELP),
    tls_ca: Path | None = typer.Option(None, "--tls-ca", help="Use TLS, trusting this CA."),
    timeout_s: float = typer.Option(60.0, "--timeout-s", help="Per-step deadline."),
    shape: bool = typer.Option(False, "--shape/--no-shape", help=SHAPE_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help=LLM_THREADS_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
) -> None:
    """Chat with the split model: each line you type is a user turn (from a terminal or a
    pipe); each reply streams as it decodes. A turn continues the session: only its new
    tokens are prefilled on every stage. /reset starts a new conversation; EOF or /exit
    ends."""
    import sys

    from edgesplit.llm.generate.client import LLMClient
    from edgesplit.llm.generate.engine import LLMEngine
    from edgesplit.llm.stage.sampling import Sampling
    from edgesplit.runtime.options import CallOptions
    from edgesplit.transport import read_token

    set_threads(threads)
    check_torch_device(torch_device)
    from edgesplit.plan import load_plan

    plan = load_plan(plan_path)
    sampling = Sampling(temperature, top_k, top_p, seed)
    tokenizer = _tokenizer(plan)
    calls = CallOptions(token=read_token(token, token_file), timeout_s=timeout_s,
                        tls=tls_files(None, None, tls_ca, tls_server_name))
    client = LLMClient(plan, server, calls=calls, shape=shape, torch_device=torch_device,
                       threads=threads)
    first = [{"role": "system", "content": system}] if system is not None else []
    messages = list(first)
    with client:
        engine = LLMEngine(client, tokenizer, slot_ids=[client.session])
        interactive = sys.stdin.isatty()
        while True:
            line = _read_turn(interactive)
            if line is None or line.strip() == "/exit":
                break
            if line.strip() == "/reset":
                messages = list(first)
                continue
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line.strip()})
            reply, got = _chat_turn(engine, messages, max_new_tokens, sampling)
            messages.append({"role": "assistant", "content": reply})
            _say_turn(got)
        client.end_session()


def _read_turn(interactive: bool) -> str | None:
    import sys

    if interactive:
        sys.stdout.write("you> ")
        sys.stdout.flush()
    line = sys.stdin.readline()
    if line and not interactive:  # a piped conversation reads as one in the output
        sys.stdout.write(f"you> {line.rstrip()}\n")
    return line if line else None


def _chat_turn(engine, messages, max_new_tokens: int, sampling) -> tuple[str, list]:
    import sys

    prompt = engine.chat_ids(messages)
    left = engine.max_context - len(prompt) + 1
    if left < 1:
        raise ConfigError(f"the conversation ({len(prompt)} tokens) fills the plan's max "
                          f"context of {engine.max_context}: /reset, or plan with a larger "
                          "--max-context")
    text, got = [], []
    for delta in engine.stream(prompt, max_new_tokens=min(max_new_tokens, left),
                               sampling=sampling):
        text.append(delta.text)
        if delta.step is not None:
            got.append(delta.step)
        sys.stdout.write(delta.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(text), got


def _say_turn(got: list) -> None:
    """One line on stderr: what the turn reused, prefilled and decoded."""
    if not got:
        return
    decode = got[-1].elapsed_ms - got[0].elapsed_ms
    rate = f", {(len(got) - 1) / (decode / 1e3):.1f} tokens/s" if len(got) > 1 and decode else ""
    err.print(f"[{len(got)} tokens; first after {got[0].elapsed_ms:.0f} ms, "
              f"{got[0].reused} cached prompt tokens reused{rate}]")


def _tokenizer(plan):
    from edgesplit.llm.generate.engine import plan_tokenizer

    return plan_tokenizer(plan)


def _messages(prompt: str, system: str | None) -> list[dict[str, str]]:
    first = [{"role": "system", "content": system}] if system is not None else []
    return [*first, {"role": "user", "content": prompt}]


def _stream_ids(client, prompt: list[int], count: int, sampling, as_json: bool) -> list:
    import sys

    got = []
    for t in client.generate(prompt, count, sampling=sampling):
        got.append(t)
        if not as_json:  # each token as it arrives
            sys.stdout.write(f"{t.token}{' ' if t.index + 1 < count else chr(10)}")
            sys.stdout.flush()
    return got


def _stream_text(engine, prompt: list[int], count: int, sampling, stop: list[str],
                 as_json: bool) -> tuple[list, str]:
    """The tokens and the text as printed (an end-of-sequence token or a stop string left
    out)."""
    import sys

    got, text = [], []
    for delta in engine.stream(prompt, max_new_tokens=count, sampling=sampling, stop=stop):
        if delta.step is not None:
            got.append(delta.step)
        text.append(delta.text)
        if not as_json:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
    if not as_json:
        sys.stdout.write("\n")
    return got, "".join(text)


def _report(plan, prompt: list[int], got: list, client, as_json: bool, text: bool,
            texts: tuple[str | None, str | None]) -> None:
    from edgesplit.llm.generate.report import generation_report

    doc = generation_report(plan, prompt, got, session=client.session,
                            data_plane=client.data_plane, text=texts[0], prompt_text=texts[1])
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.llm_tables import llm_generation_table

    # with text on stdout, the measurements go to stderr: `> answer.txt` keeps only the text
    (err if text else out).print(llm_generation_table(doc))


def _say_emulating(plan, device: str, pacer) -> None:
    """One line on stderr: which preset this stage emulates, and how much slower."""
    stage = next(s for s in plan.llm.stages if s.device == device)
    preset = next(d.device.name for d in plan.devices if d.name == device)
    if stage.start == stage.end:
        err.print(f"--emulate-device: {device} holds no blocks in this plan (it only relays)")
        return
    f = pacer.factors
    err.print(f"emulating {device} ({preset}): real compute slowed x{f['prefill']:.2f} in the "
              f"prefill, x{f['decode']:.2f} a decode step (the cost model's {preset} over "
              "this machine)")


def _prompt(plan, prompt_ids: str | None, prompt_tokens: int | None, seed: int) -> list[int]:
    """--prompt-ids, or a seeded random prompt of --prompt-tokens (default the plan's)."""
    from edgesplit.errors import ConfigError
    from edgesplit.llm.stage.compute import llm_section

    llm = llm_section(plan)
    if prompt_ids is not None and prompt_tokens is not None:
        raise ConfigError("give --prompt-ids or --prompt-tokens, not both")
    if prompt_ids is not None:
        try:
            return [int(x) for x in prompt_ids.replace(" ", "").split(",") if x]
        except ValueError:
            raise ConfigError(f"--prompt-ids takes comma-separated token ids, not "
                              f"{prompt_ids!r}") from None
    import torch

    g = torch.Generator().manual_seed(seed)
    n = prompt_tokens or llm.prompt_tokens
    return torch.randint(0, llm.vocab_size, (n,), generator=g).tolist()
