"""torchvision's detection, segmentation, grouped-convolution and video networks as users
export them, for ``model_zoo_latency.py --zoo vision``.

Each entry builds a torchvision model with seeded random weights (nothing is downloaded)
and exports it with ``torch.onnx.export`` at a static image size: the TorchScript path at
opset 17 (the only one torch 2.14's exporter completes for the detection models), and for
the segmentation models also the dynamo path at opset 18 (``_dynamo`` keys). A detection
model is wrapped to return its first image's boxes, scores and labels; a segmentation
model its ``out`` map; a classifier its logits. The inputs: one image (a video model: one
clip of 8 frames) of uniform noise.

=======================  ================================================================
key                      model (image size)
=======================  ================================================================
lraspp_mbv3              LRASPP, MobileNet-v3 Large backbone, 21 classes (256)
deeplabv3_mbv3           DeepLabV3, MobileNet-v3 Large backbone, 21 classes (256)
fcn_resnet50             FCN, ResNet-50 backbone, 21 classes (256)
ssdlite320               SSDlite 320, MobileNet-v3 Large, 91 classes (320)
fasterrcnn_mbv3_320      Faster R-CNN, MobileNet-v3 Large 320 FPN, 91 classes (320)
retinanet_resnet50       RetinaNet, ResNet-50 FPN, 91 classes (320; resized to 800 inside)
resnext50_32x4d          ResNeXt-50 32x4d, 1000 classes (224): grouped 3x3 convolutions
r3d_18                   R3D-18 video classifier, 400 classes (8 frames of 112): Conv3d
r2plus1d_18              R(2+1)D-18 (8 frames of 112): Conv3d split into 1x3x3 and 3x1x1
=======================  ================================================================

Needs torch and torchvision (``pip install torch==2.14.1 torchvision==0.29.1``), which are
not tunecache dependencies: the benchmark reports an install hint without them. With
random weights a detector's scores nearly tie (RetinaNet's within 1e-5), so two engines may
order equal detections differently: the error column compares the first output as given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

INSTALL_HINT = ("error: the vision zoo exports with torch and torchvision; install them with "
                "pip install torch==2.14.1 torchvision==0.29.1 onnxscript")

_SEGMENTATION = {"lraspp_mbv3": ("lraspp_mobilenet_v3_large", 256),
                 "deeplabv3_mbv3": ("deeplabv3_mobilenet_v3_large", 256),
                 "fcn_resnet50": ("fcn_resnet50", 256)}
_DETECTION = {"ssdlite320": ("ssdlite320_mobilenet_v3_large", 320),
              "fasterrcnn_mbv3_320": ("fasterrcnn_mobilenet_v3_large_320_fpn", 320),
              "retinanet_resnet50": ("retinanet_resnet50_fpn", 320)}
_CLASSIFICATION = {"resnext50_32x4d": ("resnext50_32x4d", 224)}
_VIDEO = {"r3d_18": ("r3d_18", 112), "r2plus1d_18": ("r2plus1d_18", 112)}
FRAMES = 8
ZOO: dict[str, tuple[str, int]] = {**_SEGMENTATION,
                                   **{f"{k}_dynamo": v for k, v in _SEGMENTATION.items()},
                                   **_DETECTION, **_CLASSIFICATION, **_VIDEO}
DEFAULT = ("lraspp_mbv3", "deeplabv3_mbv3", "lraspp_mbv3_dynamo", "ssdlite320",
           "fasterrcnn_mbv3_320", "resnext50_32x4d", "r3d_18", "r2plus1d_18")


def _module(key: str) -> Any:
    """The network of ``key`` in eval mode, returning tensors (not dicts)."""
    import torch
    import torchvision.models
    from torchvision.models import detection, segmentation

    name = ZOO[key][0]
    torch.manual_seed(0)
    detector = key in _DETECTION
    if key in _CLASSIFICATION:
        return getattr(torchvision.models, name)(weights=None).eval()
    if key in _VIDEO:
        return getattr(torchvision.models.video, name)(weights=None).eval()
    family = detection if detector else segmentation
    extra = {} if detector else {"aux_loss": False}
    network = getattr(family, name)(weights=None, weights_backbone=None, num_classes=91
                                    if detector else 21, **extra).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = network

        def forward(self, image: Any) -> Any:
            if detector:
                found = self.net(list(image))[0]
                return found["boxes"], found["scores"], found["labels"]
            return self.net(image)["out"]
    return Wrapped().eval()


def export(key: str, out_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Export ``key`` into ``out_dir`` (``{key}.onnx``); returns the path and its inputs."""
    import torch

    size = ZOO[key][1]
    shape = (1, 3, FRAMES, size, size) if key in _VIDEO else (1, 3, size, size)
    image = np.random.default_rng(0).random(shape, dtype=np.float32)
    path = out_dir / f"{key}.onnx"
    dynamo = key.endswith("_dynamo")
    export_fn: Callable[..., Any] = torch.onnx.export
    export_fn(_module(key), (torch.from_numpy(image),), str(path), input_names=["image"],
              opset_version=18 if dynamo else 17, dynamo=dynamo)
    return path, {"image": image}
