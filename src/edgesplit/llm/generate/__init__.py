"""Generating over a served chain of stages: ``LLMClient`` runs the first stage and streams
tokens (``client.py``), ``LLMEngine`` puts text in and out and shares the stages' caches
among generations (``engine.py``, with ``text.py``: incremental detokenising, stop strings),
and ``generation_report`` compares a generation with its plan (``report.py``)."""
