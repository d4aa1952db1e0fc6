"""The zoo's tiny models: plain PyTorch, small enough for tests to build and verify in seconds,
each holding one family of the patterns tvmfuse fuses."""

from __future__ import annotations

import torch
from torch import nn


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act=nn.ReLU):
        super().__init__(
            nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            act(),
        )


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 -> 3x3 -> 1x1 with a residual add, and a 1x1 downsample path."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            ConvBNReLU(cin, mid, 1),
            ConvBNReLU(mid, mid, 3, stride),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = ConvBNReLU(3, 16, 3)
        self.block = Bottleneck(16, 8, 32, 2)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        y = self.block(self.stem(x))
        return self.fc(y.mean((2, 3)))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: expand 1x1, depthwise 3x3, project 1x1, all with BN (and ReLU6)."""

    def __init__(self, cin: int, cout: int, expand: int = 4):
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(
            ConvBNReLU(cin, mid, 1, act=nn.ReLU6),
            ConvBNReLU(mid, mid, 3, groups=mid, act=nn.ReLU6),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.residual = cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class TinyMobileNet(nn.Module):
    """A stage of MobileNetV2: a block that changes width, then one with a residual, so the
    first block's output feeds both the second block and its residual add."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = ConvBNReLU(3, 16, 3, 2, act=nn.ReLU6)
        self.blocks = nn.Sequential(InvertedResidual(16, 24), InvertedResidual(24, 24))
        self.fc = nn.Linear(24, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class TinyTransformer(nn.Module):
    """One BERT encoder layer: QKV projections, masked softmax attention, GELU MLP, post-LN."""

    def __init__(self, dim: int = 64, heads: int = 4, ffn: int = 256):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, ffn), nn.Linear(ffn, dim)

    def forward(self, x, mask):
        b, s, d = x.shape
        h = self.heads

        def split(t):
            return t.reshape(b, s, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / (d // h) ** 0.5
        scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
        attn = torch.softmax(scores, dim=-1) @ v
        x = self.ln1(x + self.o(attn.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.down(nn.functional.gelu(self.up(x))))
