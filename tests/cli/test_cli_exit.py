"""The command line's fast exit (``edgesplit.cli._exit_fast``): a finished command skips the
interpreter's teardown, but keeps what a normal exit does for the user: exit status, output
through a pipe, atexit handlers, and threads still working. Each case is a real subprocess,
since the fast exit ends the process it runs in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUN = ("import sys; from edgesplit.cli import main; sys.argv = ['edgesplit', *{argv!r}]; "
       "{before}main()")


def _run(argv: list[str], before: str = "") -> subprocess.CompletedProcess[str]:
    code = RUN.format(argv=argv, before=before)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)


def test_output_through_a_pipe_arrives_whole() -> None:
    done = _run(["devices", "--json"])
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # flushed before the process ended, not cut off
    assert doc


def test_a_user_error_keeps_its_status_and_one_line() -> None:
    done = _run(["plan", "no_such_model"])
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: unknown model 'no_such_model'")
    assert "Traceback" not in done.stderr


def test_atexit_handlers_still_run(tmp_path: Path) -> None:
    mark = tmp_path / "atexit"
    before = (f"import atexit, pathlib; "
              f"atexit.register(pathlib.Path({str(mark)!r}).write_text, 'ran'); ")
    done = _run(["--help"], before)
    assert done.returncode == 0, done.stderr
    assert mark.read_text() == "ran"


def test_a_working_thread_is_waited_for(tmp_path: Path) -> None:
    # a non-daemon thread still running at the end: the normal exit joins it, so its write lands
    mark = tmp_path / "thread"
    before = (f"import threading, time, pathlib; "
              f"threading.Thread(target=lambda: (time.sleep(0.5), "
              f"pathlib.Path({str(mark)!r}).write_text('done'))).start(); ")
    done = _run(["--help"], before)
    assert done.returncode == 0, done.stderr
    assert mark.read_text() == "done"
