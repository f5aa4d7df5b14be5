"""Networks users write by hand rather than take from a model library, for
``model_zoo_latency.py --zoo handwritten``: upsampling by ConvTranspose, instance and
group normalisation, and recurrent layers, each with seeded random weights, exported with
``torch.onnx.export`` (TorchScript, opset 17) at a static input size.

=================  ======================================================================
key                model (input)
=================  ======================================================================
unet               U-Net (Ronneberger et al.; 32 base channels, 4 levels, BatchNorm,
                   ConvTranspose 2x2 stride 2 up; image 256x256)
unet_groupnorm     the U-Net with GroupNorm(8) and SiLU in place of BatchNorm and ReLU, as
                   diffusion models write it (256x256)
fast_style         fast style transfer (Johnson et al.; InstanceNorm, 5 residual blocks,
                   ConvTranspose 3x3 stride 2 up; 256x256)
lstm_bi            a text encoder: 2-layer bidirectional LSTM, hidden 256, over 64 steps of
                   128 features, batch 1
gru                a 2-layer GRU, hidden 512, over 100 steps of 80 features (speech
                   frames), batch 1
=================  ======================================================================

Needs torch (``pip install torch``), not a tunecache dependency: the benchmark reports an
install hint without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

INSTALL_HINT = ("error: the hand-written zoo exports with torch; install it with "
                "pip install torch==2.14.1")

ZOO: dict[str, tuple[int, ...]] = {"unet": (1, 3, 256, 256), "unet_groupnorm": (1, 3, 256, 256),
                                   "fast_style": (1, 3, 256, 256), "lstm_bi": (64, 1, 128),
                                   "gru": (100, 1, 80)}
"""Key -> the input's shape."""
DEFAULT = tuple(ZOO)


def export(key: str, out_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Export ``key`` into ``out_dir`` (``{key}.onnx``); returns the path and its inputs."""
    import torch

    torch.manual_seed(0)
    x = np.random.default_rng(0).random(ZOO[key], dtype=np.float32)
    path = out_dir / f"{key}.onnx"
    torch.onnx.export(_module(key), (torch.from_numpy(x),), str(path), input_names=["x"],
                      opset_version=17, dynamo=False)
    return path, {"x": x}


def _module(key: str) -> Any:
    from _handwritten_nets import fast_style, recurrent, unet

    if key in ("lstm_bi", "gru"):
        return recurrent(key).eval()
    return (fast_style() if key == "fast_style" else
            unet(group_norm=key == "unet_groupnorm")).eval()
