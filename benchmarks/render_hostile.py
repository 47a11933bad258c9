"""hostile.md from hostile.json alone: the tables of what ``bench_hostile.py`` measured, the
words around them, and issue 55's numbers from before the fixes (:data:`BEFORE`) beside this
run's.

``bench_hostile.py`` measures, writes hostile.json, then calls :func:`write_report`;
``python benchmarks/bench_hostile.py --render-only [--out DIR]`` renders DIR/hostile.json
again without measuring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# What issue 55 measured before the HTTP guard, quoted as it reported it, by row.
BEFORE = {
    "big_message": "27.9 s and +2.5 GB RSS, 2.1 GB still held after",
    "wrong_key_bodies": "+758 MB RSS before the 401",
    "empty_content_length": "held the connection",
    "idle_slow": "all still open after 30 s",
    "fd_exhaustion": "every legitimate request failed",
    "leavers_10": "stayer delayed 11.7 s",
    "leavers_20": "stayer got 503",
    "guessing": "2,194 guesses/s, none throttled",
    "star_flood": "5 of 93 legitimate star requests served",
    "token_throttle": "44 of 49 right-token clients refused",
    "one_call_join": "parked until its join timed out",
}

def write_report(doc: dict[str, Any], out: Path) -> str:
    """hostile.md in ``out`` from ``doc``, the contents of hostile.json; its text."""
    text = render(doc)
    (out / "hostile.md").write_text(text)
    return text


def render(doc: dict[str, Any]) -> str:
    lines = ["# A served plan under hostile and heavy use", "",
             f"Sections run: {', '.join(doc['sections'])}. Every server is a subprocess on "
             "loopback, its memory read from /proc. Load average (1 min) before "
             f"{doc['load_before']:.2f}, after {doc['load_after']:.2f} (the benchmark's own "
             "clients and servers share this machine's cores)."
             + (" Smoke-run sizes (--small): not the issue's." if doc["sizes"].get("small")
                else "")]
    if "bombs" in doc:
        lines += _render_wire(doc)
    if "http" in doc:
        lines += _render_http(doc["http"])
    if "serving" in doc:
        lines += _render_serving(doc["serving"])
    return "\n".join(lines) + "\n"


def _render_wire(doc: dict[str, Any]) -> list[str]:
    lines = ["", f"digits_cnn, cut after `down1.0` (tensor `{doc['tensor']}`, shape "
             f"{doc['shape']}), served by `edgesplit serve`.", "",
             "## Decompression bombs (zstd frames that claim and hold far more than declared)",
             "", f"Server before: {doc['bombs']['before']['rss_mib']:.0f} MiB RSS, peak "
             f"{doc['bombs']['before']['peak_mib']:.0f} MiB.", "",
             "| decompresses to | message | path | status | slowest ms | RSS after MiB | "
             "peak MiB |", "|---:|---:|---|---|---:|---:|---:|"]
    for r in doc["bombs"]["rows"]:
        lines.append(f"| {r['claimed_mib']:.0f} MiB | {r['message_kib']:.0f} KiB | "
                     f"{_PLANE[r['plane']]} | {', '.join(r['codes'])} | {r['max_ms']:.1f} | "
                     f"{r['rss_mib']:.0f} | {r['peak_mib']:.0f} |")
    lines += ["", "## Malformed messages with a valid CRC", "",
              "| case | path | status | ms |", "|---|---|---|---:|"]
    lines += [f"| {r['case']} | {_PLANE[r['plane']]} | {r['code']} | {r['ms']:.1f} |"
              for r in doc["malformed"]]
    lines += _render_frames(doc["frames"])
    load = doc["load"]
    lines += ["", f"## Load: {load['clients']} clients x {load['requests'] // load['clients']} "
              "requests", "",
              f"{load['ok']} of {load['requests']} answered, {load['errors']} errors, largest "
              f"difference from the unsplit model {load['max_abs_diff']:.2e}, "
              f"{load['throughput_rps']:.0f} requests/s.", ""]
    s = doc["soak"]
    first, last = s["samples"][0], s["samples"][-1]
    lines += [f"## Soak: {s['seconds']:.0f} s of good and bad requests", "",
              f"{s['ok']} good requests answered ({s['errors']} errors); {s['bad_rejected']} bad "
              f"ones rejected with INVALID_ARGUMENT ({s['bad_other']} otherwise). RSS "
              f"{first['rss_mib']:.0f} MiB at the start, {last['rss_mib']:.0f} MiB at the end, "
              f"peak {last['peak_mib']:.0f} MiB.", "", "| t (s) | RSS MiB |", "|---:|---:|"]
    lines += [f"| {p['t_s']:.0f} | {p['rss_mib']:.0f} |" for p in s["samples"]]
    return lines


_PLANE = {"grpc": "gRPC", "tcp": "data plane"}


def _codes(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {code}" for code, n in sorted(counts.items())) or "none"


def _row(attack: str, before: str, now: str) -> str:
    return f"| {attack} | {before} | {now} |"


def _render_http(h: dict[str, Any]) -> list[str]:
    lines = ["", "## The HTTP API (`edgesplit llm api`) under attack", "",
             f"A real `edgesplit llm api --api-key ...` subprocess over `edgesplit llm serve` "
             f"(SmolLM2-135M-Instruct split in two: {h['plan']}), loopback only, default "
             "limits unless a row says otherwise; its memory and open descriptors read from "
             f"/proc (RSS {h['api_rss_mib']:.0f} MiB after start). \"Before\" is what "
             "issue 55 measured before the HTTP guard, quoted; \"now\" is this run.", "",
             "| attack | before (issue 55) | now (this run) |", "|---|---|---|"]
    if b := h.get("big_message"):
        lines.append(_row(
            f"one {b['mib']:g} MB chat message, right key", BEFORE["big_message"],
            f"{b['status']} in {b['seconds']:.3f} s after {b['sent_mib']:.1f} MiB sent; RSS "
            f"peak +{b['peak_delta_mib']:.0f} MiB, after {b['after_delta_mib']:+.0f} MiB"))
    if w := h.get("wrong_key_bodies"):
        sent = ", ".join(f"{s:.1f}" for s in w["sent_mib"])
        lines.append(_row(
            f"{w['count']} bodies of {w['mib']:g} MB at once, wrong key",
            BEFORE["wrong_key_bodies"],
            f"{', '.join(map(str, w['statuses']))}; the clients got {sent} MiB of body sent "
            f"before the answer; RSS peak +{w['peak_delta_mib']:.0f} MiB, after "
            f"{w['after_delta_mib']:+.0f} MiB"))
    if e := h.get("empty_content_length"):
        lines.append(_row(f"Content-Length: {e['mib']:g} MB and no body, right key",
                          BEFORE["empty_content_length"],
                          f"{e['status']} after {e['seconds']:.3f} s"))
    if i := h.get("idle_slow"):
        lines.append(_row(
            f"{i['idle']} idle and {i['slow']} slow-header (a byte a second) connections "
            f"from {i['hosts']} loopback addresses; `--header-timeout-s "
            f"{i['header_timeout_s']:g}` (default 10, shortened for the run)",
            BEFORE["idle_slow"],
            f"still open at {i['header_timeout_s'] + 2:g} s: {i['still_open']['idle']} idle, "
            f"{i['still_open']['slow']} slow (answers: idle {_codes(i['answers']['idle'])}; "
            f"slow {_codes(i['answers']['slow'])}); a request meanwhile: {i['legit_during']} "
            f"in {i['legit_s']:.2f} s; server fds {i['fds_before']} before, "
            f"{i['fds_during']} during, {i['fds_after']} after"))
    if f := h.get("fd_exhaustion"):
        models = "; ".join(f"from {src}: {', '.join(map(str, codes))}"
                           for src, codes in f["models"].items())
        chat = ", ".join(f"{src} {code}" for src, code in f["chat"].items())
        lines.append(_row(
            f"server under `prlimit --nofile={f['nofile']}` (its limit: {f['server_limit']}), "
            f"{f['sockets']} idle sockets from 127.0.0.2, then legitimate requests",
            BEFORE["fd_exhaustion"],
            f"GET /v1/models {models}; a chat completion: {chat}; the flood: "
            f"{f['flood_still_open']} still open (the per-host cap, default 64: each new one "
            f"evicts the idle-longest), server fds {f['server_fds']}"))
    if lv := h.get("leavers"):
        for r in lv["rows"]:
            before = BEFORE.get(f"leavers_{r['leavers']}", "-")
            note = "" if r["busy_outlasted"] else " (the busy generation ended before the " \
                "stayer came: not loaded, raise --api-busy-tokens)"
            lines.append(_row(
                f"{r['leavers']} clients hang up while queued behind the one busy session, "
                "then one stays", before,
                f"stayer {r['stayer_status']}, {r['stayer_s']:.2f} s in all, "
                f"{r['extra_s']:+.2f} s beyond an unloaded request ({lv['unloaded_s']:.2f} s) "
                f"once the session was free{note}"))
    if g := h.get("guessing"):
        per_s = ", ".join(f"{v:.0f}/s {k}" for k, v in sorted(g["per_s"].items()))
        lines.append(_row(f"wrong keys as fast as one client sends them ({g['flood_s']:.0f} s)",
                          BEFORE["guessing"], f"{per_s} (right key just after: "
                                              f"{g['right_after_flood']})"))
        lines.append(_row(f"3 wrong keys a second and a right key each second from the same "
                          f"address ({g['mixed_s']} s)", "-",
                          f"right key refused {g['right_refused']} of {g['right_sent']}; "
                          f"wrong keys {_codes(g['wrong_mixed'])}"))
    lines += ["", "A wrong key is answered from the request's headers (the body is never "
              "read), a body over `--max-body-bytes` from its Content-Length, a connection "
              "without a complete head within `--header-timeout-s` gets 408, connections "
              "over the caps evict the idle-longest (503 to it), and a queued client that "
              "leaves is dropped before its prefill."]
    return lines


def _render_serving(s: dict[str, Any]) -> list[str]:
    lines = ["", "## Serving (`edgesplit serve`): the star sink and the token throttle", "",
             "tests/runtime/test_runtime_star's three-camera star (imported from the tests) "
             "with its aggregator served by an `edgesplit serve` subprocess (join table 256, "
             f"`--join-timeout-s {s.get('join_timeout_s', 0):g}`); the sensors' calls come "
             "from 127.0.0.2-4 through tests/helpers.py's relays. The token row serves "
             "digits_cnn's cloud part with `--token-file`.", "",
             "| attack | before (issue 55) | now (this run) |", "|---|---|---|"]
    if f := s.get("star_flood"):
        lines.append(_row(
            f"127.0.0.1 floods one-source parts under fresh join keys over "
            f"{f['flood_connections']} connections ({f['flood_first']} at once, then more "
            f"while the legitimate requests run: {f['flood_parts']} in all)",
            BEFORE["star_flood"],
            f"{f['served']} of {f['requests']} legitimate requests served in "
            f"{f['legit_s']:.1f} s, all equal to the unsplit model"
            f"{'' if not f['wrong_output'] else ' except ' + str(f['wrong_output'])}"
            f"{'; refused parts: ' + _codes(f['refused']) if f['refused'] else ''}; the "
            f"flood held {f['held_after_first']} of {f['max_joins']} joins, its parts: "
            f"{_codes(f['flood_codes'])}"))
    if t := s.get("token_throttle"):
        lines.append(_row(
            f"3 wrong tokens a second from 127.0.0.1 and a new right-token client there "
            f"each second ({t['seconds']} s, gRPC)", BEFORE["token_throttle"],
            f"{t['right_refused']} of {t['right_clients']} refused; wrong tokens: "
            f"{_codes(t['wrong'])}"))
    if j := s.get("one_call_join"):
        lines.append(_row(
            "every sensor's tensors in one call", BEFORE["one_call_join"],
            f"{j['status']} in {j['ms']:.1f} ms (equal to the unsplit model: "
            f"{j['matches_unsplit']}); the same join key again: {j['same_key_again']}"))
    return lines


def _render_frames(frames: dict[str, Any]) -> list[str]:
    lines = ["", "## The data plane's own attacks", "",
             "Each frame on a connection of its own, its answer read after the sender stops "
             "writing; then a good request over the data plane.", "",
             "| frame | status | ms | next request |", "|---|---|---:|---|"]
    lines += [f"| {r['case']} | {r['code']} | {r['ms']:.1f} | {r['next_request']} |"
              for r in frames["rows"]]
    f = frames["flood"]
    refused = ", ".join(f"{n} {code}" for code, n in sorted(f["refused"].items())) or "none"
    lines += ["", f"Flood: {f['connections']} idle connections at once (the server holds 256): "
              f"refused {refused}; a gRPC request while they were open: {f['grpc_during']}; "
              f"a data-plane request after they closed: {f['tcp_after']}. Server RSS "
              f"{f['rss_before_mib']:.0f} MiB before, {f['rss_during_mib']:.0f} during, "
              f"{f['rss_after_mib']:.0f} after."]
    return lines
