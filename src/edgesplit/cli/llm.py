"""`edgesplit llm ...`: causal language models split across devices, a command group of its
own (``llm_app``, mounted as ``llm``). ``plan`` places a model's blocks on a chain; serving and
generation are the LLM runtime's commands."""

from __future__ import annotations

from pathlib import Path

import typer

from edgesplit.cli._app import app, emit_json, out, user_errors

__all__ = ["llm_app"]

llm_app = typer.Typer(no_args_is_help=True,
                      help="Causal LMs split across devices: stage placement with KV caches.")
app.add_typer(llm_app, name="llm")

_WORKLOAD = "Workload"


@llm_app.command("plan")
@user_errors
def plan(
    model: str = typer.Argument(..., help="Causal LM name (llama_tiny, gpt2_small, llama_1b, "
                                          "llama3_8b, ...) or a transformers config.json (or "
                                          "its folder)."),
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
    dtype: str = typer.Option("float32", "--dtype",
                              help="Weights, activations and KV cache: float32, float16 or "
                                   "bfloat16."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document instead of "
                                                       "tables."),
    out_path: Path | None = typer.Option(None, "--out", "-o",
                                         help="Write the chosen plan (a Plan file: `llm serve` "
                                              "runs it)."),
) -> None:
    """Place a causal LM's blocks on a chain of devices (exact DP over TTFT and TPOT under
    each device's memory and KV cache) and compare with the baselines."""
    from edgesplit.hardware import resolve_topology
    from edgesplit.plan import LLMWorkload, llm_plan_document, plan_llm

    workload = LLMWorkload(prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                           max_context=max_context, sessions=sessions,
                           objective=objective)  # type: ignore[arg-type]  # checked there
    result = plan_llm(model, resolve_topology(topology), workload, dtype=dtype)
    if out_path is not None:
        result.plan.save(out_path)
    if as_json:
        emit_json(llm_plan_document(result))
        return
    from edgesplit.report.llm_tables import llm_methods_table, llm_stages_table

    out.print(llm_stages_table(result.plan))
    out.print(llm_methods_table(result))
    if out_path is not None:
        out.print(f"plan written to {out_path}")
