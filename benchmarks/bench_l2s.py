"""L2S in the simulator (paper 002, Section V): how close do LinUCB / LinUCB-E (L2S) get to the
Oracle's per-round training delay, how fast does L2S react to a bandwidth drop (Fig. 17), what
does a decision cost, and how often does plain LinUCB get trapped in pure on-device training.

Setup mirrors L2S Section V-A as far as our presets allow: end device `jetson-tx2` (the paper's
Nvidia Jetson TX2), edge server `gtx1080ti-server` (the paper's GTX 1080 Ti PC), Wi-Fi links
`l2s-wifi-60` / `l2s-wifi-100`, batch size 16 (graphs captured with input (16, 3, 224, 224)),
privacy point P^c = 4 (at least 4 layers on the device). Because with these presets the Oracle
is pure on-device training for every model at 60 and 100 Mbps, a second grid uses the slower
`jetson-nano` as the device, where the Oracle offloads for VGG16 and ResNet-34, so the bandits
have something to learn. All delays are cost-model predictions: they do not depend on the
machine; only the decision overhead (microseconds per round) does.

Writes benchmarks/results/l2s.md, l2s.json and l2s_drop.png.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from edgesplit.graph import capture
from edgesplit.hardware import get_device, get_link
from edgesplit.hardware.profile import machine_info
from edgesplit.report.plots import plot_l2s
from edgesplit.train.bandit import forced_sampling_rounds
from edgesplit.train.l2s import POLICIES, compare_policies, scaled_features
from edgesplit.train.simulator import BandwidthTrace, edge_ms, training_costs

RESULTS = Path(__file__).parent / "results"
MODELS = {"alexnet": "AlexNet", "vgg16": "VGG16", "resnet34": "ResNet-34"}
BATCH = 16  # L2S Section V-A: "training batch size to be 16"
PRIVACY = 4  # L2S Section V-A: "privacy requirement P^c to be 4"
ROUNDS = 500
SEEDS = (0, 1, 2)
NOISE = 0.05
RTT_MS = 5.0  # the link presets say 0 ms; 5 ms is the simulator's default and barely matters
LINKS = ("l2s-wifi-60", "l2s-wifi-100")
SERVER = "gtx1080ti-server"
DEVICES = {"jetson-tx2": "paper setup (Jetson TX2 -> GTX 1080 Ti)",
           "jetson-nano": "slower device (Jetson Nano -> GTX 1080 Ti), Oracle offloads"}
EARLY = (50, 100)  # rounds 50..100 (1-based, inclusive), the "after 50-100 rounds"
TARGET = 0.05
DROP = {"model": "resnet34", "device": "jetson-nano", "mbps": 100.0, "drop_at": 250,
        "drop_to": 10.0, "seed": 0}


def _window(delays: list[float], lo: int, hi: int) -> float:
    return float(np.mean(delays[lo - 1:hi]))


def _run_grid(graphs) -> list[dict]:
    rows = []
    for device_name in DEVICES:
        device, server = get_device(device_name), get_device(SERVER)
        for model, graph in graphs.items():
            for link_name in LINKS:
                mbps = get_link(link_name).bandwidth_mbps
                trace = BandwidthTrace(mbps, RTT_MS)
                for seed in SEEDS:
                    doc = compare_policies(graph, device, server, trace, ROUNDS,
                                           privacy_split=PRIVACY, seed=seed, noise=NOISE)
                    pol = doc["policies"]
                    pdt_split = doc["partitions"][-1]["split"]
                    oracle_final = pol["oracle"]["partitions"][-1]
                    row = {"device": device_name, "model": model, "link": link_name,
                           "mbps": mbps, "seed": seed, "pdt_split": pdt_split,
                           "privacy_point": doc["privacy_point"],
                           "oracle_split": oracle_final, "policies": {}}
                    fixed_us = np.mean([pol[p]["simulated_us_per_round"] for p in ("fpt", "pdt")])
                    row["fixed_us_per_round"] = float(fixed_us)
                    forced = set(forced_sampling_rounds(ROUNDS))
                    for name in POLICIES:
                        d = pol[name]["delays_ms"]
                        sync_ms = np.asarray(pol[name]["sync_bytes"]) * 8 / (mbps * 1e3)
                        d_nosync = list(np.asarray(d) - sync_ms)
                        tail = [pol[name]["partitions"][t - 1] for t in range(ROUNDS - 99, ROUNDS + 1)
                                if t not in forced or name not in ("l2s", "l2s_fws")]
                        row["policies"][name] = {
                            "early_ms": _window(d, *EARLY),
                            "early_nosync_ms": _window(d_nosync, *EARLY),
                            "last100_nosync_ms": _window(d_nosync, ROUNDS - 99, ROUNDS),
                            "tail_on_device": all(s == pdt_split for s in tail),
                            "last100_ms": _window(d, ROUNDS - 99, ROUNDS),
                            "mean_ms": pol[name]["mean_delay_ms"],
                            "final_split": pol[name]["partitions"][-1],
                            "sync_mb": sum(pol[name]["sync_bytes"]) / 1e6,
                            "us_per_round": pol[name]["simulated_us_per_round"],
                            "overhead_us": pol[name]["simulated_us_per_round"] - fixed_us,
                        }
                    rows.append(row)
    return rows


def _aggregate(rows: list[dict]) -> list[dict]:
    """Mean over seeds of each policy's ratio to the Oracle (same seed, same noise)."""
    out = []
    keys = sorted({(r["device"], r["model"], r["link"]) for r in rows},
                  key=lambda k: (list(DEVICES).index(k[0]), list(MODELS).index(k[1]), k[2]))
    for key in keys:
        group = [r for r in rows if (r["device"], r["model"], r["link"]) == key]
        agg = {"device": key[0], "model": key[1], "link": key[2], "mbps": group[0]["mbps"],
               "pdt_split": group[0]["pdt_split"], "privacy_point": group[0]["privacy_point"],
               "oracle_split": sorted({r["oracle_split"] for r in group}),
               "oracle_early_ms": float(np.mean([r["policies"]["oracle"]["early_ms"]
                                                 for r in group])),
               "policies": {}}
        for name in POLICIES:
            early = [r["policies"][name]["early_ms"] / r["policies"]["oracle"]["early_ms"]
                     for r in group]
            last = [r["policies"][name]["last100_ms"] / r["policies"]["oracle"]["last100_ms"]
                    for r in group]
            early_ns = [r["policies"][name]["early_nosync_ms"] / r["policies"]["oracle"]["early_ms"]
                        for r in group]
            last_ns = [r["policies"][name]["last100_nosync_ms"]
                       / r["policies"]["oracle"]["last100_ms"] for r in group]
            agg["policies"][name] = {
                "early_nosync_ratio": float(np.mean(early_ns)),
                "early_nosync_ratio_max": float(np.max(early_ns)),
                "last100_nosync_ratio": float(np.mean(last_ns)),
                "early_ratio": float(np.mean(early)), "early_ratio_max": float(np.max(early)),
                "last100_ratio": float(np.mean(last)),
                "final_splits": [r["policies"][name]["final_split"] for r in group],
                "sync_mb": float(np.mean([r["policies"][name]["sync_mb"] for r in group]))}
        agg["l2s_within_target_early"] = agg["policies"]["l2s"]["early_ratio_max"] <= 1 + TARGET
        agg["l2s_within_target_early_nosync"] = (
            agg["policies"]["l2s"]["early_nosync_ratio_max"] <= 1 + TARGET)
        agg["l2s_within_target_last100"] = (max(
            r["policies"]["l2s"]["last100_ms"] / r["policies"]["oracle"]["last100_ms"]
            for r in group) <= 1 + TARGET)
        out.append(agg)
    return out


def _settle(partitions: list[int], target: int, start: int, skip: set[int]) -> int | None:
    """Rounds after ``start`` until the policy plays ``target`` in every later round outside
    ``skip`` (None if it never does)."""
    last_bad = None
    for t in range(start, len(partitions) + 1):
        if t in skip:
            continue
        if partitions[t - 1] != target:
            last_bad = t
    if last_bad is None:
        return 0
    return None if last_bad == len(partitions) else last_bad + 1 - start


def _settle_delay(delays, oracle, start: int, window: int = 20) -> int | None:
    """Rounds after ``start`` until every later ``window``-round mean delay is within the 5 %
    target of the Oracle's over the same rounds."""
    last_bad = None
    for end in range(start + window - 1, len(delays) + 1):
        lo = end - window
        if np.mean(delays[lo:end]) > (1 + TARGET) * np.mean(oracle[lo:end]):
            last_bad = end
    if last_bad is None:
        return 0
    return None if last_bad == len(delays) else last_bad + 1 - start


def _drop(graphs) -> dict:
    cfg = DROP
    trace = BandwidthTrace(cfg["mbps"], RTT_MS, drop_at=cfg["drop_at"], drop_to=cfg["drop_to"])
    doc = compare_policies(graphs[cfg["model"]], get_device(cfg["device"]), get_device(SERVER),
                           trace, ROUNDS, privacy_split=PRIVACY, seed=cfg["seed"], noise=NOISE)
    plot_l2s(doc, RESULTS / "l2s_drop.png")
    pol = doc["policies"]
    before, after = pol["oracle"]["partitions"][cfg["drop_at"] - 2], pol["oracle"]["partitions"][-1]
    forced = set(forced_sampling_rounds(ROUNDS))
    out = {**cfg, "oracle_split_before": before, "oracle_split_after": after,
           "pdt_split": doc["partitions"][-1]["split"], "policies": {}}
    for name in ("linucb", "l2s", "l2s_fws"):
        parts = pol[name]["partitions"]
        d = pol[name]["delays_ms"]
        o = pol["oracle"]["delays_ms"]
        out["policies"][name] = {
            "settle_rounds_all": _settle(parts, after, cfg["drop_at"], set()),
            "settle_rounds_unforced": _settle(parts, after, cfg["drop_at"],
                                              forced if name != "linucb" else set()),
            "settle_rounds_delay": _settle_delay(d, o, cfg["drop_at"]),
            "forced_split_last": [parts[t - 1] for t in sorted(forced)
                                  if t > cfg["drop_at"]][-1] if name != "linucb" else None,
            "split_before_drop": parts[cfg["drop_at"] - 2],
            "post_drop_ratio": float(np.mean(d[cfg["drop_at"] - 1:]) /
                                     np.mean(o[cfg["drop_at"] - 1:])),
            "last100_ratio": float(np.mean(d[-100:]) / np.mean(o[-100:]))}
    return out


ALPHAS = (100.0, 1000.0, 10000.0)


def _alpha_sweep(graphs) -> list[dict]:
    """Seed 0, every setting, LinUCB and L2S with larger exploration weights (alpha = 1 is the
    library default, in the grid above)."""
    out = []
    for device_name in DEVICES:
        device, server = get_device(device_name), get_device(SERVER)
        for model, graph in graphs.items():
            for link_name in LINKS:
                mbps = get_link(link_name).bandwidth_mbps
                row = {"device": device_name, "model": model, "mbps": mbps, "alphas": {}}
                for alpha in ALPHAS:
                    doc = compare_policies(graph, device, server, BandwidthTrace(mbps, RTT_MS),
                                           ROUNDS, privacy_split=PRIVACY, seed=0, noise=NOISE,
                                           alpha=alpha)
                    pol = doc["policies"]
                    o = pol["oracle"]["delays_ms"]
                    row["alphas"][str(alpha)] = {
                        name: {"early_ratio": _window(pol[name]["delays_ms"], *EARLY)
                               / _window(o, *EARLY),
                               "last100_ratio": _window(pol[name]["delays_ms"], ROUNDS - 99,
                                                        ROUNDS) / _window(o, ROUNDS - 99, ROUNDS)}
                        for name in ("linucb", "l2s")}
                out.append(row)
    return out


def _feature_fit(graphs) -> float:
    """Largest relative error of a least-squares fit of the expected edge delay on the scaled
    features, over the offloading cuts of every setting: can theta^T x_p represent d_p^e?"""
    worst = 0.0
    for device_name in DEVICES:
        device, server = get_device(device_name), get_device(SERVER)
        for graph in graphs.values():
            costs = training_costs(graph, device, server)
            feats = scaled_features(graph, costs)
            idx = [i for i, c in enumerate(costs[:-1]) if c.split >= PRIVACY]
            x = np.stack([feats[i] for i in idx])
            for link_name in LINKS:
                mbps = get_link(link_name).bandwidth_mbps
                y = np.array([edge_ms(costs[i], mbps, RTT_MS) for i in idx])
                theta = np.linalg.lstsq(x, y, rcond=None)[0]
                worst = max(worst, float(np.max(np.abs(x @ theta - y) / y)))
    return worst


def _traps(rows: list[dict]) -> dict:
    """LinUCB vs LinUCB-E ending at pure on-device while the Oracle does not."""
    eligible = [r for r in rows if r["oracle_split"] != r["pdt_split"]]
    res = {"runs": len(rows), "runs_oracle_offloads": len(eligible)}
    for name in ("linucb", "l2s", "l2s_fws"):
        res[name] = sum(r["policies"][name]["tail_on_device"] for r in eligible)
    res["settings"] = sorted({f"{r['model']} on {r['device']} at {r['mbps']:g} Mbps"
                              for r in eligible})
    return res


def _fmt_ratio(x: float) -> str:
    return f"{x:.3f}"


def main() -> None:
    start = time.perf_counter()
    t0 = time.perf_counter()
    graphs = {m: capture(m, optimize=False, input_shape=(BATCH, 3, 224, 224)) for m in MODELS}
    capture_s = time.perf_counter() - t0
    rows = _run_grid(graphs)
    agg = _aggregate(rows)
    drop = _drop(graphs)
    traps = _traps(rows)
    sweep = _alpha_sweep(graphs)
    fit_err = _feature_fit(graphs)
    overhead = {}
    for name in POLICIES:
        vals = [r["policies"][name]["overhead_us"] for r in rows]
        overhead[name] = {"mean_us": float(np.mean(vals)), "max_us": float(np.max(vals))}
    overhead_by_model = {
        m: {name: float(np.mean([r["policies"][name]["overhead_us"] for r in rows
                                 if r["model"] == m])) for name in ("linucb", "l2s", "l2s_fws")}
        for m in MODELS}
    fixed_us = float(np.mean([r["fixed_us_per_round"] for r in rows]))
    wall = time.perf_counter() - start
    doc = {"version": 1, "machine": machine_info(), "wall_s": wall, "capture_s": capture_s,
           "config": {"batch": BATCH, "privacy_split": PRIVACY, "rounds": ROUNDS,
                      "seeds": list(SEEDS), "noise": NOISE, "rtt_ms": RTT_MS,
                      "server": SERVER, "devices": list(DEVICES), "links": list(LINKS),
                      "early_window": list(EARLY), "target": TARGET},
           "summary": agg, "alpha_sweep": sweep, "feature_fit_max_rel_err": fit_err, "drop": drop, "traps": traps, "overhead_us": overhead,
           "overhead_us_by_model": overhead_by_model, "fixed_us_per_round": fixed_us,
           "runs": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "l2s.json").write_text(json.dumps(doc, indent=1) + "\n")

    names = ("fpt", "pdt", "linucb", "l2s", "l2s_fws")
    lines = ["# L2S: online partition learning vs the Oracle (simulated)", "",
             f"Machine: {doc['machine']}. The script ran {wall:.0f} s (capture {capture_s:.0f} "
             "s); every delay below is a cost-model prediction and does not depend on the "
             "machine, only the decision overhead does.", "",
             f"Setup (L2S Section V-A): server `{SERVER}` (GTX 1080 Ti), Wi-Fi `l2s-wifi-60` / "
             f"`l2s-wifi-100` (+{RTT_MS:g} ms per round), batch {BATCH} (graphs captured at "
             f"(16, 3, 224, 224)), P^c = {PRIVACY} layers on the device, {ROUNDS} rounds, seeds "
             f"{list(SEEDS)}, {NOISE:.0%} multiplicative noise on each observed delay, "
             "weight sync every 100 rounds for L2S and at every change for L2S-FWS. Devices: "
             + "; ".join(f"`{k}`: {v}" for k, v in DEVICES.items()) + ".", "",
             "## 1. Per-round delay as a ratio to the Oracle", "",
             f"Mean over seeds of (policy delay / Oracle delay, same seed) over rounds "
             f"{EARLY[0]}-{EARLY[1]} (`early`) and the last 100 rounds (`last`). `split`: layers "
             "on the device (Oracle; PDT = all layers). `L2S<=5%`: L2S within 5 % of the Oracle "
             "in rounds 50-100 for every seed (worst seed in brackets).", "",
             "| device | model | Mbps | Oracle split (of) | Oracle ms | "
             + " | ".join(f"{n} early | {n} last" for n in names)
             + " | L2S early, no sync | L2S<=5% (worst seed) | no sync |",
             "|---|---|---:|---:|---:|" + "---:|" * (2 * len(names) + 1) + "---|---|"]
    for a in agg:
        p = a["policies"]
        cells = " | ".join(f"{_fmt_ratio(p[n]['early_ratio'])} | {_fmt_ratio(p[n]['last100_ratio'])}"
                           for n in names)
        ok = "yes" if a["l2s_within_target_early"] else "**no**"
        ok_ns = "yes" if a["l2s_within_target_early_nosync"] else "**no**"
        lines.append(f"| {a['device']} | {MODELS[a['model']]} | {a['mbps']:g} | "
                     f"{'/'.join(map(str, a['oracle_split']))} ({a['pdt_split']}) | "
                     f"{a['oracle_early_ms']:.0f} | {cells} | "
                     f"{p['l2s']['early_nosync_ratio']:.3f} | {ok} "
                     f"({p['l2s']['early_ratio_max']:.3f}) | {ok_ns} "
                     f"({p['l2s']['early_nosync_ratio_max']:.3f}) |")
    misses = [a for a in agg if not a["l2s_within_target_early"]]
    lines += ["", f"L2S meets the 5 % target in rounds 50-100 in {len(agg) - len(misses)} of "
              f"{len(agg)} settings (every seed); {sum(a['l2s_within_target_early_nosync'] for a in agg)}"
              f" of {len(agg)} when the weight-sync transfer (which falls in round 100, inside "
              "the window) is taken out; in the last 100 rounds (with sync) in "
              f"{sum(a['l2s_within_target_last100'] for a in agg)} of {len(agg)}.", ""]
    lines += ["Final partitions (per seed) and weight-sync traffic (MB over 500 rounds, mean):",
              "", "| device | model | Mbps | LinUCB final | L2S final | L2S sync MB | "
              "L2S-FWS sync MB |", "|---|---|---:|---|---|---:|---:|"]
    for a in agg:
        p = a["policies"]
        lines.append(f"| {a['device']} | {MODELS[a['model']]} | {a['mbps']:g} | "
                     f"{p['linucb']['final_splits']} | {p['l2s']['final_splits']} | "
                     f"{p['l2s']['sync_mb']:.0f} | {p['l2s_fws']['sync_mb']:.0f} |")
    lines += ["", "Exploration weight: LinUCB / L2S ratio to the Oracle (rounds 50-100 / last 100, "
              "seed 0) for larger alpha than the default 1.0:", "",
              "| device | model | Mbps | alpha=1 (grid, mean) | "
              + " | ".join(f"alpha={a:g}" for a in ALPHAS) + " |",
              "|---|---|---:|---|" + "---|" * len(ALPHAS)]
    for row, a in zip(sweep, [next(x for x in agg if (x["device"], x["model"], x["mbps"]) ==
                                   (r["device"], r["model"], r["mbps"])) for r in sweep]):
        base = a["policies"]
        cells = " | ".join(
            f"{row['alphas'][str(al)]['linucb']['early_ratio']:.2f}/"
            f"{row['alphas'][str(al)]['linucb']['last100_ratio']:.2f}, "
            f"{row['alphas'][str(al)]['l2s']['early_ratio']:.2f}/"
            f"{row['alphas'][str(al)]['l2s']['last100_ratio']:.2f}" for al in ALPHAS)
        lines.append(f"| {row['device']} | {MODELS[row['model']]} | {row['mbps']:g} | "
                     f"{base['linucb']['early_ratio']:.2f}/{base['linucb']['last100_ratio']:.2f}, "
                     f"{base['l2s']['early_ratio']:.2f}/{base['l2s']['last100_ratio']:.2f} | "
                     f"{cells} |")
    lines.append("")
    lines.append("(each cell: LinUCB early/last, L2S early/last)")
    d = drop
    lines += ["", "## 2. Reaction to a bandwidth drop (Fig. 17)", "",
              f"{MODELS[d['model']]} on `{d['device']}`, {d['mbps']:g} -> {d['drop_to']:g} Mbps "
              f"at round {d['drop_at']} of {ROUNDS}, seed {d['seed']}. Oracle split "
              f"{d['oracle_split_before']} before, {d['oracle_split_after']} after (PDT = "
              f"{d['pdt_split']}). `settle`: rounds after the drop until the policy plays the new "
              "Oracle partition in every later round (`unforced`: ignoring LinUCB-E's forced-"
              "sampling rounds, in which on-device is not allowed); `settle (delay)`: until every "
              "later 20-round mean delay is within 5 % of the Oracle's. Plot: `l2s_drop.png`.", "",
              "| policy | split before drop | settle (all rounds) | settle (unforced) | "
              "settle (delay) | delay / Oracle after drop | last 100 / Oracle |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in d["policies"].items():
        s_all = "never" if r["settle_rounds_all"] is None else r["settle_rounds_all"]
        s_unf = "never" if r["settle_rounds_unforced"] is None else r["settle_rounds_unforced"]
        s_del = "never" if r["settle_rounds_delay"] is None else r["settle_rounds_delay"]
        lines.append(f"| {name} | {r['split_before_drop']} | {s_all} | {s_unf} | {s_del} | "
                     f"{r['post_drop_ratio']:.3f} | {r['last100_ratio']:.3f} |")
    lines += ["", "## 3. Decision overhead", "",
              f"Wall time per simulated round minus the fixed policies' (FPT/PDT, "
              f"{fixed_us:.1f} us per round: the simulator's own cost), over all "
              f"{len(rows)} runs, on this machine (Python + numpy, d = 8 features).", "",
              "| policy | mean us/round | max us/round | "
              + " | ".join(f"{MODELS[m]} mean" for m in MODELS) + " |",
              "|---|---:|---:|" + "---:|" * len(MODELS)]
    for name in ("oracle", "linucb", "l2s", "l2s_fws"):
        by_model = " | ".join(
            f"{overhead_by_model[m][name]:.0f}" if name in overhead_by_model[m] else "-"
            for m in MODELS)
        lines.append(f"| {name} | {overhead[name]['mean_us']:.0f} | "
                     f"{overhead[name]['max_us']:.0f} | {by_model} |")
    t = traps
    lines += ["", "## 4. LinUCB trap frequency", "",
              f"Runs that play pure on-device in every one of the last 100 rounds (for LinUCB-E: "
              f"every unforced one) although the Oracle offloads, out of the "
              f"{t['runs_oracle_offloads']} runs (of {t['runs']}) where the Oracle offloads "
              f"({'; '.join(t['settings'])}; 3 seeds each): "
              f"LinUCB {t['linucb']}, L2S (LinUCB-E) {t['l2s']}, L2S-FWS {t['l2s_fws']}.", ""]
    lines += ["## Observations", ""] + _observations(agg, drop, traps, overhead, fit_err)
    (RESULTS / "l2s.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _observations(agg, drop, traps, overhead, fit_err) -> list[str]:
    obs = []
    tx2 = [a for a in agg if a["device"] == "jetson-tx2"]
    if all(a["oracle_split"] == [a["pdt_split"]] for a in tx2):
        obs.append("- **The paper's setup gives a trivial Oracle here.** With TX2 -> GTX 1080 Ti, "
                   "batch 16 and P^c = 4, our cost model makes pure on-device training (PDT) the "
                   "Oracle for all three models at 60 and 100 Mbps: sending a batch-16 float32 "
                   "activation and its gradient over <= 100 Mbps costs more than the TX2 saves "
                   "(AlexNet's cheapest offloading cut, after fc6, costs ~42 ms of transfer "
                   "against ~5 ms of device compute it would save). The paper's Fig. 1 / Fig. 12 "
                   "find an offloading optimum on the real TX2, which is slower than its "
                   "datasheet peak; the paper's L2S-over-PDT gains are therefore not reproduced, "
                   "and the `jetson-nano` grid is added so that the Oracle offloads somewhere "
                   "(VGG16 at split 10, ResNet-34 at 33 / 63).")
    misses = [a for a in agg if not a["l2s_within_target_early"]]
    ok_ns = [a for a in agg if a["l2s_within_target_early_nosync"]]
    sync_share = [a["policies"]["l2s"]["early_ratio"] - a["policies"]["l2s"]["early_nosync_ratio"]
                  for a in agg]
    sync_share = [x for x in sync_share if x > 1e-3]
    obs.append(f"- **5 % target after 50-100 rounds: met in {len(agg) - len(misses)} of "
               f"{len(agg)} settings as measured.** The window 50-100 contains round 100, the "
               "first periodic weight sync: by then the bandit has moved from its round-1 "
               "partition (P^c, the argmin while theta = 0) to on-device training, so round 100 "
               "pulls every layer after P^c back from the server (e.g. 243 MB for AlexNet, "
               "~20 s at 100 Mbps) - one round that alone adds "
               f"{min(sync_share):.2f}-{max(sync_share):.2f} to the window's ratio where it "
               "happens. Taking the sync transfer out, L2S is within 5 % in "
               f"{len(ok_ns)} of {len(agg)} settings "
               + "(" + ", ".join(f"{MODELS[a['model']]}/{a['device']}/{a['mbps']:g}"
                                 for a in ok_ns) + ").")
    obs.append("- **Forced-sampling tax.** Where the Oracle is PDT, LinUCB-E must offload in "
               f"every forced round (every T^0.25 = {ROUNDS ** 0.25:.1f} rounds for T = "
               f"{ROUNDS}), so L2S stays above plain LinUCB for the whole run (AlexNet/TX2: "
               + ", ".join(f"{a['mbps']:g} Mbps {a['policies']['l2s']['last100_ratio']:.3f} "
                           f"vs LinUCB {a['policies']['linucb']['last100_ratio']:.3f}"
                           for a in agg if a["device"] == "jetson-tx2"
                           and a["model"] == "alexnet")
               + " over the last 100 rounds). The paper stops this by leaving the adaptation "
               "mode once decisions are stable (Section IV-D); `compare_policies` runs LinUCB-E "
               "for all rounds and has no such mode, so the tax never ends.")
    stuck = [a for a in agg if a["oracle_split"] != [a["pdt_split"]]]
    obs.append("- **Where the Oracle offloads at a middle cut, neither bandit finds it** ("
               + ", ".join(f"{MODELS[a['model']]} {a['mbps']:g} Mbps: Oracle split "
                           f"{'/'.join(map(str, a['oracle_split']))}, L2S ends at "
                           f"{a['policies']['l2s']['final_splits'][0]}, last-100 ratio "
                           f"{a['policies']['l2s']['last100_ratio']:.2f}" for a in stuck)
               + "). Plain LinUCB tries P^c in round 1 and then either traps on PDT (no "
               "feedback ever again) or stays at P^c. LinUCB-E's forced rounds take the argmin "
               "of the *same* score over the offloading cuts, so they keep sampling the one "
               "cut the model already likes (e.g. the last one before the classifier), and the "
               "model never sees the middle cuts. The features are not the problem: a least-"
               "squares fit of the expected edge delay on the scaled features is exact to "
               f"{fit_err:.1%} over all settings' offloading cuts. The "
               "exploration weight is: alpha = 1 is in milliseconds while the confidence width "
               "sqrt(x^T A^-1 x) of features in [0, 1] is <= ~1, so the bonus is ~1 ms against "
               "gaps of seconds - the learners are effectively greedy. The alpha sweep shows "
               "alpha = 1e4 fixes VGG16/nano at 100 Mbps (1.00 in the last 100 rounds) and "
               "improves ResNet-34/nano at 60 Mbps, but over-explores elsewhere (AlexNet/TX2 "
               "1.95-2.12): alpha would have to scale with the delay (e.g. with the observed "
               "noise), not be a constant.")
    fws = [a["policies"]["l2s_fws"]["last100_ratio"] for a in agg]
    obs.append(f"- L2S-FWS (sync at every change) is {min(fws):.2f}-{max(fws):.2f}x the Oracle "
               "over the last 100 rounds: forced sampling switches partition every ~5 rounds "
               "and each switch moves the layers' weights over the link (ResNet-34/nano/60 Mbps: "
               "~18 GB in 500 rounds); periodic sync (L2S) keeps this down, as the paper argues.")
    obs.append(f"- Trap frequency: LinUCB plays only PDT in the last 100 rounds in "
               f"{traps['linucb']} of {traps['runs_oracle_offloads']} runs where the Oracle "
               f"offloads; LinUCB-E in {traps['l2s']} (in its unforced rounds). Forced sampling "
               "keeps LinUCB-E learning, but with the greedy forced choice above it learns about "
               "the wrong cut, so the trap frequency is the same here.")
    s = drop["policies"]["l2s"]
    obs.append(f"- Drop ({drop['mbps']:g} -> {drop['drop_to']:g} Mbps at round "
               f"{drop['drop_at']}): L2S's unforced choices reach the new Oracle partition (PDT) "
               f"{s['settle_rounds_unforced']} rounds after the drop, but its forced rounds keep "
               "offloading at the pre-drop favourite (split 4, ~20 s per round at 10 Mbps) "
               "because A, b keep the 250 pre-drop samples; its 20-round mean delay gets within "
               "5 % of the Oracle's only "
               + ("never" if s["settle_rounds_delay"] is None else
                  f"{s['settle_rounds_delay']} rounds")
               + " after the drop. The paper's delay monitor re-enters the adaptation mode and "
               "relearns (Section IV-D); our simulated L2S has no reset.")
    obs.append(f"- Decision overhead: LinUCB-E costs about {overhead['l2s']['mean_us']:.0f} us "
               "per round on this machine (one 8x8 solve per arm per round, in a Python loop "
               "over up to 37 arms), growing with the number of cuts; negligible against "
               "per-round training delays of 0.2-10 s.")
    return obs


if __name__ == "__main__":
    main()
