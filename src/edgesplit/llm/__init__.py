"""The split causal LM: one package, organised by job, from a model's config to an
OpenAI-compatible API.

- ``model/``: what a causal LM is before any device (``CausalLM``, ``describe_causal_lm``),
  and real checkpoints;
- ``planning/``: its blocks placed on a chain of devices (``plan_llm``: the exact DP and its
  baselines; ``plan_llm_at``: at given boundaries), each placement a ``Plan`` with an ``llm``
  section;
- ``stage/``: one stage's compute, KV sessions, messages and server (``llm_stage_server``);
- ``generate/``: the client that drives the chain (``LLMClient``) and the engine that puts
  text in and out (``LLMEngine``);
- ``api/``: the OpenAI-compatible HTTP API (imported on its own: ``edgesplit.llm.api.app``).

Each sub-package imports only those listed before it. The registry of causal LMs by name
(``llama_tiny``, ``llama3_8b``) stays in :mod:`edgesplit.models.causal_lm`: a built-in causal
LM is also a model of the zoo (``create_model``), and the zoo sits below every package here.

Four words for the state of a conversation, each one thing:

- a **session** is a conversation's name on the chain: an id (call metadata
  ``edgesplit-session``) with its owner's secret, under which every stage keeps its state;
- a **KV session** (:class:`~edgesplit.llm.stage.kv_sessions.KVSession`, a stage's table of
  them :class:`~edgesplit.llm.stage.kv_sessions.LLMSessions`) is one session's KV cache on one
  stage and the tokens it holds: bounded LRU, limited to the plan's max context, answering
  only its owner, rolled back when a step fails;
- a **conversation** is what :class:`LLMClient` remembers of a session: the tokens every
  stage's KV session holds (``LLMClient.held``), so that the next turn sends only what is new;
- a **slot** is one of the generations :class:`LLMEngine` runs at once (the plan's
  ``sessions``): each keeps one session id across generations, and a generation takes the
  free slot whose conversation shares most of its prompt, or waits for one.
"""

from edgesplit.llm.generate.client import GeneratedToken, LLMClient
from edgesplit.llm.generate.engine import LLMEngine, open_engine, plan_tokenizer
from edgesplit.llm.generate.report import generation_report
from edgesplit.llm.model.description import CausalLM, Phase, describe_causal_lm
from edgesplit.llm.planning.assemble import assemble_llm_plan
from edgesplit.llm.planning.costs import LLMChainCosts, LLMWorkload
from edgesplit.llm.planning.placement import StagePlacement, evaluate_placement
from edgesplit.llm.planning.plan import (
    LLM_METHODS,
    LLMPlanning,
    llm_plan_document,
    plan_llm,
    plan_llm_at,
)
from edgesplit.llm.stage.sampling import Sampling
from edgesplit.llm.stage.server import llm_stage_server

__all__ = [
    "LLM_METHODS",
    "CausalLM",
    "GeneratedToken",
    "LLMChainCosts",
    "LLMClient",
    "LLMEngine",
    "LLMPlanning",
    "LLMWorkload",
    "Phase",
    "Sampling",
    "StagePlacement",
    "assemble_llm_plan",
    "describe_causal_lm",
    "evaluate_placement",
    "generation_report",
    "llm_plan_document",
    "llm_stage_server",
    "open_engine",
    "plan_llm",
    "plan_llm_at",
    "plan_tokenizer",
]
