"""The benchmarks' ``--render-only`` (the NAS ones, runtime and hostile): the markdown and
figures redrawn from the saved JSON without measuring, the markdown as the run wrote it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BENCHES = {"nas_jmsnas": ("nas_jmsnas_fig5.png", "nas_jmsnas_fig6.png"),
           "nas_adaptivenet": ("nas_adaptivenet_search.png", "nas_adaptivenet_switching.png"),
           "nas_splitnets": ("nas_splitnets_single.png", "nas_splitnets_multi.png"),
           "runtime": ("runtime_mesh.png",), "hostile": ()}


def _torchless(text: str) -> str:
    """JMSNAS's markdown names the torch of the run; results saved before the JSON recorded
    it render with the installed one."""
    return re.sub(r"torch [^;]+;", "torch X;", text)


@pytest.mark.parametrize("name", list(BENCHES))
def test_render_only_redraws_from_the_saved_json(tmp_path: Path, name: str) -> None:
    saved = RESULTS / f"{name}.json"
    if not saved.is_file():
        pytest.skip(f"no saved {saved.name}")
    shutil.copy(saved, tmp_path / saved.name)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"bench_{name}.py"),
                           "--render-only", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / saved.name).read_bytes() == saved.read_bytes()  # read, not rewritten
    for png in BENCHES[name]:
        assert (tmp_path / png).read_bytes().startswith(PNG_MAGIC)
    if (RESULTS / f"{name}.md").is_file():
        assert _torchless((tmp_path / f"{name}.md").read_text()) == _torchless(
            (RESULTS / f"{name}.md").read_text())
