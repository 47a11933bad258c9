"""Start-up budget of the command line: how long a user waits for a short command to answer.

Each command runs as a subprocess of its own (a fresh interpreter, as a user types it), timed
from spawn to exit with its output piped: ``--warmup`` untimed runs first (the first run after
an install compiles .pyc files and may fill the cache folder: a cost paid once, not at each
start), then ``--repeats`` timed runs; the median is what the goal is checked on, every run is
kept. Goals (issue 37): ``edgesplit --help`` under 1 s; ``edgesplit devices`` and ``edgesplit
plan digits_cnn --edge jetson-nano --link 4g`` (a built-in model on a device preset) under 3 s.

Quiet machine: refuses to start above a 1-minute load of 1.0 (``--allow-load`` for a trial
run, with ``--out`` elsewhere); the load is recorded before and after. Writes startup.md and
startup.json.

    python benchmarks/bench_startup.py [--repeats 5] [--warmup 1] [--out DIR] [--allow-load X]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quiet import require_quiet

from edgesplit.hardware.profile import machine_info

RESULTS = Path(__file__).parent / "results"
QUIET_LOAD = 1.0  # 1-minute load average above which the machine is not quiet (2 cores)

# (what a user types after `edgesplit`, the goal in seconds for the median run)
COMMANDS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("--help",), 1.0),
    (("devices",), 3.0),
    (("plan", "digits_cnn", "--edge", "jetson-nano", "--link", "4g"), 3.0),
)


def edgesplit_executable() -> str:
    """The ``edgesplit`` script of this interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).parent / "edgesplit"
    if beside.is_file():
        return str(beside)
    found = shutil.which("edgesplit")
    if found is None:
        raise SystemExit("no `edgesplit` command: install the package (make install)")
    return found


def time_command(argv: list[str]) -> float:
    """Seconds from spawning ``argv`` to its exit; a failing command ends the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}:\n"
                         f"{done.stderr[-2000:]}")
    return seconds


def bench_command(exe: str, args: tuple[str, ...], goal_s: float, repeats: int,
                  warmup: int) -> dict[str, Any]:
    argv = [exe, *args]
    for _ in range(warmup):
        time_command(argv)
    runs = [time_command(argv) for _ in range(repeats)]
    median = statistics.median(runs)
    return {"command": " ".join(["edgesplit", *args]), "goal_s": goal_s, "runs_s": runs,
            "median_s": median, "min_s": min(runs), "max_s": max(runs),
            "met_goal": median < goal_s}


def render(doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    lines = [
        "# Start-up budget of the command line", "",
        f"{doc['date']}; Python {m['python']}, torch {m['torch']}, {m['platform']}. Each "
        f"command a fresh subprocess, output piped: {doc['warmup']} untimed run(s), then "
        f"{doc['repeats']} timed; the goal is checked on the median. 1-minute load average "
        f"{doc['load_before']:.2f} before, {doc['load_after']:.2f} after.", "",
        "| command | goal | median | min | max | every run (s) | met |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in doc["commands"]:
        runs = ", ".join(f"{s:.2f}" for s in r["runs_s"])
        lines.append(f"| `{r['command']}` | < {r['goal_s']:g} s | {r['median_s']:.2f} s | "
                     f"{r['min_s']:.2f} s | {r['max_s']:.2f} s | {runs} | "
                     f"{'yes' if r['met_goal'] else 'NO'} |")
    met = sum(r["met_goal"] for r in doc["commands"])
    lines += ["", f"{met} of {len(doc['commands'])} commands within their goal."]
    return lines


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "startup.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = render(doc)
    (out / "startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per command")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per command first")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--allow-load", type=float, default=QUIET_LOAD,
                        help="highest 1-minute load average to start at (default: quiet)")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite startup.md from startup.json without measuring")
    args = parser.parse_args()
    if args.render_only:
        write(json.loads((args.out / "startup.json").read_text()), args.out)
        return
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--repeats must be at least 1 and --warmup at least 0")
    before = require_quiet(args.allow_load)
    exe = edgesplit_executable()
    start = time.perf_counter()
    doc: dict[str, Any] = {"version": 1, "machine": machine_info(),
                           "date": time.strftime("%Y-%m-%d %H:%M"), "executable": exe,
                           "repeats": args.repeats, "warmup": args.warmup,
                           "load_before": before, "load_average": list(os.getloadavg())}
    doc["commands"] = [bench_command(exe, cmd, goal, args.repeats, args.warmup)
                       for cmd, goal in COMMANDS]
    doc["load_after"] = os.getloadavg()[0]
    doc["load_average_end"] = list(os.getloadavg())
    doc["wall_s"] = time.perf_counter() - start
    write(doc, args.out)


if __name__ == "__main__":
    main()
