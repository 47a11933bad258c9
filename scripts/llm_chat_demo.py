"""`make demo`'s first act: chat with SmolLM2-135M-Instruct split over two processes.

It plans the built-in real checkpoint on a phone and a laptop that each hold about half of it
(examples/llm-phone-laptop.yaml), serves the laptop's stage with `edgesplit llm serve`, and
chats through `edgesplit llm chat` on the phone's side: two turns, the second continuing the
session (only its new tokens are prefilled). The commands are docs/systems/llm.md's; this
script only starts and stops the server.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".demo" / "llm"
TURNS = "Which city is the capital of France?\nAnd of Germany?\n"


def _edgesplit() -> str:
    found = shutil.which("edgesplit", path=str(Path(sys.executable).parent))
    return found or "edgesplit"


def _run(*args: str, stdin: str | None = None) -> None:
    print("$ edgesplit " + " ".join(args), flush=True)
    subprocess.run([_edgesplit(), *args], input=stdin, text=True, check=True)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    plan = str(OUT / "plan.json")
    _run("llm", "plan", "smollm2-135m-instruct", "-t",
         str(ROOT / "examples" / "llm-phone-laptop.yaml"), "--max-context", "1024",
         "--out", plan)
    print("$ edgesplit llm serve " + plan + " --device laptop --port 0 &", flush=True)
    server = subprocess.Popen([_edgesplit(), "llm", "serve", plan, "--device", "laptop",
                               "--port", "0", "--threads", "1"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # "listening on HOST:PORT ..." once it serves
        if not line.startswith("listening on "):
            print(f"the server did not start: {line!r}", file=sys.stderr)
            return 1
        address = line.split()[2]
        _run("llm", "chat", plan, "--server", address, "--threads", "1", stdin=TURNS)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print("Next: `edgesplit llm api " + plan + " --server HOST:PORT` serves the same chat as "
          "an OpenAI-compatible endpoint (docs/systems/llm.md).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
