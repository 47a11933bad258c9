"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

Two things the Markdown cannot say by itself:

- the CLI reference (``docs/reference/cli.md``) is typer's own documentation of the app,
  generated when the site is built, so it lists exactly the commands and options there are;
- the benchmark pages include ``benchmarks/results/*.md`` with ``--8<--`` (pymdownx.snippets),
  and those files show figures beside them (``![...](l2s_drift.png)``): the figures are added
  to the site under ``benchmarks/``, where the including pages are, so the links resolve as
  they do on GitHub.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CLI_MARKER = "<!-- cli-reference: generated from the typer app when the site is built -->"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Every figure of benchmarks/results/, at the same place under benchmarks/."""
    for image in sorted(RESULTS.rglob("*.png")):
        uri = f"benchmarks/{image.relative_to(RESULTS).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(image)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if CLI_MARKER not in markdown:
        return markdown
    return markdown.replace(CLI_MARKER, cli_reference())


def cli_reference() -> str:
    """typer's Markdown documentation of ``edgesplit`` and every sub-command, headings one
    level below the page's title."""
    import typer
    from typer.cli import get_docs_for_click

    from edgesplit.cli import app

    command = typer.main.get_command(app)
    with typer.Context(command, info_name="edgesplit") as ctx:
        return get_docs_for_click(obj=command, ctx=ctx, indent=1, name="edgesplit")
