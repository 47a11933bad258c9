"""Built-in search spaces (registered on import by :mod:`edgesplit.nas.jmsnas.catalog`).

``digits-mbconv`` is sized so that supernet training on the scikit-learn digits (1x32x32,
10 classes) takes seconds to minutes on a laptop CPU: the stem halves the image at once, and
two stride-2 stages take 16x16 down to 4x4; a training step on 64 images with a random
architecture takes about 55 ms on two cores (the largest about 85 ms). ``cifar-mbconv`` is a
MobileNetV2-for-CIFAR layout (3x32x32) for runs that have more time.
"""

from __future__ import annotations

from edgesplit.nas.jmsnas.catalog import register_space
from edgesplit.nas.jmsnas.space import HeadSpec, SearchSpace, StemSpec

__all__: list[str] = []

register_space(SearchSpace.from_stages(
    "digits-mbconv", (1, 32, 32), 10,
    stem=StemSpec(16, kernel=3, stride=2),                 # 16 x 16x16
    stages=[(16, 1, 1), (24, 2, 2), (32, 3, 2), (64, 2, 1)],  # -> 64 x 4x4, 8 layers
    head=HeadSpec(128)))

register_space(SearchSpace.from_stages(
    "cifar-mbconv", (3, 32, 32), 10,
    stem=StemSpec(32, kernel=3, stride=1),                 # 32 x 32x32
    stages=[(16, 1, 1), (24, 2, 1), (32, 3, 2), (64, 4, 2), (96, 3, 1), (160, 3, 2),
            (320, 1, 1)],                                   # -> 320 x 4x4, 17 layers
    head=HeadSpec(1280)))
