"""``digits_cnn``: a small residual CNN trained on the real scikit-learn digits data, so that
AUTO-SPLIT's accuracy claims can be measured on real data without any download.

Training takes well under a minute on two CPU cores and is deterministic; the weights are
cached in ``$EDGESPLIT_CACHE_DIR`` (default ``~/.cache/edgesplit``) and reused. The shape of
the network is chosen so that splitting is interesting: a 32x32 input (1,024 bytes at 8 bits),
wide early feature maps that cost more to send than the input, and a 1x1 bottleneck
(16x8x8) that costs less.
"""

from __future__ import annotations

import logging
import os
import tempfile

import torch
from torch import nn

from edgesplit.data.cache import cache_dir
from edgesplit.models import register_model

__all__ = ["WEIGHTS_VERSION", "DigitsCNN", "cache_dir", "train_digits_cnn"]

log = logging.getLogger(__name__)

WEIGHTS_VERSION = 1  # bump when the architecture or the training recipe changes


def _conv(cin: int, cout: int, k: int = 3, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class _Residual(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1 = _conv(ch, ch)
        self.conv2 = nn.Sequential(nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.BatchNorm2d(ch))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(x + self.conv2(self.conv1(x)))


class DigitsCNN(nn.Module):
    """32x32 grey image -> 10 logits; about 0.12 M parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv(1, 16)                 # 16x32x32
        self.down1 = _conv(16, 32, stride=2)     # 32x16x16
        self.block1 = _Residual(32)
        self.down2 = _conv(32, 64, stride=2)     # 64x8x8
        self.block2 = _Residual(64)
        self.reduce = _conv(64, 16, k=1)         # 16x8x8: the cheap place to cut
        self.expand = _conv(16, 64)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block1(self.down1(self.stem(x)))
        x = self.expand(self.reduce(self.block2(self.down2(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def train_digits_cnn(epochs: int = 12, seed: int = 0) -> DigitsCNN:
    """Train on the first 1,197 samples of the fixed digits order (the rest are held out)."""
    from edgesplit.data.digits import TRAIN_SAMPLES, digits_arrays

    images, labels = digits_arrays()
    x, y = images[:TRAIN_SAMPLES], labels[:TRAIN_SAMPLES]
    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * 19)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(64):
            # small random shifts: the data set is tiny
            shift = torch.randint(-2, 3, (2,), generator=gen).tolist()
            batch = torch.roll(x[idx], shifts=shift, dims=(2, 3))
            loss = nn.functional.cross_entropy(model(batch), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        log.info("digits_cnn epoch %d loss %.4f", epoch, loss.item())
    return model.eval()


def _load_or_train() -> DigitsCNN:
    path = cache_dir() / f"digits_cnn-v{WEIGHTS_VERSION}.pt"
    model = DigitsCNN()
    if path.is_file():
        try:
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            return model.eval()
        except Exception as exc:  # a corrupt cache is rebuilt, not fatal
            log.warning("ignoring unreadable cached weights %s (%s); retraining", path, exc)
    log.info("training digits_cnn on scikit-learn digits (cached at %s)", path)
    model = train_digits_cnn()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # write-then-rename so concurrent test workers never read half a file
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
            torch.save(model.state_dict(), tmp.name)
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only home still gets a (freshly trained) model
        log.warning("could not cache digits_cnn weights at %s (%s); set EDGESPLIT_CACHE_DIR "
                    "to a writable folder to avoid retraining", path, exc)
    return model


def _digits_inputs(shape) -> tuple[torch.Tensor, ...]:
    from edgesplit.data.digits import TRAIN_SAMPLES, digits_arrays
    from edgesplit.models import image_inputs

    if tuple(shape[1:]) != (1, 32, 32):
        return image_inputs(shape)
    images, _ = digits_arrays()
    held_out = images[TRAIN_SAMPLES:]
    return (held_out[: shape[0]].clone(),)


@register_model("digits_cnn", input_shape=(1, 1, 32, 32), make_inputs=_digits_inputs,
                description="small residual CNN trained on scikit-learn digits (cached, "
                            "trained on first use)")
def digits_cnn() -> nn.Module:
    return _load_or_train()
