"""A served OpenAI-compatible API for the hostile HTTP tests, run as its own process so that
its memory can be read from /proc: :func:`serve_api` over the real :class:`LLMEngine` (its
session queue, its cancellation) with a fake chain behind it. The tokenizer gives one token a
character; the fake chain takes ``--prefill-s`` per prefill and ``--token-s`` per further
token, and appends a line to ``--log`` at every prefill (and at every prompt tokenized), so a
test can count them. The port is printed as ``port N`` once connections are accepted.

    python tests/http_fake_api.py --log FILE [--api-key K] [--limits JSON] [--sessions N]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from edgesplit.llm.api.app import serve_api
from edgesplit.llm.api.http_guard import HttpLimits
from edgesplit.llm.generate.engine import LLMEngine

EOS = 1


class Tokenizer:
    """One token a character (ids 2 and up), decoded back; no special tokens. Each prompt
    tokenized appends a line to ``log``."""

    chat_template = "fake"
    eos_token_id = EOS

    def __init__(self, log: Path) -> None:
        self.log = log

    def __call__(self, text: str) -> dict[str, list[int]]:
        with self.log.open("a") as f:
            f.write(f"tokenize {len(text)}\n")
        return {"input_ids": [ord(c) + 2 for c in text]}

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **_: Any) -> list[int]:
        return self("\n".join(m["content"] for m in messages))["input_ids"]

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return "".join(chr(i - 2) for i in ids if i > EOS)

    def get_vocab(self) -> dict[str, int]:
        return {"a": 2}  # one character a token


class Chain:
    """The part of LLMClient the engine uses: echoes the prompt's first character."""

    def __init__(self, log: Path, prefill_s: float, token_s: float, sessions: int) -> None:
        self.log, self.prefill_s, self.token_s = log, prefill_s, token_s
        self.llm = SimpleNamespace(max_context=100_000, sessions=sessions)
        self.plan = SimpleNamespace(model=SimpleNamespace(name="fake-llm"))

    def check_prompt(self, ids: Sequence[int], new_tokens: int) -> None:
        pass

    def held(self, session: str) -> list[int]:
        return []

    def end_session(self, session: str) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(self, ids: Sequence[int], new_tokens: int, **_: Any) -> Iterator[Any]:
        with self.log.open("a") as f:
            f.write("prefill\n")
        time.sleep(self.prefill_s)
        for i in range(new_tokens):
            if i:
                time.sleep(self.token_s)
            yield SimpleNamespace(index=i, token=ids[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--api-key")
    parser.add_argument("--limits", default="{}", help="HttpLimits fields as JSON")
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--prefill-s", type=float, default=0.0)
    parser.add_argument("--token-s", type=float, default=0.0)
    parser.add_argument("--max-prompt-chars", type=int)
    parser.add_argument("--open-files", type=int, help="this process's open-file limit")
    args = parser.parse_args()
    if args.open_files:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.open_files, args.open_files))
    chain = Chain(args.log, args.prefill_s, args.token_s, args.sessions)
    engine = LLMEngine(chain, Tokenizer(args.log), model_id="fake-llm", eos_ids=[EOS])  # type: ignore[arg-type]
    engine.max_prompt_chars = args.max_prompt_chars or engine.max_prompt_chars
    serve_api(engine, "127.0.0.1", 0, api_key=args.api_key,
              limits=HttpLimits(**json.loads(args.limits)),
              ready=lambda port: print(f"port {port}", flush=True))


if __name__ == "__main__":
    main()
