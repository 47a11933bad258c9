"""runtime.md and runtime_mesh.png from runtime.json alone: the tables of what
``bench_runtime.py`` measured and the prose around them, whose figures are computed from the
numbers (never typed in), so that a new run's text says what that run found.

``bench_runtime.py`` measures, writes runtime.json, then calls :func:`write_report`;
``python benchmarks/bench_runtime.py --render-only [--out DIR]`` renders DIR/runtime.json
again without measuring (after a change to the wording, say).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import bench_predicted as predicted  # section 3's table and goal (benchmarks/ is on the path)

GOAL_BYTES = (100_000, 4_000_000)  # the issue's range for "overhead <= 2x a raw round trip"
GOAL_RATIO = 2.0


def write_report(doc: dict[str, Any], out: Path) -> list[str]:
    """runtime.md (and, with section 5, runtime_mesh.png) in ``out`` from ``doc``, the
    contents of runtime.json; the lines of runtime.md."""
    lines = render(doc)
    (out / "runtime.md").write_text("\n".join(lines) + "\n")
    if "mesh" in doc:
        import bench_mesh  # section 5 (not importable with code from before meshes ran)

        bench_mesh.plot(doc["mesh"], out / "runtime_mesh.png")
    return lines


def render(doc: dict[str, Any]) -> list[str]:
    """runtime.md's lines: the header, then each section ``doc`` holds, each with its note."""
    doc = {**doc, "notes": notes(doc)}  # derived here, so stale prose in a file is ignored
    lines = _render_header(doc)
    for key, section in (("overhead", _render_overhead), ("shaping", _render_shaping),
                         ("predicted", _render_predicted), ("load", _render_load),
                         ("mesh", _render_mesh), ("baseline", _render_baseline)):
        if key in doc:
            lines += section(doc)
    return lines


def _render_header(doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    tm = doc["this_machine"]["compute"]
    before, after = doc["load_average"][0], doc["load_average_end"][0]
    return [
        "# Runtime: serving overhead, link shaping, predicted vs measured latency, load", "",
        f"torch {m['torch']}, Python {m['python']}, {m['threads']} threads, {m['processor']}; "
        f"this-machine measured live: {tm['peak_gops']['32']} GFLOP/s FP32, "
        f"{tm['memory_bandwidth_gb_per_s']} GB/s. One run of `benchmarks/bench_runtime.py` "
        f"({doc['wall_s']:.0f} s, sections: {', '.join(doc['sections'])}"
        + (f"; {', '.join(doc['kept_sections'])} kept from an earlier run"
           if doc.get("kept_sections") else "") + ") on a 2-core machine "
        f"with nothing else running: load average {before:.2f} before, {after:.2f} after (the "
        "benchmark's own threads and server processes raise it). Quote the ratios, not the "
        "absolute times.", "",
        "**Setup.** Sections 1, 3 and 4 run every server as a process of its own (`edgesplit "
        "serve`, and a process for section 1's references), as a deployment would, and in "
        "sections 1 and 3 each side computes on one torch thread: the edge and cloud devices "
        "get one of the two cores each (two OpenMP teams of two threads on two shared cores "
        "make each other wait). Section 2 runs its server *in this process*: a partition "
        "server (`runtime/server.py:partition_server`) serves the plan's cloud part on "
        "127.0.0.1 and a `ChainClient` runs "
        "the edge part. A request's edge and cloud compute run one after the other, never at "
        "once.", ""]


def _render_overhead(doc: dict[str, Any]) -> list[str]:
    block = doc["overhead"][0]["block"]  # requests back to back, the same for every row
    lines = ["## 1. Overhead of serving a split (loopback, no shaping)", "",
             f"Per split, {block} requests of each variant back to back (as a client "
             "streams them: a server sleeps only through the edge compute between them), one "
             "such block per variant and round, the order rotating round by round so that "
             "every variant follows every other: the chain served by an `edgesplit serve` "
             "process over the data plane (`tcp`, TCP frames) and over gRPC (`grpc`), "
             "`PlanProgram.run_local()` (the same partitions in one process, every hop through "
             "the same wire encoding), "
             "and three references served by one more process: a raw TCP round trip carrying "
             "the same bytes as the request's and the reply's wire messages, measured warm "
             "(`raw warm`: nothing computes before or between), the same raw round trip in the "
             "served request's place (`raw in place`: after the edge compute, to a peer that "
             "wakes for it and computes the cloud part before answering, messages made "
             "beforehand, no codec), and `floor`, a minimal Python split server over one raw "
             "connection (bare length header; decode against the plan's shapes, compute, "
             "encode; no meta, token, plan or deadline checks, no connection pool or worker "
             "slots): the least any Python server pays. The client splits a served request "
             "into compute (edge + remote), serialisation (every encode and decode) and "
             "`transfer` (everything else: framing, the transport, thread wake-ups). "
             "`overhead` = transfer + (served - local serialisation, i.e. the reply's "
             "encode/decode, which run_local does not do): what serving adds besides compute; "
             "medians over the requests. The goal: overhead at most "
             f"{GOAL_RATIO:g}x a raw TCP round trip for requests of 100 KB-4 MB, checked "
             "against the round trip in place (the warm one is shown beside it: no split "
             "request can have it, since its peer sleeps while the other side computes and "
             "its code and data are cold after compute).", "",
             "| model | split after | bytes up / down | plane | transfer ms | serialize served / "
             "local ms | overhead ms | raw in place / warm ms | overhead / raw in place | "
             "overhead / raw warm | goal |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in doc["overhead"]:
        in_range = GOAL_BYTES[0] <= r["request_bytes"] <= GOAL_BYTES[1]
        goal = ("-" if not in_range or r["plane"] == "floor" else
                "met" if r["overhead_over_in_place"] <= GOAL_RATIO else "missed")
        lines.append(
            f"| {r['model']} | `{r['split_after']}` | {r['request_bytes']:,} / "
            f"{r['reply_bytes']:,} | {r['plane']} | {r['runtime_transfer_ms']:.3f} | "
            f"{r['runtime_serialize_ms']:.3f} / {r['local_serialize_ms']:.3f} | "
            f"{r['overhead_ms']:.3f} | {r['raw_rtt_in_place_ms']:.3f} / "
            f"{r['raw_socket_rtt_ms']:.3f} | {r['overhead_over_in_place']:.2f}x | "
            f"{r['overhead_over_socket']:.2f}x | {goal} |")
    return [*lines, "", doc["notes"]["overhead"], ""]


def _render_shaping(doc: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    lines += ["## 2. Shaping accuracy", "",
              f"Links of 3, 25 and 100 Mbps with {doc['shaping'][0]['rtt_ms']:g} ms RTT "
              "(custom `Link`s); "
              "`measured` is the median of the client's `transfer` (total - edge - serialize - "
              "remote) over the requests after one warm-up; the physical limit is "
              "(request + reply bytes, exactly the protobuf sizes the shaper is charged) x 8 / "
              "bandwidth + RTT. `unshaped` is the same program's transfer with shaping off "
              "(the transport alone); `shaper error` = measured - limit - unshaped. `plan` is the "
              "plan's own transfer + RTT prediction (tensor payload bytes only, no headers).",
              "",
              "| model | split after | Mbps | bytes up / down | limit ms | measured ms | "
              "measured / limit | excess ms | unshaped ms | shaper error ms | plan ms | "
              "plan / limit |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["shaping"]:
        lines.append(
            f"| {r['model']} | `{r['split_after']}` | {r['bandwidth_mbps']:g} | "
            f"{r['request_bytes']:,} / {r['reply_bytes']:,} | {r['physical_limit_ms']:.2f} | "
            f"{r['measured_transfer_ms']:.2f} | {r['measured_over_physical']:.3f} | "
            f"{r['excess_ms']:.2f} | {r['unshaped_transfer_ms']:.2f} | "
            f"{r['excess_minus_unshaped_ms']:+.2f} | {r['plan_predicted_ms']:.2f} | "
            f"{r['plan_over_physical']:.3f} |")
    lines += ["", doc["notes"]["shaping"], ""]

    return lines


def _render_predicted(doc: dict[str, Any]) -> list[str]:
    return [*predicted.render(doc["predicted"]), "", doc["notes"]["predicted"], ""]


def _render_load(doc: dict[str, Any]) -> list[str]:
    ld = doc["load"]
    first = ld["setups"][0]
    single = first["single client"]["requests_per_client"]
    pairs = len(first.get("ratios", [0]))
    many = first["concurrent"]
    clients, processes = many["clients"], many["processes"]
    lines = [f"## 4. Load: {clients} concurrent clients x {many['requests_per_client']} "
             "requests", "",
             f"One `edgesplit serve --threads 1` process for {ld['model']} split after "
             f"`{ld['split_after']}`, no shaping, with and without dynamic batching (the "
             "default batches up to 32 waiting requests; `--max-batch 1` turns it off). The "
             f"{clients} clients are {processes} client processes (devices) of "
             f"{clients // processes} `ChainClient`s each, one torch thread per "
             "process, started together once every client has connected and warmed up; the "
             "single client is one such process with one client "
             f"({single} requests), the reference for the ratios. One client, "
             f"then {clients}, {pairs} times over against the same server: the table "
             "shows the pair with the median ratio, `x one client` every pair's ratio in "
             "brackets (a lone client's rate moves by several percent from run to run). Each "
             "request "
             "goes over the data plane or gRPC with one of 16 distinct inputs and its output is "
             "checked against the unsplit model on that input; a reply for another request id "
             "would be an error (outputs are checked once the clock has stopped). Throughput: "
             "requests answered from the first start to the last end. CPU per request: the "
             "client processes' and the server process's CPU time (all threads, user and "
             "system; the server's from the clients' start, their connection and one warm-up "
             "request each included) over the requests; cores busy: all of it over the wall "
             "time (2 at most here).", "",
             "| plane | batching | clients x requests | ok | errors | mean ms | p50 ms | p95 ms "
             "| p99 ms | req/s | x one client | client CPU ms/req | server CPU ms/req "
             "| cores busy | max abs diff |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for setup in ld["setups"]:
        for label in ("single client", "concurrent"):
            r = setup[label]
            lat = r["latency_ms"]
            ratio = "" if label != "concurrent" else f"x{setup['throughput_ratio']:.2f}" + (
                " (" + ", ".join(f"x{x:.2f}" for x in setup["ratios"]) + ")"
                if len(setup.get("ratios", ())) > 1 else "")
            lines.append(
                f"| {setup['plane']} | {'on' if setup['batching'] else 'off'} | "
                f"{r['clients']} x {r['requests_per_client']} | {r['ok']} | {r['errors']} | "
                f"{lat['mean']:.2f} | {lat['p50']:.2f} | {lat['p95']:.2f} | {lat['p99']:.2f} | "
                f"{r['throughput_rps']:.0f} | {ratio} | {_cpu(r, 'client_cpu_ms')} | "
                f"{_cpu(r, 'server_cpu_ms')} | {_cpu(r, 'cores_busy', '.2f')} | "
                f"{r['max_abs_diff']:.2g} |")
    return [*lines, "", doc["notes"]["load"], ""]


def _render_mesh(doc: dict[str, Any]) -> list[str]:
    import bench_mesh

    return [*bench_mesh.render(doc["mesh"]), ""]


def _render_baseline(doc: dict[str, Any]) -> list[str]:
    b = doc["baseline"]
    first = b["setups"][0]["runs"]["new"][0]
    one, many = first["single client"], first["concurrent"]
    if b.get("method") != "interleaved":  # runtime.json written before the interleaved A/B
        how = ("and the same client script (`benchmarks/load_client.py`, which imports the "
               "version under test) drives each")
    else:
        how = ("each driven by its own version's client processes (`benchmarks/"
               "load_client.py`, importing the version under test), started once and kept")
    lines = [f"## 6. Old and new code in one run: commit `{b['commit'][:7]}` against this "
             "checkout, interleaved", "",
             f"Commit `{b['commit'][:10]}` (`{b['ref']}`, "
             f"{b.get('about') or 'before the serving-shell refactor of issue 39'}) is unpacked "
             "into a temporary folder (`git archive`); per setup one "
             "`edgesplit serve --threads 1` process runs the old code and one the new, at the "
             f"same time (each idle while the other is measured), {how}: one client alone "
             f"({one['requests_per_client']} requests), then {many['clients']} clients in "
             f"{many['processes']} processes ({many['requests_per_client']} requests each), "
             f"{b['rounds']} rounds, old first in even rounds and new first in odd ones, so "
             "that drift over the run hits both alike. Per metric: each version's median over "
             "the rounds with its spread (min..max), and the median of the rounds' new/old "
             "with its spread: `within 5 %` where that median is (else better or worse). p50 "
             "is the per-request latency, what serving a request costs end to end. Load "
             f"average {b['load_before']:.2f} before, {b['load_after']:.2f} after.", "",
             "| plane | batching | run | metric | old median (min..max) | new median (min..max) "
             "| new / old (min..max) | verdict |", "|---|---|---|---|---:|---:|---:|---|"]
    for setup in b["setups"]:
        for m in setup["metrics"]:
            fmt = ".0f" if m["unit"] == "req/s" else ".3f"
            lines.append(
                f"| {setup['plane']} | {'on' if setup['batching'] else 'off'} | {m['run']} | "
                f"{m['metric'].replace('_rps', ' req/s').replace('_ms', ' ms')} | "
                f"{_spread(m, 'old', fmt)} | {_spread(m, 'new', fmt)} | {_ratio(m)} | "
                f"{m['verdict']} |")
    return [*lines, *_render_baseline_overhead(b), "", doc["notes"]["baseline"],
            *_render_pooled(doc), ""]


def _labelled(b: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Section 6's metrics, each with a label that names it across runs."""
    rows = b.get("overhead", {}).get("rows", [])
    labelled = [(f"{s['plane']}/{'on' if s['batching'] else 'off'} {m['run']} {m['metric']}", m)
                for s in b["setups"] for m in s["metrics"]]
    return labelled + [(f"section 1 {r['model']} {r['request_bytes']:,} B {r['plane']} "
                        f"{r['metric']}", r) for r in rows]


def baseline_runs(earlier: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Every interleaved section 6 run against the same commit, this one last: each run's
    date, load and per-metric rounds of new/old (kept so that a verdict can pool the runs;
    a run against another commit starts the list again)."""
    runs = [r for r in earlier.get("baseline_runs", []) if r["commit"] == baseline["commit"]]
    old = earlier.get("baseline")
    if not runs and old and old["commit"] == baseline["commit"] and \
            old.get("method") == "interleaved":
        runs = [baseline_record(old)]
    return [*runs, baseline_record(baseline)]


def baseline_record(b: dict[str, Any]) -> dict[str, Any]:
    """What a section 6 run leaves for pooling: per metric, its rounds' new/old."""
    return {"commit": b["commit"], "date": b.get("date"), "load_before": b["load_before"],
            "load_after": b["load_after"], "rounds": b["rounds"],
            "ratios": {label: m["ratios"] for label, m in _labelled(b)}}


POOL_GOAL = 0.05  # issue 57: each metric's new/old within 5 %


def _render_pooled(doc: dict[str, Any]) -> list[str]:
    """Section 6 over every run on file: per metric each run's median new/old, and the
    median of all their rounds together (the verdict)."""
    runs = doc.get("baseline_runs", [])
    if len(runs) < 2:
        return []
    labels = list(runs[-1]["ratios"])
    lines = ["", f"Every run of section 6 against this commit ({len(runs)}), and the verdict on "
             "all their rounds together: per metric, each run's median of the rounds' new/old "
             "and the median of every round of every run. A throughput is worse below "
             f"x{1 - POOL_GOAL:.2f}, a time above x{1 + POOL_GOAL:.2f}.", "",
             "| metric | " + " | ".join(f"run {i + 1} ({r.get('date') or '-'}, load "
                                         f"{r['load_before']:.2f})" for i, r in enumerate(runs))
             + " | all rounds | verdict |",
             "|---|" + "---:|" * len(runs) + "---:|---|"]
    verdicts: dict[str, int] = {}
    for label in labels:
        per_run = [r["ratios"].get(label) for r in runs]
        pooled = statistics.median(x for rs in per_run if rs for x in rs)
        verdict = _pooled_verdict(label, pooled)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        lines.append(f"| {label} | " + " | ".join(
            f"x{statistics.median(rs):.3f}" if rs else "-" for rs in per_run)
            + f" | x{pooled:.3f} | {verdict} |")
    return [*lines, "", "All rounds together: " + ", ".join(
        f"{n} {v}" for v, n in sorted(verdicts.items())) + f" (of {len(labels)} metrics)."]


def _pooled_verdict(label: str, ratio: float) -> str:
    worse = ratio < 1 - POOL_GOAL if "throughput" in label else ratio > 1 + POOL_GOAL
    better = ratio > 1 + POOL_GOAL if "throughput" in label else ratio < 1 - POOL_GOAL
    return "worse" if worse else "better" if better else "within 5 %"


def _spread(m: dict[str, Any], code: str, fmt: str) -> str:
    values = m[code]
    return (f"{m[f'{code}_median']:{fmt}} ({min(values):{fmt}}..{max(values):{fmt}})")


def _ratio(m: dict[str, Any]) -> str:
    """new/old: the median of the rounds' ratios and their spread (or, in results from before
    the interleaved A/B, the ratio of the medians)."""
    if "ratio_min" not in m:
        return f"x{m['ratio']:.3f}"
    return f"x{m['ratio']:.3f} (x{m['ratio_min']:.3f}..x{m['ratio_max']:.3f})"


def _render_baseline_overhead(b: dict[str, Any]) -> list[str]:
    """Section 1 by each version, where it ran (``--baseline-overhead-rounds``)."""
    ov = b.get("overhead")
    if not ov:
        return ["", "Section 1 was not compared in this run (`--baseline-overhead-rounds 0`)."]
    if ov.get("method") == "interleaved":
        how = (f"Section 1, old and new interleaved: per split an old and a new `edgesplit "
               "serve` process at once, each driven by its own version's client process "
               "(`benchmarks/ab_client.py`), and the raw round trip of the same bytes in the "
               f"served request's place run by this script; {ov['rounds']} rounds, each a block "
               f"of {ov['block']} requests per plane (and {ov['block']} `run_local()` passes) "
               "per version and one of the raw round trip, in an order that rotates round by "
               "round. ")
    else:
        how = (f"Section 1 run whole by each version ({ov['rounds']} runs each, alternating "
               f"as above, {ov['requests']} requests per variant in each; this script, its "
               "edgesplit imported from the version's `src`): ")
    lines = ["", how + "`overhead` is section 1's (transfer + the reply's encode/decode: what "
             "serving adds besides compute), `served` the whole request; medians per round, "
             "then over the rounds. Load average "
             f"{ov['load_before']:.2f} before, {ov['load_after']:.2f} after.", "",
             "| model | split after | bytes up | plane | metric | old median (min..max) | "
             "new median (min..max) | new / old (min..max) | verdict |",
             "|---|---|---:|---|---|---:|---:|---:|---|"]
    for r in ov["rows"]:
        lines.append(f"| {r['model']} | `{r['split_after']}` | {r['request_bytes']:,} | "
                     f"{r['plane']} | {r['unit']} | {_spread(r, 'old', '.3f')} | "
                     f"{_spread(r, 'new', '.3f')} | {_ratio(r)} | {r['verdict']} |")
    return [*lines, *_render_transport(ov.get("transport"), ov["rounds"])]


TRANSPORT_GOAL = 1.5  # issue 57: a served split's transfer at most 1.5x the raw round trip


def _render_transport(rows: list[dict[str, Any]] | None, runs: int) -> list[str]:
    """Each version's data plane against the raw round trip of the same bytes, per round (per
    run, in results from before the interleaved A/B: this checkout's only)."""
    if not rows:
        return []
    if "old_transfer_over_in_place" in rows[0]:
        return _render_transport_ab(rows, runs)
    lines = ["", f"This checkout's data plane in those {runs} runs against the raw TCP round "
             "trip of the same bytes in the served request's place, measured in the same run "
             "(section 1's `raw in place`): `transfer` is what the client reports as transfer "
             "(framing, sockets, thread wake-ups), `overhead` adds the reply's encode/decode. "
             f"Goal (issue 57): transfer at most {TRANSPORT_GOAL}x for the 401 KB split, "
             "median of the runs.", "",
             "| model | split after | bytes up | transfer / raw, per run | median | "
             "overhead / raw, per run | median |", "|---|---|---:|---|---:|---|---:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | `{r['split_after']}` | {r['request_bytes']:,} | "
            + ", ".join(f"{x:.2f}" for x in r["transfer_over_in_place"])
            + f" | **{r['transfer_over_in_place_median']:.2f}x** | "
            + ", ".join(f"{x:.2f}" for x in r["overhead_over_in_place"])
            + f" | {r['overhead_over_in_place_median']:.2f}x |")
    return lines


def _render_transport_ab(rows: list[dict[str, Any]], rounds: int) -> list[str]:
    lines = ["", f"Each version's data plane in those {rounds} rounds against the raw TCP "
             "round trip of the same bytes in the served request's place, measured in the "
             "same round: `transfer` is what the client reports as transfer (framing, sockets, "
             f"thread wake-ups). Goal (issue 57): this checkout's at most {TRANSPORT_GOAL}x "
             "for the 401 KB split.", "",
             "| model | split after | bytes up | raw in place ms, median | old transfer / raw, "
             "median (min..max) | new transfer / raw, median (min..max) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        old, new = r["old_transfer_over_in_place"], r["transfer_over_in_place"]
        lines.append(
            f"| {r['model']} | `{r['split_after']}` | {r['request_bytes']:,} | "
            f"{statistics.median(r['raw_rtt_in_place_ms']):.3f} | "
            f"{r['old_transfer_over_in_place_median']:.2f}x ({min(old):.2f}..{max(old):.2f}) | "
            f"**{r['transfer_over_in_place_median']:.2f}x** ({min(new):.2f}..{max(new):.2f}) |")
    return lines


def _cpu(run: dict[str, Any], key: str, fmt: str = ".3f") -> str:
    """A CPU column ("-" in results measured before it was recorded)."""
    value = run.get(key)
    return "-" if value is None or value != value else format(value, fmt)


def notes(doc: dict[str, Any]) -> dict[str, str]:
    """Observations computed from this run's numbers (kept honest by deriving them)."""
    notes: dict[str, str] = {}
    for key, note in (("overhead", _note_overhead), ("shaping", _note_shaping),
                      ("predicted", _note_predicted), ("load", _note_load),
                      ("baseline", _note_baseline)):
        if key in doc:
            notes[key] = note(doc)
    return notes


def _note_overhead(doc: dict[str, Any]) -> str:
    rows = doc["overhead"]
    goal = [r for r in rows if GOAL_BYTES[0] <= r["request_bytes"] <= GOAL_BYTES[1]]
    text = []
    for plane, name in (("tcp", "The data plane"), ("grpc", "gRPC"), ("floor", "The floor")):
        mine = [r for r in goal if r["plane"] == plane]
        if not mine:
            continue
        place = [r["overhead_over_in_place"] for r in mine]
        warm = [r["overhead_over_socket"] for r in mine]
        over = [r["overhead_ms"] for r in mine]
        met = sum(x <= GOAL_RATIO for x in place)
        text.append(f"{name} adds {min(over):.3f}-{max(over):.3f} ms per request of "
                    f"100 KB-4 MB besides compute: {min(place):.2f}-{max(place):.2f}x the raw "
                    f"round trip in place ({met} of {len(mine)} splits within {GOAL_RATIO:g}x), "
                    f"{min(warm):.2f}-{max(warm):.2f}x the warm one.")
    floor = {(r["model"], r["split_after"]): r for r in goal if r["plane"] == "floor"}
    above = [r["overhead_ms"] - floor[(r["model"], r["split_after"])]["overhead_ms"]
             for r in goal if r["plane"] == "tcp" and (r["model"], r["split_after"]) in floor]
    if above:
        text.append(f"The data plane's checks, framing, pooling and worker slots add "
                    f"{min(above):+.3f} to {max(above):+.3f} ms to the floor's: serving code run "
                    "cold right after compute, where every Python call costs microseconds "
                    "(a plain call's short way, runtime/fastpath.py, keeps it to a few dozen "
                    "calls a side).")
    codec = [r["runtime_serialize_ms"] - r["local_serialize_ms"] for r in goal
             if r["plane"] == "tcp"]
    if codec:
        text.append(f"Served serialisation differs from run_local's by {min(codec):+.2f} to "
                    f"{max(codec):+.2f} ms: a served request also encodes and decodes its "
                    "reply, and decodes the request on a server that slept through the edge "
                    "compute (cold caches: torch's tensor calls cost tens of microseconds "
                    "each there); but it sends a large tensor from the tensor's own memory "
                    "(header and checksum in front, no copy) and the server reads a plain "
                    "request where it lies in its receive buffer, which run_local's round "
                    "trip through bytes does not.")
    pairs = {(r["model"], r["split_after"]): {} for r in rows}
    for r in rows:
        pairs[(r["model"], r["split_after"])][r["plane"]] = r["overhead_ms"]
    gains = [p["grpc"] / p["tcp"] for p in pairs.values() if "tcp" in p and "grpc" in p]
    if gains:
        text.append(f"Per split, gRPC's overhead is x{min(gains):.1f}-x{max(gains):.1f} the "
                    "data plane's: protobuf copies every tensor into and out of its messages, "
                    "and gRPC's Python server hands each call to a worker thread through its "
                    "completion queue; the data plane reads into one reused buffer per "
                    "connection and decodes from it.")
    small = [r for r in rows if r["request_bytes"] < GOAL_BYTES[0] and r["plane"] == "tcp"]
    if small:
        r = small[0]
        text.append(f"Below 100 KB the fixed per-request work dominates: {r['model']} "
                    f"({r['request_bytes']:,} B) pays {r['overhead_ms']:.3f} ms against a "
                    f"{r['raw_rtt_in_place_ms']:.3f} ms round trip in place (x"
                    f"{r['overhead_over_in_place']:.1f}).")
    return " ".join(text)


def _note_shaping(doc: dict[str, Any]) -> str:
    sh = doc["shaping"]
    ratios = [r["measured_over_physical"] for r in sh]
    errs = [r["excess_minus_unshaped_ms"] for r in sh]
    return (
        f"Measured transfer is x{min(ratios):.3f}-x{max(ratios):.3f} the physical limit"
        + (": never below it" if min(ratios) >= 1 else "") +
        " (the shaper sleeps at least bytes/bandwidth + RTT/2 per direction), above it by the "
        "transport's own cost plus sleep overshoot, so the ratio is closest to 1 for slow links "
        "and large messages. After removing the unshaped "
        f"transport cost, the shaper itself is off by {min(errs):+.2f} to {max(errs):+.2f} ms. "
        "The plan's prediction counts tensor payload bytes only, so it is slightly below the "
        "limit (wire headers and protobuf framing are a few dozen bytes per tensor, "
        "negligible next to activations).")


def _note_predicted(doc: dict[str, Any]) -> str:
    s = doc["predicted"]["summary"]
    goal = predicted.GOAL_MAPE
    parts = [f"On the forced splits of {len(s['models'])} models the fresh profile is off by "
             f"{s['forced_profile_mape']:.1f} % MAPE (median {s['forced_profile_median_ape']:.1f}"
             f" %) and the calibrated roofline by {s['forced_calibrated_mape']:.1f} % (median "
             f"{s['forced_calibrated_median_ape']:.1f} %); the goal is {goal:g} %: "
             + ", ".join(f"{name} {'met' if s[f'forced_{k}_mape'] <= goal else 'missed'}"
                         for k, name in (("profile", "profile"), ("calibrated", "calibrated")))
             + f". The hand-set preset gives {s['forced_preset_mape']:.1f} %."]
    forced = [r for r in doc["predicted"]["rows"] if r["plan"] == "forced split"]
    ratios = [(r["measured"]["breakdown_ms"]["edge"] + r["measured"]["breakdown_ms"]["remote"])
              / (r["predicted_parts_ms"]["profile"]["edge"]
                 + r["predicted_parts_ms"]["profile"]["cloud"]) for r in forced]
    if ratios:
        parts.append(f"The link is priced within a few percent; a request's edge and cloud "
                     f"compute measured x{min(ratios):.2f}-x{max(ratios):.2f} (median "
                     f"x{statistics.median(ratios):.2f}) the profile's. Two things make that "
                     "hold: the profile times each pass after idle, as a shaped request's "
                     "partition computes after tens of milliseconds on the link (back to back, "
                     "the machine is warmer: here a pass after 100 ms idle took up to x2.7 "
                     "its back-to-back time with two threads); and each device computes on "
                     "one core. With two torch threads per process, the two sides' OpenMP "
                     "teams share two cores and make each other wait (digits_cnn's parts ran "
                     "up to x20 their one-thread time), and a second team in one process "
                     "makes libgomp throttle both (hardware/threads.py).")
    return " ".join(parts)


def _note_load(doc: dict[str, Any]) -> str:
    ld = doc["load"]
    best = max(ld["setups"], key=lambda s: s["concurrent"]["throughput_rps"])
    runs = ("single client", "concurrent")  # older results kept only the reported pair
    bad = sum(s.get("errors_all_runs", sum(s[k]["errors"] for k in runs)) for s in ld["setups"])
    diff = max(s.get("max_abs_diff_all_runs", max(s[k]["max_abs_diff"] for k in runs))
               for s in ld["setups"])
    ratios = {(s["plane"], s["batching"]): s["throughput_ratio"] for s in ld["setups"]}
    text = [f"Every request of every run answered with {bad} errors (a reply carrying another "
            f"request's id counts as one), outputs equal to the unsplit model within "
            f"{diff:.2g}. "
            f"{best['concurrent']['clients']} clients get x{best['throughput_ratio']:.2f} the "
            "requests/s of one "
            f"with the {best['plane']} plane and batching "
            f"{'on' if best['batching'] else 'off'} "
            f"({best['concurrent']['throughput_rps']:.0f} req/s)."]
    if ("tcp", True) in ratios and ("tcp", False) in ratios:
        text.append(f"Without batching the same plane gives x{ratios[('tcp', False)]:.2f}: "
                    "each request then runs the cloud part alone, and on two cores the "
                    "clients' edge parts and the server's requests compete for the same CPU; "
                    "a batch costs far less than its requests run one by one.")
    text.append(_note_load_cpu(ld))
    return " ".join(t for t in text if t)


def _note_baseline(doc: dict[str, Any]) -> str:
    b = doc["baseline"]
    labelled = _labelled(b)
    ratios = [m["ratio"] for _, m in labelled if m["metric"] == "throughput_rps"]
    outside = [(label, m) for label, m in labelled if abs(m["ratio"] - 1) > 0.05]
    errors = sum(s["errors_all_runs"] for s in b["setups"])
    diff = max(s["max_abs_diff_all_runs"] for s in b["setups"])
    if b.get("method") != "interleaved":  # results from before the interleaved A/B
        how = ("Section 1 ran in whole runs per version, not request by request, so drift "
               "within a run was not shared by the other version. ")
    else:
        how = ("Both versions' servers and clients ran at once and took turns block by block, "
               "so each round's new/old compares the two under the same conditions. ")
    return (f"Of {len(labelled)} metrics, {len(labelled) - len(outside)} have new/old within "
            "5 %" + (" (outside: " + ", ".join(f"{label} x{m['ratio']:.3f}"
                                                for label, m in outside) + ")"
                     if outside else "") +
            f"; new/old throughput x{min(ratios):.3f}-x{max(ratios):.3f}. Every run of both "
            f"versions answered with {errors} errors in all, outputs equal to the unsplit model "
            f"within {diff:.2g}. " + how + "Section 1's reference rows (floor, raw round trips) "
            "are not versions of the runtime and are left out. Not compared: sections 2 and 3 "
            "(the same transport as section 1, shaped or predicted), and section 5's mesh: "
            "before the refactor a mesh plan ran as its best chain (section 5's second row).")


def _note_load_cpu(ld: dict[str, Any]) -> str:
    """Why the ratio is what it is, from the CPU the runs used: throughput is cores busy over
    CPU per request, so the ratio is (cores busy, 32 over 1) x (CPU per request, 1 over 32)."""
    setup = next((s for s in ld["setups"] if s["plane"] == "tcp" and s["batching"]), None)
    if setup is None or "cores_busy" not in setup["concurrent"]:
        return ""
    one, many = setup["single client"], setup["concurrent"]
    cpu1 = one["client_cpu_ms"] + one["server_cpu_ms"]
    cpu32 = many["client_cpu_ms"] + many["server_cpu_ms"]
    return (f"Where the tcp/batching ratio comes from: throughput is cores busy over CPU per "
            f"request. A lone client keeps {one['cores_busy']:.2f} cores busy at "
            f"{cpu1:.3f} ms of CPU a request (client {one['client_cpu_ms']:.3f}, server "
            f"{one['server_cpu_ms']:.3f}): its request's parts run one after the other, so a "
            f"round trip is about one core's worth of work, not idle time. {many['clients']} "
            f"clients keep {many['cores_busy']:.2f} cores busy at {cpu32:.3f} ms a request "
            f"(client {many['client_cpu_ms']:.3f}, server {many['server_cpu_ms']:.3f}): "
            f"x{many['cores_busy'] / one['cores_busy']:.2f} the cores, each request "
            f"x{cpu1 / cpu32:.2f} as cheap. Batching makes the server's share cheaper, while "
            "the clients' share (their edge compute, encode and socket calls) grows: with "
            f"{many['clients'] // many['processes']} clients to a process, each torch "
            "operator of "
            "the edge compute gives the interpreter lock up and takes it back, a hand-off "
            "between threads (digits_cnn's edge part alone, no sockets: 0.34 ms of CPU a "
            "pass on one thread, 0.67 ms with eight threads computing in one process, in a "
            "trial). On 2 cores shared by the devices and the server, 2x one client's rate "
            "needs the whole request to cost less under load than alone, which only the "
            "server's part can.")
