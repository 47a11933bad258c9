"""What a causal LM is, before any device: its blocks with per-phase work, parameters and KV
cache from its config (``description.py``), the same counted on a real model
(``measure.py``), and real checkpoints: folders, GGUF files, fingerprints, a stage's modules
loaded alone (``checkpoint.py``)."""
