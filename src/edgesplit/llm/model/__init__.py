"""What a causal LM is, before any device: its blocks with per-phase work, parameters and KV
cache from its config (``description.py``), the same counted on a real model
(``measure.py``), its precision: float, or quantized weights priced at their stored size
(``precision.py``), and real checkpoints: folders, GGUF files, fingerprints, a stage's modules
loaded alone (``checkpoint.py``), a GGUF's tensors read quantized by name (``gguf.py``), a
transformers folder quantized as a stage reads it (``quantize.py``)."""
