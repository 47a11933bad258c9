"""A causal LM's stage placement as a :class:`~edgesplit.plan.model.Plan`.

The Plan's layers are the LM's blocks and every latency in it is one request's: a block's
``latency_ms`` on a device is its prefill plus N-1 decode steps, a transfer carries the
prefill's send plus N-1 decode steps' (and the token coming back, as a transfer the other
way). So ``predicted.total_ms`` is the request latency, TTFT + (N-1) x TPOT, and
:func:`~edgesplit.plan.model.recompute_total` re-derives it from the plan's own numbers, as for
every plan. The per-phase numbers the runtime and the tables need are in ``Plan.llm``.
"""

from __future__ import annotations

from typing import Literal

from edgesplit.graph import INPUT, OUTPUT
from edgesplit.llm.model.description import TOKEN_BYTES
from edgesplit.llm.planning.costs import LLMChainCosts, SendCost
from edgesplit.llm.planning.placement import StagePlacement
from edgesplit.plan.model import (
    LLMBlock,
    LLMHop,
    LLMPlan,
    LLMStage,
    ModelRef,
    Plan,
    PlanDevice,
    PlanLayer,
    PlanLink,
    PlanTensor,
    Prediction,
    Transfer,
)

__all__ = ["assemble_llm_plan"]

Role = Literal["edge", "cloud", "hop"]


def _roles(m: int) -> list[Role]:
    hops: list[Role] = ["hop"] * (m - 2)
    return ["edge"] if m == 1 else ["edge", *hops, "cloud"]


def _tensors(costs: LLMChainCosts) -> list[PlanTensor]:
    """The prefill's tensors: the prompt, each block's hidden state, the picked token."""
    lm, p = costs.lm, costs.workload.prompt_tokens
    names = [b.name for b in lm.blocks]
    tensors = [PlanTensor(name="input_ids", producer=INPUT, consumers=[names[0]], shape=[1, p],
                          dtype="int64", bytes=p * TOKEN_BYTES)]
    for i in range(1, lm.n):
        tensors.append(PlanTensor(name=f"{names[i - 1]}.out", producer=names[i - 1],
                                  consumers=[names[i]], shape=[1, p, lm.shape.hidden_size],
                                  dtype=lm.weights.value_dtype,
                                  bytes=p * lm.shape.hidden_size * lm.dtype_bytes))
    tensors.append(PlanTensor(name="token", producer=names[-1], consumers=[OUTPUT], shape=[1, 1],
                              dtype="int64", bytes=TOKEN_BYTES))
    return tensors


def _transfer(src: str, dst: str, tensor: str | None, first: SendCost, step: SendCost,
              steps: int) -> Transfer:
    """One request's traffic over a link in one direction: the first send, then ``steps``."""
    return Transfer(src=src, dst=dst, tensors=[tensor] if tensor and first.bytes else [],
                    bytes=first.bytes + steps * step.bytes,
                    ms=first.wire_ms + steps * step.wire_ms,
                    latency_ms=first.latency_ms + steps * step.latency_ms,
                    serialize_ms=first.serialize_ms + steps * step.serialize_ms)


def assemble_llm_plan(costs: LLMChainCosts, placement: StagePlacement, *, method: str,
                      reason: str | None = None) -> Plan:
    """The Plan of ``placement`` (feasible unless a device is over its memory)."""
    lm, w, topology = costs.lm, costs.workload, costs.topology
    steps = w.decode_steps
    names = [b.name for b in lm.blocks]
    ranges = placement.ranges()
    where = {names[i]: d for d, (a, b) in zip(costs.devices, ranges, strict=True)
             for i in range(a, b)}
    m_of = {d: m for m, d in enumerate(costs.devices)}
    request = costs.prefill_ms + steps * costs.decode_ms  # [M, n]
    compute = {d: float(sum(request[m, a:b])) for m, (d, (a, b))
               in enumerate(zip(costs.devices, ranges, strict=True))}
    transfers, hops = [], []
    for m, cut in enumerate(placement.boundaries[1:-1]):
        src, dst = costs.devices[m], costs.devices[m + 1]
        tensor = lm.boundary_tensor(cut)
        fwd_p, fwd_d, back = (costs.forward_prefill[m][cut], costs.forward_decode[m][cut],
                              costs.back[m][cut])
        transfers.append(_transfer(src, dst, tensor, fwd_p, fwd_d, steps))
        hops.append(LLMHop(src=src, dst=dst, tensor=tensor if fwd_p.bytes else None,
                           prefill_bytes=fwd_p.bytes, prefill_ms=fwd_p.ms,
                           decode_bytes=fwd_d.bytes, decode_ms=fwd_d.ms,
                           return_bytes=back.bytes, return_ms=back.ms))
    for m, cut in enumerate(placement.boundaries[1:-1]):  # tokens coming back, after
        back = costs.back[m][cut]
        if back.bytes:
            transfers.append(_transfer(costs.devices[m + 1], costs.devices[m], "token", back,
                                       back, steps))
    serial = [sum(t.ms for t in transfers), sum(t.latency_ms for t in transfers),
              sum(t.serialize_ms for t in transfers)]
    stages = [LLMStage(device=d, blocks=names[a:b], start=a, end=b,
                       weight_bytes=int(costs.weight_bytes[a, b]),
                       kv_cache_bytes=int(costs.kv_bytes[a, b]),
                       activation_bytes=int(costs.activation_bytes[a, b]),
                       memory_bytes=mem, memory_limit_bytes=costs.memory_limits[m],
                       prefill_ms=pre, decode_ms=dec)
              for m, (d, (a, b), mem, pre, dec) in enumerate(zip(
                  costs.devices, ranges, placement.memory_bytes, placement.prefill_ms,
                  placement.decode_ms, strict=True))]
    s = lm.shape
    over = "; ".join(placement.over_memory)
    return Plan(
        method=method,
        model=ModelRef(name=lm.name, source=lm.source, input_shapes=[[1, w.prompt_tokens]],
                       graph="blocks"),
        devices=[PlanDevice(name=d, role=role, device=topology.device(d),
                            layers=[n for n in names if where[n] == d], compute_ms=compute[d])
                 for d, role in zip(costs.devices, _roles(costs.m), strict=True)],
        links=[PlanLink(src=a, dst=b, link=topology.link(a, b))
               for a, b in zip(costs.devices, costs.devices[1:], strict=False)],
        layers=[PlanLayer(name=n, latency_ms={d: float(request[m_of[d], i])
                                              for d in costs.devices},
                          param_bytes=lm.blocks[i].param_bytes) for i, n in enumerate(names)],
        tensors=_tensors(costs),
        transfers=transfers,
        predicted=Prediction(compute_ms=compute, transfer_ms=serial[0], rtt_ms=serial[1],
                             serialize_ms=serial[2], total_ms=sum(compute.values()) + sum(serial)),
        edge_memory_bytes=placement.memory_bytes[0],
        feasible=placement.feasible,
        reason=over or reason,
        llm=LLMPlan(
            architecture=s.architecture, dtype=lm.dtype, dtype_bytes=lm.dtype_bytes,
            group_size=lm.weights.group_size, activations=w.activations,
            hidden_size=s.hidden_size, num_layers=s.num_layers, num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, vocab_size=s.vocab_size,
            max_positions=s.max_positions, tied_embeddings=s.tied_embeddings,
            shared_modules=list(lm.shared_modules), objective=w.objective,
            prompt_tokens=w.prompt_tokens, new_tokens=w.new_tokens, max_context=w.context,
            sessions=w.sessions, decode_cached_tokens=w.decode_cached,
            fingerprint=lm.fingerprint,
            blocks=[LLMBlock(name=b.name, kind=b.kind, modules=list(b.modules),
                             param_bytes=b.param_bytes, kv_bytes_per_token=b.kv_bytes_per_token)
                    for b in lm.blocks],
            stages=stages, hops=hops, ttft_ms=placement.ttft_ms, tpot_ms=placement.tpot_ms,
            request_ms=placement.request_ms, period_ms=placement.period_ms,
            tokens_per_s=placement.tokens_per_s,
            pipeline_tokens_per_s=placement.pipeline_tokens_per_s),
    )
