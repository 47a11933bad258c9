"""`edgesplit export | serve | run`: a plan's parts as ONNX files, served over gRPC, and driven
by a client (a chain's first device runs in `run`; a star's sources are servers `run`
addresses with `--source NAME=HOST:PORT`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from edgesplit.cli._app import (
    BACKEND_HELP,
    SHAPE_HELP,
    THREADS_HELP,
    TLS_SERVER_NAME_HELP,
    TOKEN_FILE_HELP,
    TOKEN_HELP,
    TORCH_DEVICE_HELP,
    TRUST_HELP,
    app,
    check_torch_device,
    emit_json,
    err,
    load_program,
    out,
    rehearsal,
    set_threads,
    tls_files,
    user_errors,
)
from edgesplit.cli.serve_options import serve_options

if TYPE_CHECKING:
    from edgesplit.runtime import PlanProgram
    from edgesplit.runtime.dataplane import DataPlane
    from edgesplit.runtime.options import ServeOptions

EMULATE_HELP = ("Compute emulation: after each compute, sleep until it took what the plan "
                "predicts for this device, so this machine runs at the speed of the device "
                "preset it was planned with (it cannot speed up a slower one).")


@app.command()
@user_errors
def export(
    plan_path: Path = typer.Argument(..., help="A plan written by `edgesplit plan --out`."),
    out_dir: Path = typer.Option(Path("export"), "--out", "-o", help="Folder to write into."),
    fmt: str = typer.Option("onnx", "--format", help="onnx (one file per device)."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
) -> None:
    """Write every device's part of PLAN as its own ONNX model (inputs and outputs named by
    tensor), plus manifest.json saying what each device receives, sends and at which bits."""
    from edgesplit.errors import ConfigError

    if fmt != "onnx":
        raise ConfigError(f"unknown export format {fmt!r}: use onnx")
    program = load_program(plan_path, trust_model_file=trust_model_file)
    out_dir.mkdir(parents=True, exist_ok=True)
    with err.status("exporting ...", spinner="dots"):
        models = program.export_onnx()
    for device, data in models.items():
        (out_dir / f"{device}.onnx").write_bytes(data)
        err.print(f"wrote {out_dir / f'{device}.onnx'} ({len(data):,} bytes)")
    emit_json(program.manifest(), out_dir / "manifest.json")
    err.print(f"wrote {out_dir / 'manifest.json'}")


@app.command()
@user_errors
@serve_options(work="requests")
def serve(
    plan_path: Path = typer.Argument(..., help="A plan written by `edgesplit plan --out`."),
    device: str = typer.Option(..., "--device", "-d", help="The plan device this server runs "
                                                           "(e.g. cloud, a middle hop, a star's "
                                                           "sensor or aggregator)."),
    port: int = typer.Option(50051, "--port", "-p", help="Port (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: all)."),
    next_hop: list[str] = typer.Option([], "--next", help="HOST:PORT of the next device "
                                       "(middle hops of a chain; a star's sources: the sink; "
                                       "a mesh's root: NAME=HOST:PORT once per branch)."),
    backend: str = typer.Option("torch", "--backend", help=BACKEND_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
    max_batch: int | None = typer.Option(None, "--max-batch", help="Batch up to this many "
                                         "waiting requests (default 32 where the partition "
                                         "allows it; 1: no batching)."),
    max_wait_ms: float = typer.Option(0.0, "--max-wait-ms", help="Wait this long for a batch "
                                      "to fill (0: run what is waiting at once)."),
    join_timeout_s: float = typer.Option(10.0, "--join-timeout-s", help="A star's sink: how "
                                         "long a request waits for every source."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
    emulate_device: bool = typer.Option(False, "--emulate-device", help=EMULATE_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help=THREADS_HELP),
    engine: str = typer.Option("local", "--engine", help="What computes: local (this process) "
                               "or ray (a Ray Serve deployment this server forwards to; needs "
                               "pip install 'edgesplit\\[ray]')."),
    replicas: int | None = typer.Option(None, "--replicas", help="--engine ray: replicas "
                                        "(with --max-replicas: the initial count; default 1)."),
    min_replicas: int | None = typer.Option(None, "--min-replicas", help="--engine ray: "
                                            "autoscaling's lower bound (default 1)."),
    max_replicas: int | None = typer.Option(None, "--max-replicas", help="--engine ray: "
                                            "autoscale up to this many replicas."),
    target_ongoing: float | None = typer.Option(None, "--target-ongoing", help="--engine ray: "
                                                "requests per replica autoscaling aims at "
                                                "(default 2)."),
    replica_cpus: float | None = typer.Option(None, "--replica-cpus", help="--engine ray: "
                                              "Ray CPUs per replica (default 1; its torch "
                                              "threads follow)."),
    replica_gpus: float | None = typer.Option(None, "--replica-gpus", help="--engine ray: "
                                              "Ray GPUs per replica (default 0: the CPU; a "
                                              "fraction shares a GPU); replicas with GPUs "
                                              "compute on cuda."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="--engine ray: a "
                                           "running Ray cluster (HOST:PORT or auto; default: "
                                           "start one for this server)."),
    app_name: str | None = typer.Option(None, "--app-name", help="--engine ray: the Ray Serve "
                                        "application's name (default: edgesplit-<plan "
                                        "id>-<device>)."),
    *,
    options: ServeOptions,
) -> None:
    """Serve one device's part of PLAN over gRPC until interrupted (Ctrl-C / SIGTERM stop it
    gracefully). A star plan's sink joins its sources' calls of each request; each source
    forwards to it (--next). With --engine ray the partition runs on Ray Serve replicas
    (batched, optionally autoscaled) and this server is their ingress."""
    from edgesplit.runtime.planned import plan_device
    from edgesplit.runtime.server import partition_server
    from edgesplit.transport import serve_forever

    set_threads(threads)
    check_torch_device(torch_device)
    ray_settings = {"replicas": replicas, "min_replicas": min_replicas,
                    "max_replicas": max_replicas, "target_ongoing": target_ongoing,
                    "replica_cpus": replica_cpus, "replica_gpus": replica_gpus,
                    "address": ray_address,
                    "app_name": app_name}
    _check_engine(engine, ray_settings)
    if engine == "ray" and torch_device is not None:
        from edgesplit.errors import ConfigError

        raise ConfigError("--torch-device places this process's compute; with --engine ray "
                          "the replicas compute: leave out --torch-device (--replica-gpus "
                          "puts them on GPUs)")
    program = load_program(plan_path, backend, trust_model_file, torch_device)
    _warn_if_idle(program, plan_device(program, device))
    if emulate_device:
        if max_batch is not None and max_batch > 1:
            from edgesplit.errors import ConfigError

            raise ConfigError("--emulate-device paces each request to the plan's compute time: "
                              "it does not batch (leave out --max-batch)")
        max_batch = 1
        _emulate(program, plan_device(program, device))
    ray_engine = None
    if engine == "ray":
        ray_engine = _ray_engine(program, plan_device(program, device),
                                 {**ray_settings, "host": host}, max_batch, max_wait_ms,
                                 trust_model_file, emulate_device)
        max_batch = None  # the deployment batches
    try:
        server = partition_server(program, device, options,
                                  next_address=_next_address(program, device, next_hop),
                                  engine=ray_engine, max_batch=max_batch,
                                  max_wait_ms=max_wait_ms, join_timeout_s=join_timeout_s)
        bound = server.start(host, port)
    except BaseException:
        if ray_engine is not None:  # the deployment must not outlive a server that never ran
            ray_engine.close()
        raise
    data = f"{host}:{server.data_port}" if server.data_port else "off"
    # one machine-readable line on stdout: scripts and tests wait for it (fields by position)
    batcher = server.handler.batcher
    batch = batcher.max_batch if batcher is not None else "off"
    where = f"engine=local torch_device={program.step(device).backend.device}"
    if ray_engine is not None:
        opts = ray_engine.options
        batching = ray_engine.replica_info["batching"]
        batch = opts.max_batch if batching.startswith("up to") else "off"
        scale = (f"replicas={opts.replicas}" if opts.max_replicas is None else
                 f"replicas={opts.min_replicas or 1}..{opts.max_replicas}")
        where = f"engine=ray {scale} app={ray_engine.app_name}"
    print(f"listening on {host}:{bound} device={device} plan={program.plan_id} data={data} "
          f"batch={batch} {where} {rehearsal(options.shape, emulate_device)}", flush=True)
    serve_forever(server)


def _check_engine(engine: str, ray_settings: dict) -> None:
    """--engine is local or ray; the Ray options need --engine ray (given alone they would be
    ignored without a word)."""
    from edgesplit.errors import ConfigError
    from edgesplit.runtime.ray_engine import ENGINES

    if engine not in ENGINES:
        raise ConfigError(f"--engine takes {', '.join(ENGINES)}, not {engine!r}")
    if engine == "ray":
        from edgesplit.runtime.ray_engine import import_ray

        import_ray()  # without the extra: one line naming the install command, before any work
        _check_replica_gpus(ray_settings)
    given = [k for k, v in ray_settings.items() if v is not None]
    if engine != "ray" and given:
        flags = ", ".join("--" + ("ray-address" if k == "address" else k.replace("_", "-"))
                          for k in given)
        raise ConfigError(f"{flags} configure the Ray engine: add --engine ray")


def _check_replica_gpus(ray_settings: dict) -> None:
    """--replica-gpus on the Ray cluster this server starts (no --ray-address) needs a GPU on
    this machine: refused before the plan is loaded, not left waiting for one. A joined
    cluster's GPUs are counted once it is joined (:class:`RayEngine` refuses none there)."""
    gpus = ray_settings["replica_gpus"]
    if not gpus or ray_settings["address"] is not None:
        return
    import torch

    from edgesplit.errors import ConfigError
    from edgesplit.hardware.accelerator import accelerators

    if not torch.cuda.is_available():
        raise ConfigError(f"--replica-gpus {gpus:g}: this machine has no CUDA device for the "
                          f"Ray cluster this server starts (available: "
                          f"{', '.join(accelerators())}); leave out --replica-gpus or join a "
                          "cluster with GPUs (--ray-address)")


def _ray_engine(program: PlanProgram, device: str, settings: dict, max_batch: int | None,
                max_wait_ms: float, trust_model_file: bool, emulate: bool):
    """The deployment ``serve --engine ray`` forwards to (deployed here, with a spinner)."""
    from edgesplit.runtime.ray_engine import RayEngine, RayOptions

    options = RayOptions(**{k: v for k, v in settings.items() if v is not None},
                         max_batch=32 if max_batch is None else max_batch,
                         max_wait_ms=max_wait_ms)
    with err.status(f"deploying {device} on Ray Serve ...", spinner="dots"):
        engine = RayEngine(program, device, options, trust_model_file=trust_model_file,
                           emulate=emulate)
    info = engine.replica_info
    err.print(f"Ray Serve: {engine.app_name}, batching {info['batching']}, replicas on "
              f"{info.get('torch_device', 'cpu')}")
    return engine


@app.command()
@user_errors
def run(
    plan_path: Path = typer.Argument(..., help="A plan written by `edgesplit plan --out`."),
    server: str | None = typer.Option(None, "--server", help="HOST:PORT of the second "
                                                             "device's server (chains)."),
    sources: list[str] = typer.Option([], "--source", help="NAME=HOST:PORT of a star plan's "
                                                           "source device; once per source."),
    input_path: Path | None = typer.Option(None, "--input", help=".pt/.npz of inputs "
                                           "(default: the example): every row is sent, in "
                                           "requests of the plan's batch size."),
    out_path: Path | None = typer.Option(None, "--out", help="Write every row's outputs, "
                                         "top-1 class and difference from the unsplit model "
                                         "to this .npz (with --input)."),
    requests: int | None = typer.Option(None, "--requests", "-n", help="Requests in all "
                                        "(default: one per batch of --input, else 1; "
                                        "reported; -n 20 -c 4: 20 requests, 5 per client)."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="Concurrent clients, "
                                    "sharing --requests (never more clients than requests)."),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
    token_file: Path | None = typer.Option(None, "--token-file", help=TOKEN_FILE_HELP),
    tls_server_name: str | None = typer.Option(None, "--tls-server-name",
                                               help=TLS_SERVER_NAME_HELP),
    tls_ca: Path | None = typer.Option(None, "--tls-ca", help="Use TLS, trusting this CA."),
    shape: bool = typer.Option(False, "--shape/--no-shape", help=SHAPE_HELP),
    retries: int = typer.Option(0, "--retries", help="Retry unavailable servers this often."),
    timeout_s: float = typer.Option(60.0, "--timeout-s", help="Per-request deadline."),
    warmup: int = typer.Option(1, "--warmup", help="Unreported requests first, per client."),
    backend: str = typer.Option("torch", "--backend", help=BACKEND_HELP),
    torch_device: str | None = typer.Option(None, "--torch-device", help=TORCH_DEVICE_HELP),
    data_plane: str = typer.Option("auto", "--data-plane", help="auto (the server's data "
                                   "plane if it has one), grpc or tcp."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
    emulate_device: bool = typer.Option(False, "--emulate-device", help=EMULATE_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help=THREADS_HELP),
) -> None:
    """Run the first device's part of PLAN here and the rest on the served chain (a star
    plan: send every source its own inputs, --source per source); report measured against
    predicted latency and the difference from the unsplit model. With --input, every row's
    outputs come back (--json, --out)."""
    from edgesplit.runtime.outputs import OutputCollector, check_out_path, load_rows
    from edgesplit.runtime.session import run_requests
    from edgesplit.transport import read_token

    set_threads(threads)
    check_torch_device(torch_device)
    token = read_token(token, token_file)
    if out_path is not None:
        check_out_path(out_path, needs_input=input_path is None)
    program = load_program(plan_path, backend, trust_model_file, torch_device)
    address = _addresses(program, server, sources)
    if emulate_device:
        if program.kind == "star":
            from edgesplit.errors import ConfigError

            raise ConfigError("in a star plan `run` computes nothing: give --emulate-device to "
                              "each `edgesplit serve` instead")
        _emulate(program, program.steps[0].name)
    rows = load_rows(input_path, program) if input_path else None
    requests = _request_count(requests, len(rows.batches) if rows else None, input_path)
    collector = OutputCollector(program, rows.batches, rows.labels) if rows else None
    options = {"token": token, "tls": tls_files(None, None, tls_ca, tls_server_name),
               "shape": shape, "retries": retries, "timeout_s": timeout_s,
               "data_plane": _data_plane(data_plane)}
    where = server if isinstance(address, str) else ", ".join(address.values())
    clients = min(requests, concurrency)  # no client is started with nothing to send
    with _progress(f"{requests} request(s) from {clients} client(s) to {where}",
                   requests) as on_done:
        report = run_requests(program, address, requests=requests, concurrency=concurrency,
                              inputs=rows.batches if rows else None, client_options=options,
                              warmup=warmup, on_done=on_done,
                              on_result=collector.add if collector else None)
    report["rehearsal"] = {"links_shaped": shape, "compute_emulated": emulate_device}
    outputs = collector.result(program.unsplit) if collector else None
    if outputs is not None:
        if out_path is not None:
            from edgesplit.runtime.outputs import write_outputs

            write_outputs(out_path, outputs)
        report["outputs"] = outputs.document(out_path)
    if as_json:
        emit_json(report)
    else:
        from edgesplit.report.plan_tables import outputs_table, run_table

        out.print(run_table(report))
        if outputs is not None:
            out.print(outputs_table(outputs.document(), str(out_path) if out_path else None))
        err.print(rehearsal(shape, emulate_device), highlight=False)
    if report["errors"]:
        raise typer.Exit(1)


def _request_count(requests: int | None, batches: int | None, input_path: Path | None) -> int:
    """``--requests``, by default one per batch of the inputs file (each row once) or 1; a
    count that leaves rows unsent says so in one line (their outputs stay empty)."""
    if requests is None:
        return batches or 1
    if batches and requests < batches:
        err.print(f"warning: -n {requests} sends {requests} of the {batches} requests "
                  f"{input_path} makes: the rest of its rows get no output (leave out -n to "
                  "send every row once)", highlight=False, soft_wrap=True)
    return requests


@contextmanager
def _progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """``run_requests``'s ``on_done``, fed to a progress bar (plain lines in a log): a long
    inputs file shows how far it got."""
    from edgesplit.cli.nas import progress_bar

    done = [0]
    lock = threading.Lock()
    with progress_bar(description) as progress:
        def on_done(n: int) -> None:
            with lock:  # the clients' threads call this
                done[0] += n
                progress("requests", done[0], total)

        yield on_done


def _warn_if_idle(program: PlanProgram, device: str) -> None:
    """One line when the served device computes nothing in the plan: it would listen and
    relay, which looks like a working split but is not one (an edge-only plan's cloud)."""
    if program.step(device).partition is None:
        err.print(f"warning: {device} computes nothing in this plan ({program.plan.method}: "
                  "every layer is on other devices); it only passes requests on. To give it "
                  "layers, plan with --split-after LAYER or another --method", highlight=False)


def _emulate(program: PlanProgram, device: str) -> None:
    """Turn on compute emulation for ``device`` and say so on stderr (one line)."""
    targets = program.emulate([device])
    preset = next(d.device.name for d in program.plan.devices if d.name == device)
    if targets:
        err.print(f"emulating {device} ({preset}): each compute lasts the plan's "
                  f"{targets[device]:.2f} ms")
    else:
        err.print(f"--emulate-device: {device} computes nothing in this plan (it only relays)")


def _data_port(value: str) -> int | None:
    """--data-port: a port number, 0 for any free one, or off."""
    from edgesplit.errors import ConfigError

    if value.lower() in ("off", "none", "no"):
        return None
    if not value.isdigit() or int(value) > 65535:
        raise ConfigError(f"--data-port takes a port (0-65535; 0: any free port) or off, "
                          f"not {value!r}")
    return int(value)


def _data_plane(value: str) -> DataPlane:
    from edgesplit.errors import ConfigError
    from edgesplit.runtime.dataplane import DATA_PLANES

    if value not in DATA_PLANES:
        raise ConfigError(f"--data-plane takes {', '.join(DATA_PLANES)}, not {value!r}")
    return cast("DataPlane", value)


def _next_address(program: PlanProgram, device: str, hops: list[str]
                  ) -> str | dict[str, str] | None:
    """``--next``: one HOST:PORT, or NAME=HOST:PORT per branch for a mesh's root."""
    from edgesplit.errors import ConfigError
    from edgesplit.runtime.mesh import check_branches
    from edgesplit.runtime.planned import plan_device

    if plan_device(program, device) == program.root:
        parsed = _named(hops, "--next")
        check_branches(program, parsed)
        return parsed
    if len(hops) > 1:
        raise ConfigError(f"device {device} sends to one device: give --next HOST:PORT once")
    return hops[0] if hops else None


def _named(items: list[str], flag: str) -> dict[str, str]:
    """``NAME=HOST:PORT`` items by name."""
    from edgesplit.errors import ConfigError

    parsed: dict[str, str] = {}
    for item in items:
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise ConfigError(f"{flag} takes NAME=HOST:PORT, got {item!r}")
        if name in parsed:
            raise ConfigError(f"{flag} {name}=... is given twice")
        parsed[name] = address
    return parsed


def _addresses(program: PlanProgram, server: str | None, sources: list[str]
               ) -> str | dict[str, str]:
    """``--server`` for a chain; ``--source NAME=HOST:PORT`` for each source of a star (or
    each branch of a mesh whose root is the first device)."""
    from edgesplit.errors import ConfigError
    from edgesplit.runtime.star import check_addresses

    if program.kind == "mesh" and program.root == program.steps[0].name:
        from edgesplit.runtime.mesh import check_branches

        if server is not None:
            raise ConfigError("this mesh plan's root runs here: give each branch's address "
                              "with --source NAME=HOST:PORT, not --server")
        parsed = _named(sources, "--source")
        check_branches(program, parsed)
        return parsed
    if program.kind != "star":
        if sources:
            raise ConfigError("--source is for star plans; this plan is a chain: give the "
                              "second device's address with --server HOST:PORT")
        if server is None:
            raise ConfigError("give the second device's address with --server HOST:PORT")
        return server
    if server is not None:
        raise ConfigError(f"this plan is a star: give each source's address with --source "
                          f"NAME=HOST:PORT (its sources: {', '.join(program.sources)}), not "
                          "--server")
    parsed = _named(sources, "--source")
    check_addresses(program, parsed)
    return parsed
