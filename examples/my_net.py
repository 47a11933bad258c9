"""A model in your own code, as `edgesplit inspect examples/my_net.py:MyNet` reads it
(docs/your-own-model.md): three residual blocks that keep their shape, which AdaptiveNet can
skip and shrink."""

import torch
from torch import nn


class MyNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(32, 16, 3, padding=1)) for _ in range(3))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = torch.relu(x + block(x))
        return self.head(x.mean((2, 3)))


def make_model() -> nn.Module:
    """A factory: where trained weights are loaded (edgesplit calls it with no arguments)."""
    model = MyNet(classes=10)
    # model.load_state_dict(torch.load("my_net.pth", weights_only=True))
    return model
