"""`make demo`'s runtime story: plan a built-in model for a device/link preset, serve the cloud
part in its own process, run requests through the emulated link, print predicted vs measured,
and stop the server cleanly."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

EDGESPLIT = [sys.executable, "-m", "edgesplit.cli"]
PLAN = ["plan", "resnet18", "--edge", "jetson-nano", "--cloud", "v100-server", "--link", "4g",
        "--method", "manual", "--split-after", "resnet.encoder.stages.1.layers.1.add"]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        subprocess.run([*EDGESPLIT, *PLAN, "--out", str(plan)], check=True)
        # --shape: rehearse the 4G link on loopback (both ends: requests and replies)
        server = subprocess.Popen([*EDGESPLIT, "serve", str(plan), "--device", "cloud",
                                   "--port", "0", "--shape"], stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()  # "listening on HOST:PORT ..."
            if not line.startswith("listening on"):
                print("the server did not start", file=sys.stderr)
                return 1
            address = line.split()[2]
            print(f"cloud part served at {address}; 5 requests through the emulated 4G link")
            return subprocess.run([*EDGESPLIT, "run", str(plan), "--server", address,
                                   "--requests", "5", "--shape"]).returncode
        finally:
            server.terminate()  # SIGTERM: the server finishes in-flight requests and exits
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
