"""`edgesplit simulate-l2s | serve-training | train-split`: L2S split training, simulated and
real."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from edgesplit.cli._app import (
    TLS_SERVER_NAME_HELP,
    TOKEN_FILE_HELP,
    TOKEN_HELP,
    TRUST_HELP,
    app,
    emit_json,
    err,
    out,
    tls_files,
    user_errors,
)
from edgesplit.cli.serve_options import serve_options

if TYPE_CHECKING:
    from edgesplit.runtime.options import ServeOptions


@app.command("simulate-l2s")
@user_errors
def simulate_l2s(
    model: str = typer.Option("alexnet", "--model", help="Built-in model name or .pt2 file."),
    bandwidth_mbps: float = typer.Option(60.0, "--bandwidth-mbps", help="Link bandwidth."),
    rounds: int = typer.Option(500, "--rounds", help="Training rounds to simulate."),
    drop_at: int | None = typer.Option(None, "--drop-at", help="Round of a bandwidth drop."),
    drop_to: float | None = typer.Option(None, "--drop-to", help="Bandwidth after the drop."),
    restore_at: int | None = typer.Option(
        None, "--restore-at", help="Round where the bandwidth returns to --bandwidth-mbps."),
    device: str = typer.Option("raspberry-pi-4", "--device", help="End device preset or file."),
    server: str = typer.Option("gtx1080ti-server", "--server", help="Edge server."),
    rtt_ms: float = typer.Option(5.0, "--rtt-ms", help="Round-trip time of the link."),
    privacy_split: int | None = typer.Option(
        None, "--privacy-split", help="P^c: at least this many layers stay on the device."),
    privacy_kl: float | None = typer.Option(
        None, "--privacy-kl", help="P^c from the KL privacy analysis: every cut sent must "
        "reach this divergence (pre-trained models with built-in data, e.g. digits_cnn)."),
    seed: int = typer.Option(0, "--seed"),
    noise: float = typer.Option(0.05, "--noise", help="Relative noise of each delay."),
    alpha: float | None = typer.Option(
        None, "--alpha", help="Exploration weight, in units of the on-device delay."),
    random_reentry: float = typer.Option(
        0.0, "--random-reentry", help="r_d: chance per regular round to re-enter adaptation."),
    plot: Path | None = typer.Option(None, "--plot", help="Delay and partition per round."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trust_model_file: bool = typer.Option(False, "--trust-model-file", help=TRUST_HELP),
) -> None:
    """Simulate L2S split training (trace-driven): Oracle, FPT, PDT, LinUCB, L2S and L2S-FWS
    on the same model, devices and bandwidth trace."""
    from edgesplit.errors import ConfigError
    from edgesplit.graph import capture
    from edgesplit.hardware import resolve_device
    from edgesplit.train.l2s import L2S_ALPHA, compare_policies
    from edgesplit.train.modes import ModeConfig
    from edgesplit.train.privacy import analyse_privacy
    from edgesplit.train.simulator import BandwidthTrace

    if privacy_split is not None and privacy_kl is not None:
        raise ConfigError("give --privacy-split or --privacy-kl, not both")
    trace = BandwidthTrace(bandwidth_mbps, rtt_ms, drop_at, drop_to, restore_at)
    modes = ModeConfig(r_d=random_reentry, seed=seed)
    with err.status(f"simulating {rounds} rounds of {model} ...", spinner="dots"):
        graph = capture(model, optimize=False,  # L2S splits the framework's own layers
                        trust_model_file=trust_model_file)
        privacy = None
        if privacy_kl is not None:
            privacy = analyse_privacy(model, privacy_kl, graph)
            privacy_split = privacy["privacy_split"]
        doc = compare_policies(graph, resolve_device(device), resolve_device(server), trace,
                               rounds, privacy_split=privacy_split, seed=seed, noise=noise,
                               alpha=L2S_ALPHA if alpha is None else alpha, modes=modes,
                               privacy=privacy)
    if plot is not None:
        from edgesplit.report.plots import plot_l2s

        plot_l2s(doc, plot)
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.train_tables import l2s_policies_table

    title = (f"{model}: {doc['device']} -> {doc['server']}, {bandwidth_mbps:g} Mbps"
             + (f", {drop_to:g} Mbps from round {drop_at}" if drop_at else "")
             + (f", back at {restore_at}" if restore_at else "")
             + f"; privacy point {doc['privacy_point']} layers")
    table = l2s_policies_table(doc, title)
    out.print(table)
    if plot is not None:
        err.print(f"wrote {plot}")


@app.command("serve-training")
@user_errors
@serve_options(work="training requests", only=("token", "token_file", "tls_cert", "tls_key"))
def serve_training_cmd(
    model: str = typer.Option(
        "digits_cnn", "--model", help="Model spec to train, as the device names it: "
        "digits_cnn, or NAME[:pretrained,classes=N,input=CxHxW], e.g. "
        "mobilenet_v2:pretrained,classes=10,input=3x32x32."),
    lr: float = typer.Option(0.01, "--lr", help="SGD learning rate of the server's layers."),
    momentum: float = typer.Option(0.9, "--momentum", help="SGD momentum."),
    seed: int = typer.Option(0, "--seed", help="Initial weights (the device must match)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(50052, "--port", "-p", help="Port (0: any free port)."),
    max_batch: int = typer.Option(256, "--max-batch", help="Most samples per training round "
                                                           "(sizes the message limit)."),
    session_timeout_s: float = typer.Option(
        600.0, "--session-timeout-s", help="Idle time after which another device may start "
                                           "a session."),
    *,
    options: ServeOptions,
) -> None:
    """Serve the edge-server side of split training (L2S) until interrupted: one device's
    session at a time (another is refused until it closes, idles out, or a device takes it
    over with `train-split --take-over`)."""
    from edgesplit.train.remote import serve_training

    serve_training(model, lr=lr, momentum=momentum, seed=seed, host=host, port=port,
                   options=options, max_batch=max_batch, session_timeout_s=session_timeout_s,
                   on_ready=lambda bound: print(f"listening on {host}:{bound} model={model}",
                                                flush=True))


@app.command("train-split")
@user_errors
def train_split_cmd(
    model: str = typer.Option(
        "digits_cnn", "--model", help="Model to train: digits_cnn (from scratch) or any "
        "built-in whose layer chain can be formed, e.g. mobilenet_v2."),
    pretrained: bool = typer.Option(
        False, "--pretrained", help="Start from the model's ImageNet weights (fresh "
        "classifier for the data's classes)."),
    data: str = typer.Option(
        "digits", "--data", help="digits, or fashion-mnist[:size=N,channels=C,norm=imagenet] "
        "(train split to train, test split for the accuracy)."),
    train_limit: int | None = typer.Option(
        None, "--train-limit", help="Train on the first N training images only (default "
        "all); the accuracy is on the whole test split."),
    server: str | None = typer.Option(
        None, "--server", help="HOST:PORT of `edgesplit serve-training` (default: start one)."),
    epochs: int = typer.Option(8, "--epochs"),
    batch_size: int = typer.Option(32, "--batch-size"),
    lr: float = typer.Option(0.01, "--lr"),
    momentum: float = typer.Option(0.9, "--momentum"),
    seed: int = typer.Option(0, "--seed"),
    bandwidth_mbps: float = typer.Option(400.0, "--bandwidth-mbps", help="Emulated link."),
    rtt_ms: float = typer.Option(2.0, "--rtt-ms"),
    drop_at: int | None = typer.Option(None, "--drop-at", help="Round of a bandwidth drop."),
    drop_to: float | None = typer.Option(None, "--drop-to", help="Bandwidth after the drop."),
    restore_at: int | None = typer.Option(None, "--restore-at",
                                          help="Round where the bandwidth comes back."),
    device_slowdown: float = typer.Option(
        20.0, "--device-slowdown", help="How much slower the device computes than the server."),
    policy: str = typer.Option("l2s", "--policy", help="l2s (learn the cut) or fixed."),
    cut: int | None = typer.Option(None, "--cut", help="Fixed policy: last device element."),
    sync: str = typer.Option("fws", "--sync", help="Weight sync: fws or periodic."),
    sync_every: int = typer.Option(100, "--sync-every", help="Periodic sync interval."),
    privacy_kl: float | None = typer.Option(
        1.0, "--privacy-kl", help="P^c: every cut sent must reach this KL divergence."),
    privacy_split: int | None = typer.Option(
        None, "--privacy-split", help="P^c directly: at least this many chain elements stay "
        "on the device (instead of --privacy-kl)."),
    no_privacy: bool = typer.Option(False, "--no-privacy", help="Allow every cut."),
    horizon: int = typer.Option(30, "--horizon", help="Rounds of one adaptation phase."),
    random_reentry: float = typer.Option(0.0, "--random-reentry", help="r_d per round."),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline",
                                  help="Also train unsplit, to compare accuracy."),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
    token_file: Path | None = typer.Option(None, "--token-file", help=TOKEN_FILE_HELP),
    tls_server_name: str | None = typer.Option(None, "--tls-server-name",
                                               help=TLS_SERVER_NAME_HELP),
    tls_ca: Path | None = typer.Option(None, "--tls-ca", help="Reach --server over TLS, "
                                                              "trusting this CA."),
    take_over: bool = typer.Option(False, "--take-over", help="End the session the server "
                                   "has open (this device's, before a crash) and start over."),
    plot: Path | None = typer.Option(None, "--plot", help="Delay and cut per round."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Split training over two processes (L2S): the device trains the front layers, the
    server the back ones; L2S learns the cut as the emulated link changes."""
    from contextlib import nullcontext

    from edgesplit.errors import ConfigError
    from edgesplit.runtime.options import CallOptions
    from edgesplit.train.remote import DEFAULT_MAX_BATCH
    from edgesplit.train.session import (
        TrainSplitConfig,
        load_split_data,
        local_training_server,
        model_for_data,
        one_core_per_side,
        train_split,
    )
    from edgesplit.transport import read_token

    if server is None and (tls_ca is not None or take_over):
        raise ConfigError("--tls-ca and --take-over are for a server you started (--server "
                          "HOST:PORT); without --server, train-split starts its own on "
                          "127.0.0.1")
    token = read_token(token, token_file)
    tls = tls_files(None, None, tls_ca, tls_server_name)

    if pretrained:
        model += "," if ":" in model else ":"
        model += "pretrained"
    config = TrainSplitConfig(
        model=model, data=data, train_limit=train_limit, epochs=epochs, batch_size=batch_size,
        lr=lr, momentum=momentum, seed=seed,
        bandwidth_mbps=bandwidth_mbps, rtt_ms=rtt_ms, drop_at=drop_at, drop_to=drop_to,
        restore_at=restore_at, device_slowdown=device_slowdown, policy=policy, cut=cut,
        sync=sync, sync_every=sync_every, privacy_kl=None if no_privacy else privacy_kl,
        privacy_split=None if no_privacy else privacy_split, horizon=horizon,
        random_reentry=random_reentry, baseline=baseline)
    # what the server builds: the model sized for the data (refused here if it does not fit)
    spec = str(model_for_data(config.model, load_split_data(data, batch_size, seed)))
    if server is None:
        one_core_per_side()
    spawn = local_training_server(spec, lr=lr, momentum=momentum, seed=seed, token=token,
                                  max_batch=max(batch_size, DEFAULT_MAX_BATCH)) \
        if server is None else nullcontext(server)
    with spawn as address:
        doc = train_split(config, address, calls=CallOptions(token=token, tls=tls),
                          take_over=take_over, progress=not as_json)
    if plot is not None:
        from edgesplit.report.plots import plot_train_split

        plot_train_split(doc, plot)
    if as_json:
        emit_json(doc)
        return
    from edgesplit.report.train_tables import train_split_summary, train_split_table

    out.print(train_split_table(doc))
    for line in train_split_summary(doc):
        out.print(line)
    if plot is not None:
        err.print(f"wrote {plot}")
