"""Placing a causal LM's blocks on a chain of devices: per-device prices of each block and
phase, the sends between stages and the memory (``costs.py``), ``this-machine`` priced from
its measured block times (``calibration.py``), the exact DP, brute force and
the baselines (``placement.py``), a placement as a ``Plan`` with its ``llm`` section
(``assemble.py``), and ``plan_llm``, ``plan_llm_at`` and the ``llm plan --json`` document
(``plan.py``)."""
