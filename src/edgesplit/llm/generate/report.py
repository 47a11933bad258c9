"""What a split generation measured against what its plan predicts: the document behind
``edgesplit llm generate --json``.

Time to first token is the prefill step as the client saw it; tokens/s is the decode rate
(the tokens after the first over the time after the first), as the plan's ``tokens_per_s``
(1 / TPOT). Per stage: its compute in the prefill and its mean compute per decode step, next
to the plan's ``prefill_ms`` / ``decode_ms`` (priced for the plan's prompt length), and its
codec time (encode and decode of what it sends and receives). A stage emulating its device
(``--emulate-device``) also says how much of its prefill and decode compute it slept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgesplit.llm.generate.client import GeneratedToken
from edgesplit.llm.stage.compute import llm_section
from edgesplit.llm.stage.server import head_stage
from edgesplit.plan.model import Plan

__all__ = ["GENERATE_VERSION", "generation_report"]

GENERATE_VERSION = 1


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def generation_report(plan: Plan, prompt: Sequence[int], tokens: Sequence[GeneratedToken],
                      *, session: str, data_plane: str, text: str | None = None,
                      prompt_text: str | None = None) -> dict[str, Any]:
    """The generation of ``tokens`` after ``prompt`` on ``plan``, measured and predicted;
    ``text`` and ``prompt_text`` as the tokenizer reads them (None: a plan of random weights,
    which has no tokenizer)."""
    llm = llm_section(plan)
    if not tokens:
        raise ValueError("a generation report needs at least one token")
    ttft = tokens[0].elapsed_ms
    total = tokens[-1].elapsed_ms
    decode = tokens[1:]
    rate = len(decode) / ((total - ttft) / 1e3) if decode and total > ttft else None
    served = llm.stages[:head_stage(llm) + 1]
    stages = []
    for stage in served:
        d = stage.device
        row: dict[str, Any] = {
            "device": d,
            "blocks": stage.blocks,
            "prefill_ms": tokens[0].compute_ms.get(d, 0.0),
            "decode_ms": _mean([t.compute_ms.get(d, 0.0) for t in decode]),
            "serialize_ms": _mean([t.serialize_ms.get(d, 0.0) for t in tokens]),
            "predicted_prefill_ms": stage.prefill_ms,
            "predicted_decode_ms": stage.decode_ms,
        }
        if any(d in t.emulated_ms for t in tokens):
            row["emulated_prefill_ms"] = tokens[0].emulated_ms.get(d, 0.0)
            row["emulated_decode_ms"] = _mean([t.emulated_ms.get(d, 0.0) for t in decode])
        stages.append(row)
    return {
        "version": GENERATE_VERSION,
        "model": plan.model.name,
        "method": plan.method,
        "session": session,
        "data_plane": data_plane,
        "prompt": list(prompt),
        "prompt_tokens": len(prompt),
        "new_tokens": len(tokens),
        "tokens": [t.token for t in tokens],
        "prompt_text": prompt_text,
        "text": text,
        "ttft_ms": ttft,
        "total_ms": total,
        "tokens_per_s": rate,
        "tpot_ms": _mean([t.step_ms for t in decode]),
        "predicted": {"prompt_tokens": llm.prompt_tokens, "ttft_ms": llm.ttft_ms,
                      "tpot_ms": llm.tpot_ms, "tokens_per_s": llm.tokens_per_s},
        "stages": stages,
    }
