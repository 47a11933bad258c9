"""The documentation builds, and every example in it runs as printed, as a new user would try it.

- ``mkdocs build --strict`` (a warning is an error: a broken link or anchor, a page left out
  of the nav, a benchmark result file that is not there) builds the site into a temporary
  folder.
- Every page (``README.md`` and ``docs/**/*.md``) runs its examples in order, in a fresh folder
  holding a copy of the repository's ``examples/`` (the pages' commands run from a clone's
  root), so a file an earlier step makes is there for a later one and nothing else is:

  - a ```` ```console ```` block's ``$ `` lines are commands (a line ending in ``\\``
    continues on the next); the other lines are output shown to the reader and are not
    checked, except that lines starting ``you> `` under a command are typed into it (``llm
    chat``), and a first output line starting ``error:`` says that the command must fail with
    status 2 and print that line (up to a trailing ``...``). A command may start with
    ``NAME=value`` environment assignments; its program must be ``edgesplit`` (the venv's
    console script) or ``python`` (the venv's); a trailing ``#`` comment is the shell's. A
    command ending in ``&`` runs in the background: the page goes on once it prints
    ``listening on`` (every edgesplit server does) and it is stopped (SIGTERM) when the page
    ends, so a later block (a Python client) can call it;
  - a ```` ```python ```` block runs in the page's Python process (one per page, so torch is
    imported once), each block in a fresh namespace: a block imports what it uses;
  - a block titled with a file name (```` ```yaml title="my-chain.yaml" ````) is that file: it
    is written into the folder, not run;
  - a block titled ``not run: REASON`` is shown only; each one is listed in ``NOT_RUN`` below
    with why the tests leave it out, so a skip is a decision, not an accident;
  - a block titled ``runs on PAGE`` (the README's examples of each system) runs there: every
    command of it (or, for Python, its whole text) must be in a block of that page, which
    runs it in its own context, so it is tested once, as printed, and never drifts;
  - other blocks (``text``, ``json``, ``yaml`` without a file name) are shown only.

  ``--8<-- "FILE"`` lines inside a block are replaced by FILE as the site includes it
  (pymdownx.snippets, from the ``base_path`` folders of mkdocs.yml). The ports of ``--port N``
  and ``127.0.0.1:N`` are replaced by free ones, the same N by the same port within a page, in
  commands and Python alike, so pages can run side by side. Commands run with one torch thread
  (``OMP_NUM_THREADS=1``): the suite's two workers share two cores. A command that cannot run
  here (another program, a ``...`` placeholder) fails the page unless its block is not run.

``docs/design/docs-tests.md`` says the same for whoever writes a page. Budget: every page's
examples together take about two and a half minutes one after the other on a quiet machine
(most of it the second or two each command spends importing torch), about half that with the
suite's two workers, so they use small settings (tiny models, a few epochs on 240 digits) and
run each command once (the README's are run on their pages); what takes longer is shown in a
block that is not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A hang guard only: a page's steps take seconds; nothing here is a timing check.
HANG_S = 600
READY = "listening on"

FENCE = re.compile(r"^(\s*)```(\w*)(.*)$")
TITLE = re.compile(r'title="([^"]*)"')
FILE_NAME = re.compile(r"^[\w./-]+\.\w+$")
RUNS_ON = re.compile(r"^runs on (\S+\.md)$")
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PORT = re.compile(r"(--port[ =]|127\.0\.0\.1:)(\d+)\b")

# Blocks shown but not run, by (page, title), with why the tests leave each out: what it
# needs that a test run does not have, and where the same thing is tested instead.
NOT_RUN: dict[tuple[str, str], str] = {
    ("README.md", "not run: sets up the environment, minutes"):
        "make demo and make test: the test run is part of the second",
    ("README.md", "not run: installs packages and starts a Ray cluster"):
        "a Ray cluster takes most of this file's time budget; tests/runtime/test_runtime_ray.py "
        "serves with --engine ray on a local cluster",
    ("docs/getting-started.md", "not run: sets up the environment, minutes"):
        "make targets: the test run is one of them",
    ("docs/serving.md", "not run: needs root (network namespaces and netem)"):
        "needs root; tests/transport/test_shaping.py checks the tc commands, and --shape "
        "emulates links without root",
    ("docs/serving.md", "not run: needs a CUDA GPU"):
        "tests/runtime/test_accelerator.py runs it where CUDA is, and checks the refusal elsewhere",
    ("docs/systems/l2s.md", "not run: trains MobileNetV2 on Fashion-MNIST, minutes per seed"):
        "tests/train/test_train_split_any_model.py trains it split on a fixture",
    ("docs/systems/l2s.md", "not run: two machines, a certificate and a token file"):
        "tests/train/test_train_remote.py trains over TLS with a token",
    ("docs/systems/splitnets.md", "not run: trains a multi-view supernet, minutes"):
        "time budget; tests/nas/test_nas_splitnets_cli.py searches a star and "
        "tests/runtime/test_runtime_star.py serves one over gRPC",
    ("docs/systems/ray.md", "not run: installs packages and starts a Ray cluster"):
        "tests/runtime/test_runtime_ray.py serves with --engine ray on a local cluster",
    ("docs/systems/ray.md", "not run: a Ray cluster across machines"):
        "needs several machines",
    ("docs/vision.md", "not run: fine-tunes MobileNetV2 on Fashion-MNIST, about 7 minutes"):
        "tests/train/test_finetune.py and tests/models/test_pretrained_vision.py fine-tune on "
        "small slices",
}


@dataclass
class Command:
    text: str                     # continuation lines joined
    line: int
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    """One fenced block of a page: its language, title, first body line and body."""

    line: int
    lang: str
    title: str
    body: str

    @property
    def not_run(self) -> bool:
        return self.title.startswith("not run")

    @property
    def runs_on(self) -> str | None:
        """The page that runs this block, for a block titled ``runs on PAGE``."""
        m = RUNS_ON.match(self.title)
        return m[1] if m else None

    @property
    def file(self) -> str | None:
        """The file this block is, when its title names one."""
        return self.title if FILE_NAME.match(self.title) else None

    def commands(self) -> list[Command]:
        found: list[Command] = []
        lines = self.body.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("$ "):
                first, command = i, line[2:].rstrip()
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1].rstrip() + " " + lines[i].strip()
                found.append(Command(command, self.line + first))
            elif found:
                found[-1].shown.append(line)
            i += 1
        return found


def snippet_paths() -> list[Path]:
    """The folders ``--8<--`` reads from: pymdownx.snippets' base_path in mkdocs.yml."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    for extension in config["markdown_extensions"]:
        if isinstance(extension, dict) and "pymdownx.snippets" in extension:
            return [ROOT / p for p in extension["pymdownx.snippets"]["base_path"]]
    return []


def _expand(body: str, bases: list[Path]) -> str:
    def one(line: str) -> str:
        m = SNIPPET.match(line)
        if not m:
            return line
        for base in bases:
            if (base / m[1]).is_file():
                return (base / m[1]).read_text().rstrip("\n")
        raise ValueError(f"--8<-- {m[1]!r} is in none of {[str(b) for b in bases]}")

    return "\n".join(one(line) for line in body.splitlines())


def parse(text: str, bases: list[Path] | None = None) -> list[Block]:
    """The fenced blocks of a Markdown text, in order (indented ones inside lists too)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, lang, info = len(fence[1]), fence[2], fence[3]
        title = TITLE.search(info)
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        blocks.append(Block(start + 1, lang, title[1] if title else "",
                            _expand("\n".join(body), bases or [])))
        i += 1
    return blocks


# -- how a page runs ------------------------------------------------------------------------

@dataclass
class Step:
    """One thing a page does, in order: a command (program arguments, extra environment, what
    it is given and must return), a Python block, or a file to write."""

    where: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    background: bool = False
    exit: int = 0
    error: str | None = None      # the error line a failing command must print
    stdin: str | None = None
    python: str | None = None
    file: tuple[str, str] | None = None


def _command_step(page: str, command: Command) -> Step:
    where = f"{page} line {command.line}: $ {command.text}"
    words = shlex.split(command.text, comments=True)
    background = bool(words) and words[-1] == "&"
    if background:
        words = words[:-1]
    env = {}
    while words and ENV.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words or words[0] not in ("edgesplit", "python"):
        raise ValueError(f"{where}: only edgesplit and python commands run: show it in a block "
                         "titled 'not run: REASON' (and list it in NOT_RUN)")
    if any("..." in w for w in words + list(env.values())):
        raise ValueError(f"{where}: holds a '...' placeholder: write the real value")
    stdin = "".join(s[len("you> "):] + "\n" for s in command.shown if s.startswith("you> "))
    shown = [s.strip() for s in command.shown if s.strip()]
    error = shown[0].removesuffix("...").strip() if shown and shown[0].startswith(
        "error:") else None
    return Step(where, words, env, background, exit=2 if error else 0, error=error,
                stdin=stdin or None)


def plan_page(page: str, blocks: list[Block]) -> tuple[list[Step], list[str]]:
    """The steps a page runs, and the titles of its blocks that are not run; ValueError on a
    block that cannot run as printed."""
    steps: list[Step] = []
    not_run: list[str] = []
    for block in blocks:
        where = f"{page} line {block.line}"
        if block.not_run:
            not_run.append(block.title)
        elif block.runs_on:
            continue  # test_blocks_run_elsewhere_are_on_their_page
        elif block.file:
            steps.append(Step(where, file=(block.file, block.body + "\n")))
        elif block.lang == "python":
            steps.append(Step(where, python=block.body))
        elif block.lang == "console":
            commands = block.commands()
            if not commands:
                raise ValueError(f"{where}: a console block with no '$ ' command")
            steps += [_command_step(page, c) for c in commands]
    return steps, not_run


# -- running -------------------------------------------------------------------------------

def _program(name: str) -> list[str]:
    if name == "python":
        return [sys.executable]
    script = Path(sys.executable).with_name("edgesplit")
    return [str(script)] if script.exists() else [
        sys.executable, "-c", "from edgesplit.cli import main; main()"]


def free_ports(steps: list[Step]) -> None:
    """Replace the ports a page names by free ones, the same N by the same port on the page,
    in commands and Python blocks alike."""
    ports: dict[str, str] = {}

    def free(m: re.Match[str]) -> str:
        if m[2] not in ports:
            ports[m[2]] = str(free_port())
        return m[1] + ports[m[2]]

    for step in steps:
        if step.python is not None:
            step.python = PORT.sub(free, step.python)
            continue
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


# The page's Python process: one block per line of stdin (JSON), each run in a fresh namespace
# with the block's own file name in tracebacks; one JSON line per block on the reply pipe.
DRIVER = """\
import json, os, sys, traceback
reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
for line in sys.stdin:
    block = json.loads(line)
    try:
        exec(compile(block["code"], block["where"], "exec"), {"__name__": "__main__"})
        reply.write(json.dumps({"ok": True}) + "\\n")
    except BaseException:
        reply.write(json.dumps({"ok": False, "error": traceback.format_exc()}) + "\\n")
    sys.stdout.flush()
"""


class PythonSession:
    """The page's Python process, started at its first Python block."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        read, write = os.pipe()
        self.log = cwd / ".python-session.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(write)], cwd=cwd,
                                         env=env, stdin=subprocess.PIPE, stdout=log,
                                         stderr=subprocess.STDOUT, text=True, pass_fds=(write,),
                                         start_new_session=True)
        os.close(write)
        self.replies = os.fdopen(read)

    def run(self, code: str, where: str) -> str | None:
        """None when the block ran; else its traceback and what it printed."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"code": code, "where": where}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.replies], [], [], HANG_S)
        line = self.replies.readline() if ready else ""
        if not line:
            return f"no answer (exit status {self.proc.poll()}):\n{_tail(self.log.read_text())}"
        reply = json.loads(line)
        return None if reply["ok"] else f"{reply['error']}\nprinted:\n{_tail(self.log.read_text())}"

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.replies.close()


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_page(page: str, steps: list[Step], folder: Path) -> None:
    shutil.copytree(ROOT / "examples", folder / "examples")
    free_ports(steps)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                     os.environ.get("PATH", "")]))
    servers: list[Server] = []
    python: PythonSession | None = None
    try:
        for step in steps:
            if step.file is not None:
                name, text = step.file
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(text)
            elif step.python is not None:
                python = python or PythonSession(folder, env)
                failed = python.run(step.python, step.where)
                if failed is not None:
                    pytest.fail(f"{step.where} (python):\n{failed}")
            elif step.background:
                server = Server(_program(step.argv[0]) + step.argv[1:], folder, env | step.env)
                servers.append(server)
                if not server.wait_ready():
                    pytest.fail(f"{step.where}\nnever printed '{READY}' (exit status "
                                f"{server.proc.poll()}):\n{_tail(''.join(server.output))}")
            else:
                _run_command(step, folder, env)
    finally:
        if python is not None:
            python.stop()
        for server in reversed(servers):
            server.stop()


def _run_command(step: Step, folder: Path, env: dict[str, str]) -> None:
    done = subprocess.run(_program(step.argv[0]) + step.argv[1:], cwd=folder,
                          env=env | step.env, input=step.stdin or "", capture_output=True,
                          text=True, timeout=HANG_S)
    if done.returncode != step.exit:
        pytest.fail(f"{step.where}\nexit status {done.returncode}, expected {step.exit}:\n"
                    f"{_tail(done.stdout)}\n{_tail(done.stderr)}")
    if step.error is not None and step.error not in " ".join(done.stderr.split()):
        pytest.fail(f"{step.where}\nthe page shows '{step.error}', the command printed:\n"
                    f"{_tail(done.stderr)}")


# -- the tests -------------------------------------------------------------------------------

def pages() -> list[str]:
    found = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md"))]
    return [p for p in found if not p.startswith("docs/benchmarks/")]  # results, included


BASES = snippet_paths()
PAGES = {page: parse((ROOT / page).read_text(), BASES) for page in pages()}
RUNNABLE = [page for page, blocks in PAGES.items()
            if any(b.lang in ("console", "python") and not (b.not_run or b.file or b.runs_on)
                   for b in blocks)]


def test_the_site_builds_without_a_warning(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=HANG_S)
    assert done.returncode == 0, _tail(done.stdout + done.stderr, 60)
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "edgesplit plan" in cli and "--eval-data" in cli  # typer's reference, generated
    results = (tmp_path / "site" / "benchmarks" / "l2s" / "index.html").read_text()
    assert "Oracle" in results and (tmp_path / "site" / "benchmarks" / "l2s_drift.png").is_file()


def test_the_blocks_not_run_are_the_listed_ones():
    found = {(page, b.title) for page, blocks in PAGES.items() for b in blocks if b.not_run}
    assert found == NOT_RUN.keys(), (f"not listed in NOT_RUN: {sorted(found - NOT_RUN.keys())}; "
                                     f"listed but not found: {sorted(NOT_RUN.keys() - found)}")


def _words(command: Command) -> tuple[str, ...]:
    """A command as the shell reads it: line breaks, spacing and comments aside."""
    return tuple(shlex.split(command.text, comments=True))


def _commands(blocks: list[Block]) -> set[tuple[str, ...]]:
    return {_words(c) for b in blocks if b.lang == "console" and not (b.not_run or b.runs_on)
            for c in b.commands()}


def test_blocks_run_elsewhere_are_on_their_page():
    """A block titled ``runs on PAGE`` is tested there: each of its commands (its text, for
    Python) is in a block that PAGE runs."""
    problems = []
    for page, blocks in PAGES.items():
        for block in (b for b in blocks if b.runs_on):
            where = f"{page} line {block.line}"
            there = PAGES.get(block.runs_on)
            if there is None:
                problems.append(f"{where}: no page {block.runs_on}")
            elif block.lang == "console":
                problems += [f"{where}: '{c.text}' is not on {block.runs_on}"
                             for c in block.commands() if _words(c) not in _commands(there)]
            elif not any(b.lang == block.lang and block.body in b.body and not b.runs_on
                         for b in there):
                problems.append(f"{where}: this {block.lang} block is not on {block.runs_on}")
    assert not problems, "\n".join(problems)


def _nav_pages(entry: object) -> set[str]:
    if isinstance(entry, str):
        return {entry}
    if isinstance(entry, dict):
        return set().union(*(_nav_pages(v) for v in entry.values()))
    return set().union(*(_nav_pages(v) for v in entry)) if isinstance(entry, list) else set()


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    """mkdocs --strict fails on either; this says which, without a build."""
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    files = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert files == nav, f"not in the nav: {files - nav}; not a page: {nav - files}"


@pytest.mark.parametrize("page", RUNNABLE)
def test_page_examples_run(page, tmp_path):
    steps, _ = plan_page(page, PAGES[page])
    run_page(page, steps, tmp_path)


def test_the_parser_reads_blocks_titles_and_commands_and_refuses_what_cannot_run(tmp_path):
    (tmp_path / "part.py").write_text("x = 1\n")
    text = ("# Title\n```console\n"
            "$ edgesplit plan x \\\n      --out p.json   # a comment\nshown output\n"
            "$ edgesplit llm chat p.json --port 6000 --server 127.0.0.1:6000 &\nyou> hi\n"
            "$ edgesplit inspect nothing\nerror: unknown model 'nothing' ...\n```\n\n"
            '```python\nimport os\n--8<-- "part.py"\nprint("127.0.0.1:6000")\n```\n'
            '- a list\n\n  ```yaml title="chain.yaml"\n  name: c\n  ```\n'
            '```console title="not run: needs root"\n# ip netns add edge\n```\n'
            "```text\n$ shown only\n```\n```console\n$ pip install x\n```\n")
    blocks = parse(text, [tmp_path])
    assert [(b.line, b.lang, b.title) for b in blocks] == [
        (3, "console", ""), (13, "python", ""), (20, "yaml", "chain.yaml"),
        (23, "console", "not run: needs root"), (26, "text", ""), (29, "console", "")]
    assert blocks[1].body == 'import os\nx = 1\nprint("127.0.0.1:6000")'
    assert blocks[2].body == "name: c" and blocks[2].file == "chain.yaml"
    steps, not_run = plan_page("p.md", blocks[:5])
    assert not_run == ["not run: needs root"]
    plan, chat, failing, python, chain = steps
    assert plan.argv == ["edgesplit", "plan", "x", "--out", "p.json"]
    assert chat.background and chat.stdin == "hi\n" and plan.exit == 0
    assert (failing.exit, failing.error) == (2, "error: unknown model 'nothing'")
    assert chain.file == ("chain.yaml", "name: c\n")
    free_ports(steps)
    port = chat.argv[5]
    assert port != "6000" and chat.argv[7] == f"127.0.0.1:{port}"
    assert python.python is not None and f'"127.0.0.1:{port}"' in python.python
    with pytest.raises(ValueError, match="only edgesplit and python"):
        plan_page("p.md", blocks[5:])
    with pytest.raises(ValueError, match="placeholder"):
        plan_page("p.md", parse("```console\n$ edgesplit run p.json --server HOST:...\n```\n"))
    with pytest.raises(ValueError, match="no '\\$ ' command"):
        plan_page("p.md", parse("```console\nonly output\n```\n"))
