"""Rich tables for causal-LM stage plans (``edgesplit llm plan``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from edgesplit.llm import LLMPlanning
from edgesplit.plan import Plan
from edgesplit.report.format import human_bytes

__all__ = ["llm_generation_table", "llm_methods_table", "llm_stages_table"]


def _blocks(first: str, last: str, count: int) -> str:
    if count == 0:
        return "- (relay)"
    return first if count == 1 else f"{first} .. {last} ({count})"


def llm_stages_table(plan: Plan) -> Table:
    """The chosen placement: per device its blocks, memory against its limit, compute per
    prefill and per decode step, and what it sends to the next device."""
    llm = plan.llm
    assert llm is not None, "an LLM stage plan"
    hops = {h.src: h for h in llm.hops}
    table = Table(
        title=f"{plan.model.name} ({llm.dtype}) {plan.method}: prompt {llm.prompt_tokens}, "
              f"{llm.new_tokens} new tokens, KV cache for {llm.sessions} x {llm.max_context} "
              "tokens",
        caption=f"TTFT {llm.ttft_ms:.2f} ms, TPOT {llm.tpot_ms:.3f} ms "
                f"({llm.tokens_per_s:.1f} tokens/s), request {llm.request_ms:.1f} ms; "
                f"stream bound {llm.pipeline_tokens_per_s:.1f} tokens/s "
                f"(slowest stage {llm.period_ms:.3f} ms)")
    for col in ("device", "blocks", "weights", "KV cache", "memory / limit", "prefill ms",
                "decode ms", "sends (prefill / decode)", "send ms (prefill / decode)",
                "token back ms"):
        table.add_column(col, justify="left" if col in ("device", "blocks") else "right")
    for stage in llm.stages:
        hop = hops.get(stage.device)
        limit = ("unbounded" if stage.memory_limit_bytes is None
                 else human_bytes(stage.memory_limit_bytes))
        first, last = (stage.blocks[0], stage.blocks[-1]) if stage.blocks else ("", "")
        table.add_row(
            stage.device, _blocks(first, last, len(stage.blocks)),
            human_bytes(stage.weight_bytes), human_bytes(stage.kv_cache_bytes),
            f"{human_bytes(stage.memory_bytes)} / {limit}",
            f"{stage.prefill_ms:.3f}", f"{stage.decode_ms:.3f}",
            f"{human_bytes(hop.prefill_bytes)} / {human_bytes(hop.decode_bytes)}" if hop else "-",
            f"{hop.prefill_ms:.3f} / {hop.decode_ms:.3f}" if hop else "-",
            f"{hop.return_ms:.3f}" if hop else "-")
    return table


def llm_methods_table(result: LLMPlanning) -> Table:
    """The optimum against the baselines: blocks per device, TTFT, TPOT, tokens/s."""
    costs = result.costs
    objective = costs.workload.objective
    best = result.placements["dp"].key(objective)[0]
    table = Table(title=f"{result.lm.name} over {costs.topology.name}: objective {objective}",
                  caption="* the exact placement (DP); the others are baselines; vs dp: their "
                          + ("request time" if objective == "latency" else "slowest stage")
                          + " over the DP's")
    table.add_column("method")
    for device in costs.devices:
        table.add_column(f"{device} blocks", justify="right")
    for col in ("TTFT ms", "TPOT ms", "request ms", "tokens/s", "stream tokens/s",
                "vs dp", "feasible"):
        table.add_column(col, justify="right")
    for method, p in result.placements.items():
        counts = [str(b - a) for a, b in p.ranges()]
        ratio = f"x{p.key(objective)[0] / best:.2f}" if best > 0 and p.feasible else "-"
        over = [f"{d} {human_bytes(need)} > {human_bytes(limit)}"
                for d, need, limit in zip(costs.devices, p.memory_bytes, costs.memory_limits,
                                          strict=True) if limit is not None and need > limit]
        table.add_row(("* " if method == "dp" else "") + method, *counts, f"{p.ttft_ms:.2f}",
                      f"{p.tpot_ms:.3f}", f"{p.request_ms:.1f}", f"{p.tokens_per_s:.1f}",
                      f"{p.pipeline_tokens_per_s:.1f}", ratio,
                      "yes" if p.feasible else "no: " + ", ".join(over))
    return table


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def llm_generation_table(doc: dict[str, Any]) -> Table:
    """A generation (``llm generate``'s document): per stage its measured compute in the
    prefill and per decode step next to the plan's, and its codec time; TTFT and tokens/s
    against the plan's in the caption."""
    p = doc["predicted"]
    rate = doc["tokens_per_s"]
    table = Table(
        title=f"{doc['model']} ({doc['method']}): prompt {doc['prompt_tokens']} tokens, "
              f"{doc['new_tokens']} new (plan: prompt {p['prompt_tokens']}); steps over "
              f"{doc['data_plane']}",
        caption=f"TTFT {doc['ttft_ms']:.2f} ms (plan {p['ttft_ms']:.2f}), "
                f"{'-' if rate is None else f'{rate:.1f}'} tokens/s "
                f"(plan {p['tokens_per_s']:.1f}), TPOT {_ms(doc['tpot_ms'], 3)} ms "
                f"(plan {p['tpot_ms']:.3f})")
    for col in ("device", "blocks", "prefill ms", "plan prefill ms", "decode ms",
                "plan decode ms", "codec ms / step"):
        table.add_column(col, justify="left" if col in ("device", "blocks") else "right")
    for s in doc["stages"]:
        blocks = s["blocks"]
        table.add_row(s["device"], _blocks(blocks[0], blocks[-1], len(blocks)) if blocks
                      else _blocks("", "", 0), _ms(s["prefill_ms"]),
                      _ms(s["predicted_prefill_ms"]), _ms(s["decode_ms"], 3),
                      _ms(s["predicted_decode_ms"], 3), _ms(s["serialize_ms"], 3))
    return table
