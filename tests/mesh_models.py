"""The model and topology of the mesh tests, shared by the planner's (tests/plan/test_mesh.py,
test_plan_contract.py) and the runtime's (tests/runtime/test_runtime_mesh.py,
test_runtime_star.py): a module beside helpers.py, so a test in any folder imports it by name."""

from __future__ import annotations

from torch import nn

from edgesplit.hardware import AnalyticalCompute, Device, Link, mesh


class TwoHeads(nn.Module):
    """A stem, then two independent heavy branches joined by a sum (like an inception block or
    the heads of a multi-head model)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.left = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1))
        self.right = nn.Sequential(nn.Conv2d(8, 8, 5, padding=2), nn.ReLU())
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        h = self.stem(x)
        return self.head(self.left(h) + self.right(h))


def _device(name: str, gops: float) -> Device:
    return Device(name=name, kind="npu", compute=AnalyticalCompute(
        peak_gops={32: gops}, memory_bandwidth_gb_per_s=1000.0, default_efficiency=1.0))


def _mesh(branch_gops: float = 50.0, root_gops: float = 1.0, rtt_ms: float = 0.2):
    fast = Link(name="fast", bandwidth_mbps=10_000.0, rtt_ms=rtt_ms)
    return mesh("test-mesh", [_device("ue", 0.5)], [fast], _device("root", root_gops),
                [_device(f"b{i}", branch_gops) for i in range(2)], fast, _device("agg", 0.5),
                fast)
