"""`edgesplit llm api`: an OpenAI-compatible HTTP endpoint (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``) over an LLM plan's chain, a command of ``llm_app``."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import typer

from edgesplit.cli._app import (
    LLM_THREADS_HELP,
    SHAPE_HELP,
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
_LIMITS = "HTTP limits (checked before any work; the defaults are safe)"


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
    threads: int | None = typer.Option(None, "--threads", min=1, help=LLM_THREADS_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
    wait_for_stage_s: float = typer.Option(0.0, "--wait-for-stage-s", min=0.0,
                                           help="Wait this long for --server's stage to "
                                                "answer at start (0: it must answer now)."),
    max_body_bytes: str = typer.Option("2MiB", "--max-body-bytes", rich_help_panel=_LIMITS,
                                       help="Largest request body (413 over it; the "
                                            "Content-Length is checked before reading)."),
    max_prompt_chars: int | None = typer.Option(
        None, "--max-prompt-chars", min=1, rich_help_panel=_LIMITS,
        help="Longest prompt in characters, checked before tokenizing (default: the most "
             "that can fit the plan's context, so no prompt that fits is refused)."),
    header_timeout_s: float = typer.Option(10.0, "--header-timeout-s", min=0.001,
                                           rich_help_panel=_LIMITS,
                                           help="A request's head must arrive within this "
                                                "(408 and closed: idle and slow-header "
                                                "connections)."),
    body_timeout_s: float = typer.Option(30.0, "--body-timeout-s", min=0.001,
                                         rich_help_panel=_LIMITS,
                                         help="A request's body must arrive within this "
                                              "(408)."),
    keep_alive_s: float = typer.Option(5.0, "--keep-alive-s", min=0.001,
                                       rich_help_panel=_LIMITS,
                                       help="An idle kept-alive connection is closed after "
                                            "this."),
    max_connections: int = typer.Option(512, "--max-connections", min=1,
                                        rich_help_panel=_LIMITS,
                                        help="Open connections at most (503 and closed over "
                                             "it)."),
    max_connections_per_host: int = typer.Option(64, "--max-connections-per-host", min=1,
                                                 rich_help_panel=_LIMITS,
                                                 help="Open connections from one address at "
                                                      "most."),
) -> None:
    """Serve an OpenAI-compatible API over an LLM plan until interrupted: its first stage
    runs here, the rest on the `llm serve` chain at --server. Point any OpenAI client at the
    printed URL."""
    from edgesplit.cli.serving import _data_plane
    from edgesplit.llm.api.app import serve_api
    from edgesplit.llm.api.http_guard import HttpLimits
    from edgesplit.llm.generate.engine import open_engine
    from edgesplit.plan import load_plan
    from edgesplit.transport import read_token
    from edgesplit.units import parse_bytes

    set_threads(threads)
    check_torch_device(torch_device)
    limits = HttpLimits(max_body_bytes=parse_bytes(max_body_bytes, "--max-body-bytes") or 0,
                        header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                        keep_alive_s=keep_alive_s, max_connections=max_connections,
                        max_connections_per_host=max_connections_per_host)
    key = read_api_key(api_key, api_key_file)
    if key is None and not _is_loopback(host):
        err.print(f"warning: serving on {host} without --api-key: anyone who can reach it "
                  "can generate", highlight=False)
    # a quantized first stage's ONNX Runtime threads, where given (its default: one)
    ort_threads: dict[str, Any] = {} if threads is None else {"threads": threads}
    engine = open_engine(load_plan(plan_path), server, token=read_token(token, token_file),
                         tls=tls_files(None, None, tls_ca, tls_server_name), timeout_s=timeout_s,
                         retries=retries, data_plane=_data_plane(data_plane),
                         shape=shape, torch_device=torch_device, **ort_threads)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    _check_stage(engine, server, wait_for_stage_s)

    def ready(bound: int) -> None:
        # one machine-readable line on stdout: scripts and tests wait for it
        print(f"api listening on http://{shown}:{bound}/v1 model={engine.model_id}",
              flush=True)

    try:
        serve_api(engine, host, port, api_key=key, limits=limits,
                  max_prompt_chars=max_prompt_chars, ready=ready)
    finally:
        close = getattr(engine, "close", None)  # the chain's sessions and connections
        if close is not None:
            close()


def _check_stage(engine: object, server: str | None, wait_s: float) -> None:
    """Ask the stage at ``server`` which plan it runs before taking requests, waiting up to
    ``wait_s`` for it to answer (one line on stderr says so): a stage that is down or runs
    another plan is one line at start, not a 502 on the first request."""
    import time

    from edgesplit.errors import RemoteError

    client = getattr(engine, "client", None)
    if server is None or client is None or not getattr(client, "remote", False):
        return
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            client.check_plan()
            return
        except RemoteError as exc:
            if time.monotonic() >= deadline:
                raise RemoteError(f"checked at start: {exc} (start `edgesplit llm serve` "
                                  "there first, or give --wait-for-stage-s)") from None
            if not said:
                err.print(f"waiting up to {wait_s:g} s for the stage at {server} ...",
                          highlight=False)
                said = True
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


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
