"""The torch modules of ``handwritten_zoo.py`` (imported only when exporting: torch is not
a tunecache dependency)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _norm(channels: int, group_norm: bool) -> nn.Module:
    return nn.GroupNorm(8, channels) if group_norm else nn.BatchNorm2d(channels)


def _double_conv(cin: int, cout: int, group_norm: bool) -> nn.Sequential:
    act: type[nn.Module] = nn.SiLU if group_norm else nn.ReLU
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                         _norm(cout, group_norm), act(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                         _norm(cout, group_norm), act())


class _UNet(nn.Module):
    def __init__(self, base: int, levels: int, group_norm: bool) -> None:
        super().__init__()
        widths = [base * 2 ** i for i in range(levels + 1)]
        self.down = nn.ModuleList([_double_conv(3, widths[0], group_norm)] + [
            _double_conv(widths[i], widths[i + 1], group_norm) for i in range(levels)])
        self.up = nn.ModuleList([nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                 for i in reversed(range(levels))])
        self.merge = nn.ModuleList([_double_conv(2 * widths[i], widths[i], group_norm)
                                    for i in reversed(range(levels))])
        self.head = nn.Conv2d(widths[0], 2, 1)

    def forward(self, x: Any) -> Any:
        skips = []
        for k, block in enumerate(self.down):
            x = block(x if k == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips[:-1]), strict=True):
            x = merge(torch.cat([skip, up(x)], dim=1))
        return self.head(x)


def unet(group_norm: bool = False) -> nn.Module:
    """U-Net, 32 base channels, 4 levels, 2 classes."""
    return _UNet(32, 4, group_norm)


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1), nn.InstanceNorm2d(channels, affine=True),
            nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1),
            nn.InstanceNorm2d(channels, affine=True))

    def forward(self, x: Any) -> Any:
        return x + self.body(x)


def fast_style() -> nn.Module:
    """Johnson et al.'s image transformation network (32-64-128 channels)."""
    def conv(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2),
                nn.InstanceNorm2d(cout, affine=True), nn.ReLU()]

    def up(cin: int, cout: int) -> list[nn.Module]:
        return [nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1),
                nn.InstanceNorm2d(cout, affine=True), nn.ReLU()]

    return nn.Sequential(*conv(3, 32, 9), *conv(32, 64, 3, 2), *conv(64, 128, 3, 2),
                         *(_Residual(128) for _ in range(5)), *up(128, 64), *up(64, 32),
                         nn.Conv2d(32, 3, 9, padding=4))


class _Recurrent(nn.Module):
    """A recurrent layer stack returning its output sequence only."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Any) -> Any:
        return self.layer(x)[0]


def recurrent(key: str) -> nn.Module:
    """``lstm_bi``: 2-layer bidirectional LSTM 128 -> 256; ``gru``: 2-layer GRU 80 -> 512."""
    if key == "lstm_bi":
        return _Recurrent(nn.LSTM(128, 256, num_layers=2, bidirectional=True))
    return _Recurrent(nn.GRU(80, 512, num_layers=2))
