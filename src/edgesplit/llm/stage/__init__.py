"""One stage of a split causal LM and how it is served: its blocks run over a KV cache
(``compute.py``; quantized weights on one ONNX Runtime graph, ``onnx_stage.py`` over
``quantized.py``'s repacked blocks, behind the same surface, ``quantized_compute.py``;
``open_stage`` picks by the plan's precision), the token drawn where the logits are
(``sampling.py``), the KV sessions it keeps (``kv_sessions.py``), the step messages
(``wire.py``), compute and links paced to the plan (``emulation.py``), this machine's block times
measured on real stages (``calibration.py``), and
``llm_stage_server`` (``server.py``)."""
