"""Built-in search spaces (registered on import by :mod:`edgesplit.nas.jmsnas.catalog`).

``digits-mbconv`` is sized so that supernet training on the scikit-learn digits (1x32x32,
10 classes) takes seconds to minutes on a laptop CPU: the stem halves the image at once, and
two stride-2 stages take 16x16 down to 4x4; a training step on 64 images with a random
architecture takes about 55 ms on two cores (the largest about 85 ms). ``cifar-mbconv`` is a
MobileNetV2-for-CIFAR layout (3x32x32) for runs that have more time.

``fashion-mbconv`` takes Fashion-MNIST upsampled to 1x64x64 and is shaped so that, on
``jmsnas-chain``, splitting pays: the raw 16 KB input costs 5.2 ms over the 25 Mbps UE->SBS
link (cloud-only about 9 ms, SBS-only about 6 ms), while a thin stem and three stride-2 layers
on the UE shrink it to 40x4x4 (2.5 KB, 0.8 ms), and the wide layers after them (80-320
channels at 4x4, a 1280-channel head) are cheap for the GPUs but 1.5-4 ms on the
Raspberry-Pi-class UE. By the preset device models: largest network UE-only 4.47 ms,
MobileNetV2-style 3.54 ms, smallest 1.79 ms, each above its best plan (2.09, 1.75, 1.33 ms,
the first 14 layers on the UE, the rest on the SBS). At 64x64 a training step on 64 images
takes 63-293 ms on two cores (smallest to largest network); on 5,000 images a search epoch
takes about 14 s and a retraining epoch 17 s, so a benchmark's seeds and budgets fit minutes.
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

register_space(SearchSpace.from_stages(
    "fashion-mbconv", (1, 64, 64), 10,
    stem=StemSpec(8, kernel=3, stride=2),                  # 8 x 32x32
    stages=[(16, 1, 2), (24, 2, 2), (40, 2, 2),            # -> 40 x 4x4: 2.5 KB to send
            (80, 2, 1), (160, 2, 1), (320, 1, 1)],         # wide and cheap to send, 10 layers
    head=HeadSpec(1280)))
