"""`edgesplit llm api`: an OpenAI-compatible HTTP endpoint (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``) over an LLM plan's chain, a command of ``llm_app``."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import typer

from edgesplit.cli._app import (
    SHAPE_HELP,
    THREADS_HELP,
    TLS_SERVER_NAME_HELP,
    TOKEN_FILE_HELP,
    TOKEN_HELP,
    TORCH_DEVICE_HELP,
    check_torch_device,
    err,
    set_threads,
    tls_files,
    user_errors,
)
from edgesplit.cli.llm import llm_app

__all__ = ["API_KEY_ENV", "api"]

API_KEY_ENV = "EDGESPLIT_API_KEY"
_HTTP = "HTTP API"


@llm_app.command("api")
@user_errors
def api(
    plan_path: Path = typer.Argument(..., help="An LLM plan (`edgesplit llm plan --out`)."),
    server: str | None = typer.Option(None, "--server", help="HOST:PORT of the second "
                                                             "device's `llm serve` (not needed "
                                                             "when the first holds every "
                                                             "block)."),
    port: int = typer.Option(8000, "--port", "-p", min=0, max=65535,
                             help="HTTP port (0: any free port).", rich_help_panel=_HTTP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: "
                                                         "all).", rich_help_panel=_HTTP),
    api_key: str | None = typer.Option(None, "--api-key",
                                       help="Key clients send as 'Authorization: Bearer KEY' "
                                            f"(default: ${API_KEY_ENV}; none: no key). "
                                            "Visible in `ps`: prefer --api-key-file.",
                                       rich_help_panel=_HTTP),
    api_key_file: Path | None = typer.Option(None, "--api-key-file",
                                             help="Read the API key from this file (one "
                                                  "line).", rich_help_panel=_HTTP),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
    token_file: Path | None = typer.Option(None, "--token-file", help=TOKEN_FILE_HELP),
    tls_server_name: str | None = typer.Option(None, "--tls-server-name",
                                               help=TLS_SERVER_NAME_HELP),
    tls_ca: Path | None = typer.Option(None, "--tls-ca", help="Reach --server over TLS, "
                                                              "trusting this CA."),
    timeout_s: float = typer.Option(60.0, "--timeout-s", help="Per-step deadline."),
    retries: int = typer.Option(0, "--retries", help="Retry an unavailable server this often."),
    data_plane: str = typer.Option("auto", "--data-plane", help="auto (the server's data "
                                   "plane if it has one), grpc or tcp."),
    shape: bool = typer.Option(False, "--shape/--no-shape", help=SHAPE_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help=THREADS_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
) -> None:
    """Serve an OpenAI-compatible API over an LLM plan until interrupted: its first stage
    runs here, the rest on the `llm serve` chain at --server. Point any OpenAI client at the
    printed URL."""
    from edgesplit.cli.serving import _data_plane
    from edgesplit.plan import load_plan
    from edgesplit.runtime.llm_api import serve_api
    from edgesplit.runtime.llm_engine import open_engine
    from edgesplit.transport import read_token

    set_threads(threads)
    check_torch_device(torch_device)
    key = read_api_key(api_key, api_key_file)
    if key is None and not _is_loopback(host):
        err.print(f"warning: serving on {host} without --api-key: anyone who can reach it "
                  "can generate", highlight=False)
    engine = open_engine(load_plan(plan_path), server, token=read_token(token, token_file),
                         tls=tls_files(None, None, tls_ca, tls_server_name), timeout_s=timeout_s,
                         retries=retries, data_plane=_data_plane(data_plane),
                         shape=shape, torch_device=torch_device)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL

    def ready(bound: int) -> None:
        # one machine-readable line on stdout: scripts and tests wait for it
        print(f"api listening on http://{shown}:{bound}/v1 model={engine.model_id}",
              flush=True)

    try:
        serve_api(engine, host, port, api_key=key, ready=ready)
    finally:
        close = getattr(engine, "close", None)  # the chain's sessions and connections
        if close is not None:
            close()


def read_api_key(api_key: str | None, api_key_file: Path | None) -> str | None:
    """The API key from exactly one place: --api-key, --api-key-file, else $EDGESPLIT_API_KEY.
    None when none is given: the API then takes requests without a key."""
    from edgesplit.transport.auth import read_secret

    return read_secret(api_key, api_key_file, env=API_KEY_ENV, what="API key",
                       flags=("--api-key", "--api-key-file"), carrier="an HTTP header",
                       inner_spaces=False)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
