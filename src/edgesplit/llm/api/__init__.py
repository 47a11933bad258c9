"""The OpenAI-compatible HTTP API over an ``LLMEngine`` (``app.py``: FastAPI, sse-starlette,
uvicorn) and what it checks before any work (``http_guard.py``: connections, head and body
limits, the key before the body). Not imported by :mod:`edgesplit.llm` itself: FastAPI takes
half a second to import, which ``llm plan`` and ``llm generate`` need not pay."""
