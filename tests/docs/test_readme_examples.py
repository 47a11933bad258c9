"""Every console example in README.md runs as printed, so a README that drifts from the code
fails here.

Each ```` ```console ```` block is one test, run in a fresh folder holding a copy of the repo's
``examples/`` (the README's commands run from a clone's root). Lines starting ``$ `` are
commands (a line ending in ``\\`` continues on the next); the other lines are output shown to
the reader and are not checked, except that the lines starting ``you> `` under a command are
typed into it (``llm chat``). The commands of a block run in order and share the folder
(``plan --out plan.json``, then ``serve plan.json``); each must exit 0. A command may start
with ``NAME=value`` environment assignments; its program must be ``edgesplit`` (the venv's
console script) or ``python`` (the venv's); a trailing ``#`` comment is the shell's. A
command ending in ``&`` runs in the background: the block goes on once it prints ``listening
on`` (every edgesplit server does) and stops it (SIGTERM) when the block ends. The ports of
``--port N`` and ``127.0.0.1:N`` are replaced by free ones, the same N by the same port within
a block, so blocks can run side by side. Commands run with one torch thread
(``OMP_NUM_THREADS=1``): the suite's two workers share two cores.

Markers: HTML comments (invisible on GitHub) on the lines right above a block's fence, one
directive each::

    <!-- readme-test: skip: REASON -->              the block is not run
    <!-- readme-test: skip "TEXT": REASON -->       commands containing TEXT are not run
    <!-- readme-test: add "TEXT" "OPTIONS" -->      OPTIONS appended to commands containing TEXT
                                                    (an option given twice takes its last value,
                                                    so this shrinks a printed setting)
    <!-- readme-test: replace "OLD" "NEW" -->       OLD becomes NEW in every command
    <!-- readme-test: files NAME... -->             sample inputs the README assumes the reader
                                                    has, written by SAMPLES below
    <!-- readme-test: setup "COMMAND" -->           run before the block's commands
    <!-- readme-test: exit N "TEXT" -->             commands containing TEXT must exit with N
    <!-- readme-test: needs NAME -->                the block runs where NAME (NEEDS below) is
                                                    installed, and is skipped, saying so, elsewhere

Every TEXT and OLD must match a command of its block, and every marker must sit on a block,
so markers cannot go stale. A block with a command that cannot run here (another program, a
``...`` placeholder) or with no command at all fails unless a marker skips it. A command
skipped for the "time budget" (every command pays seconds of imports, and the suite runs on
two cores) is one whose options another command here, or the test it names, runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# A hang guard only: the commands take seconds to a minute; nothing here is a timing check.
HANG_S = 600
READY = "listening on"

MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```console\s*$")
SKIP = re.compile(r'^skip(?:\s+"([^"]+)")?\s*:\s*(\S.*)$')
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PORT = re.compile(r"(--port[ =]|127\.0\.0\.1:)(\d+)\b")


@dataclass
class Command:
    text: str                     # continuation lines joined
    line: int
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    line: int
    heading: str
    markers: list[str]
    commands: list[Command]

    @property
    def id(self) -> str:
        words = re.findall(r"[a-z0-9]+", self.heading.lower())[:4]
        return f"{'-'.join(words)}@{self.line}"


def parse(text: str) -> tuple[list[Block], list[str]]:
    """The console blocks of a Markdown text, and one problem per marker on no block."""
    blocks: list[Block] = []
    problems: list[str] = []
    lines = text.splitlines()
    heading, pending = "", []
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := MARKER.match(line):
            pending.append((i + 1, m.group(1)))
            i += 1
            continue
        fence = FENCE.match(line)
        if pending and not fence:
            problems += [f"README line {n}: marker on no console block: {d}" for n, d in pending]
            pending = []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if not fence:
            i += 1
            if line.lstrip().startswith("```"):  # another code block: skip to its end
                while i < len(lines) and not lines[i].lstrip().startswith("```"):
                    i += 1
                i += 1
            continue
        indent, start = len(fence.group(1)), i + 1
        block = Block(start, heading, [d for _, d in pending], [])
        pending = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body = lines[i][indent:]
            if body.startswith("$ "):
                first = i + 1
                command = body[2:].rstrip()
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1].rstrip() + " " + lines[i].strip()
                block.commands.append(Command(command, first))
            elif block.commands:
                block.commands[-1].shown.append(body)
            i += 1
        blocks.append(block)
        i += 1
    problems += [f"README line {n}: marker on no console block: {d}" for n, d in pending]
    return blocks, problems


@dataclass
class Step:
    """A command as it runs: program arguments, extra environment, what it is given and must
    return."""
    command: Command
    argv: list[str]
    env: dict[str, str]
    background: bool
    exit: int = 0
    stdin: str | None = None


@dataclass
class Run:
    skip: str | None = None
    files: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)


def _matching(text: str, commands: list[Command], directive: str) -> list[Command]:
    hits = [c for c in commands if text in c.text]
    if not hits:
        raise ValueError(f"marker '{directive}' matches no command of the block")
    return hits


def _step(command: Command, text: str, extra: list[str]) -> Step:
    words = shlex.split(text, comments=True)
    background = bool(words) and words[-1] == "&"
    if background:
        words = words[:-1]
    env = {}
    while words and ENV.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words or words[0] not in ("edgesplit", "python"):
        raise ValueError(f"README line {command.line}: cannot run '{command.text}' (only "
                         "edgesplit and python commands run): skip it with a marker that says why")
    if any("..." in w for w in words + list(env.values())):
        raise ValueError(f"README line {command.line}: '{command.text}' holds a '...' "
                         "placeholder: skip it with a marker that says why")
    stdin = "".join(s[len("you> "):] + "\n" for s in command.shown if s.startswith("you> "))
    return Step(command, words + extra, env, background, stdin=stdin or None)


def plan_block(block: Block) -> Run:
    """How a block runs, from its markers; ValueError on a marker or command that cannot."""
    run = Run()
    commands = list(block.commands)
    texts = {id(c): c.text for c in commands}
    extra: dict[int, list[str]] = {id(c): [] for c in commands}
    exits: dict[int, int] = {}
    setup: list[Command] = []
    missing: str | None = None
    for directive in block.markers:
        if m := SKIP.match(directive):
            if m.group(1) is None:
                run.skip = m.group(2)
                continue
            for c in _matching(m.group(1), commands, directive):
                commands.remove(c)
            continue
        words = shlex.split(directive)
        kind, args = (words[0], words[1:]) if words else ("", [])
        if kind in ("add", "replace") and len(args) == 2:
            for c in _matching(args[0], block.commands, directive):
                if kind == "add":
                    extra[id(c)] += shlex.split(args[1])
                else:
                    texts[id(c)] = texts[id(c)].replace(args[0], args[1])
        elif kind == "files" and args:
            unknown = sorted(set(args) - set(SAMPLES))
            if unknown:
                raise ValueError(f"marker '{directive}': no sample file {unknown} (SAMPLES "
                                 f"has {sorted(SAMPLES)})")
            run.files += args
        elif kind == "setup" and len(args) == 1:
            setup.append(Command(args[0], block.line))
        elif kind == "needs" and len(args) == 1 and args[0] in NEEDS:
            missing = missing or NEEDS[args[0]]()
        elif kind == "exit" and len(args) == 2 and args[0].isdigit():
            for c in _matching(args[1], block.commands, directive):
                exits[id(c)] = int(args[0])
        else:
            raise ValueError(f"unknown readme-test marker '{directive}' (see the docstring of "
                             "tests/docs/test_readme_examples.py)")
    run.skip = run.skip or missing
    if run.skip is not None:
        return run
    if not commands:
        raise ValueError(f"README line {block.line}: a console block with no command to run: "
                         "skip it with a marker that says why")
    run.steps = [_step(c, c.text, []) for c in setup]
    run.steps += [_step(c, texts[id(c)], extra[id(c)]) for c in commands]
    for step in run.steps:
        step.exit = exits.get(id(step.command), 0)
    return run


# -- sample inputs the README assumes its reader has ------------------------------------------

def _model_pt2(path: Path) -> None:
    """A small CNN (1x3x32x32 -> 10 classes) saved with torch.export.save."""
    import torch
    from torch import nn

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
        torch.export.save(torch.export.export(model, (torch.randn(1, 3, 32, 32),)), path)


def _held_out(path: Path) -> None:
    """64 random inputs for the model.pt2 sample, with labels."""
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(path, inputs=rng.standard_normal((64, 3, 32, 32), dtype=np.float32),
             labels=rng.integers(0, 10, 64))


def _chain(path: Path) -> None:
    path.write_text("name: my-chain\n"
                    "devices: [jetson-nano, rtx3050-laptop, v100-server]\n"
                    "links:\n"
                    "  - {src: jetson-nano, dst: rtx3050-laptop, link: wifi}\n"
                    "  - {src: rtx3050-laptop, dst: v100-server, link: 4g}\n")


def _llama_config(path: Path) -> None:
    """A transformers config.json of a small Llama (planning needs no weights)."""
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False}))


def _search_space(path: Path) -> None:
    """A two-stage MBConv search space on 1x32x32 inputs."""
    from edgesplit.nas.jmsnas import HeadSpec, SearchSpace, StemSpec

    space = SearchSpace.from_stages("my-space", (1, 32, 32), 10, stem=StemSpec(8, stride=2),
                                    stages=[(8, 1, 2), (16, 1, 2)], head=HeadSpec(0))
    path.write_text(json.dumps(space.to_dict()))


def _digits_slice(path: Path) -> None:
    """The first 240 training digits: the built-in set at a fraction of the work."""
    import numpy as np

    from edgesplit.data.training import load_labelled

    digits = load_labelled("digits")
    np.savez(path, inputs=digits.train.inputs[0][:240].numpy(),
             labels=digits.train.labels[:240].numpy())


def _ue_device(path: Path) -> None:
    """The jmsnas-chain topology's device 'ue' as a device file, for its own latency table."""
    from edgesplit.hardware import get_topology

    ue = next(d for d in get_topology("jmsnas-chain").devices if d.name == "ue")
    path.write_text(json.dumps(ue.model_dump(mode="json")))


SAMPLES: dict[str, Callable[[Path], None]] = {
    "model.pt2": _model_pt2,
    "my_model.pt2": _model_pt2,
    "held_out.npz": _held_out,
    "my-chain.yaml": _chain,
    "path/to/config.json": _llama_config,
    "my-space.json": _search_space,
    "digits-240.npz": _digits_slice,
    "ue-device.json": _ue_device,
}


# -- what some blocks need installed: None where it is, else why the block is skipped --------

def _fashion_mnist() -> str | None:
    from edgesplit.data.images import FASHION_MNIST_INSTALL, fashion_mnist_dir

    if (fashion_mnist_dir() / "t10k-images-idx3-ubyte.gz").is_file():
        return None
    return f"Fashion-MNIST is not installed: {FASHION_MNIST_INSTALL}"


NEEDS: dict[str, Callable[[], str | None]] = {"fashion-mnist": _fashion_mnist}


# -- running -------------------------------------------------------------------------------

def _program(name: str) -> list[str]:
    if name == "python":
        return [sys.executable]
    script = Path(sys.executable).with_name("edgesplit")
    return [str(script)] if script.exists() else [
        sys.executable, "-c", "from edgesplit.cli import main; main()"]


def _free_ports(steps: list[Step]) -> None:
    """Replace the ports a block names by free ones, consistently within the block."""
    ports: dict[str, str] = {}

    def free(m: re.Match[str]) -> str:
        if m.group(2) not in ports:
            ports[m.group(2)] = str(free_port())
        return m.group(1) + ports[m.group(2)]

    for step in steps:
        # "--port N" as two words: join them for the pattern, split them after
        joined = PORT.sub(free, "\x00".join(step.argv).replace("--port\x00", "--port "))
        step.argv = joined.replace("--port ", "--port\x00").split("\x00")


class Server:
    """A background command: started, read until it is ready, stopped with its group."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.output: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if READY in line:
                self.ready.set()
        self.ready.set()  # ended: wait() below tells which

    def wait_ready(self) -> bool:
        self.ready.wait(HANG_S)
        return any(READY in line for line in self.output)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.reader.join(5)


@contextlib.contextmanager
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        yield started
    finally:
        for server in reversed(started):
            server.stop()


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_block(block: Block, folder: Path) -> None:
    run = plan_block(block)
    if run.skip is not None:
        pytest.skip(run.skip)
    shutil.copytree(ROOT / "examples", folder / "examples")
    for name in run.files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        SAMPLES[name](folder / name)
    _free_ports(run.steps)
    base = dict(os.environ, OMP_NUM_THREADS="1",
                PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                      os.environ.get("PATH", "")]))
    with servers() as started:
        for step in run.steps:
            argv = _program(step.argv[0]) + step.argv[1:]
            env = base | step.env
            where = f"README line {step.command.line}: $ {step.command.text}"
            if step.background:
                server = Server(argv, folder, env)
                started.append(server)
                if not server.wait_ready():
                    pytest.fail(f"{where}\nnever printed '{READY}' (exit status "
                                f"{server.proc.poll()}):\n{_tail(''.join(server.output))}")
                continue
            done = subprocess.run(argv, cwd=folder, env=env, input=step.stdin or "",
                                  capture_output=True, text=True, timeout=HANG_S)
            if done.returncode != step.exit:
                pytest.fail(f"{where}\nexit status {done.returncode}, expected {step.exit}:\n"
                            f"{_tail(done.stdout)}\n{_tail(done.stderr)}")


BLOCKS, ORPHANS = parse(README.read_text())


def test_every_marker_sits_on_a_console_block():
    assert BLOCKS
    assert not ORPHANS, "\n".join(ORPHANS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_console_block_runs(block, tmp_path):
    run_block(block, tmp_path)


def test_the_parser_joins_lines_reads_markers_and_refuses_what_cannot_run():
    text = ("# Title\n<!-- readme-test: add \"plan\" \"--json\" -->\n"
            "<!-- readme-test: exit 2 \"chat\" -->\n```console\n"
            "$ edgesplit plan x \\\n      --out p.json   # a comment\nshown output\n"
            "$ edgesplit llm chat p.json --port 6000 --server 127.0.0.1:6000 &\nyou> hi\n```\n\n"
            "```python\n# not a heading\n```\n```console\n$ pip install x\n```\n"
            "<!-- readme-test: skip: stale -->\ntext\n")
    blocks, orphans = parse(text)
    assert [(b.line, b.heading) for b in blocks] == [(4, "Title"), (15, "Title")]
    assert len(orphans) == 1
    first, pip = blocks
    assert [c.text for c in first.commands] == [
        "edgesplit plan x --out p.json   # a comment",
        "edgesplit llm chat p.json --port 6000 --server 127.0.0.1:6000 &"]
    steps = plan_block(first).steps
    assert steps[0].argv == ["edgesplit", "plan", "x", "--out", "p.json", "--json"]
    assert (steps[0].exit, steps[1].exit) == (0, 2)
    assert steps[1].background and steps[1].stdin == "hi\n"
    _free_ports(steps)
    port = steps[1].argv[5]
    assert port != "6000" and steps[1].argv[7] == f"127.0.0.1:{port}"
    with pytest.raises(ValueError, match="only edgesplit and python"):
        plan_block(pip)
    with pytest.raises(ValueError, match="matches no command"):
        plan_block(Block(1, "", ['replace "nothing" "x"'], first.commands))
    with pytest.raises(ValueError, match="unknown readme-test marker"):
        plan_block(Block(1, "", ["skipp: typo"], first.commands))
