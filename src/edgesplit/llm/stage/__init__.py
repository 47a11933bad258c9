"""One stage of a split causal LM and how it is served: its blocks run over a KV cache
(``compute.py``), the token drawn where the logits are (``sampling.py``), the KV sessions it
keeps (``kv_sessions.py``), the step messages (``wire.py``), compute and links paced to the
plan (``emulation.py``), and ``llm_stage_server`` (``server.py``)."""
