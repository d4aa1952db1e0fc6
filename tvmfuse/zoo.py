"""The bundled model zoo: real architectures with seeded random weights, built offline.

The full-size models come from Hugging Face ``transformers`` configs (the ``models`` extra), built
with random initialisation: nothing is downloaded. The tiny models are plain PyTorch, small enough
for tests to build and verify in seconds, and each holds the patterns tvmfuse fuses.
Every BatchNorm gets random running statistics, so folding it is never a no-op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .errors import TvmfuseError
from .specs import SEED, TensorSpec


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: how to build the module, and its inputs at batch 1.

    ``value_ranges`` bounds integer inputs (token ids, masks): ``name -> (low, high)``, high
    exclusive. ``needs`` names the pip extra the factory imports, if any.
    """

    name: str
    description: str
    factory: Callable[[], nn.Module]
    inputs: tuple[TensorSpec, ...]
    value_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    needs: str | None = None

    def build(self) -> nn.Module:
        torch.manual_seed(SEED)
        try:
            module = self.factory()
        except ImportError as err:
            raise TvmfuseError(
                f"zoo model {self.name!r} needs the '{self.needs}' extra "
                f"(pip install 'tvmfuse[{self.needs}]'): {err}"
            ) from None
        _randomize_norm_stats(module)
        return module.eval()


def _randomize_norm_stats(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)


# --- tiny models: plain PyTorch, each holding one family of fusible patterns ------------------


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


# --- full-size models from transformers configs, random weights ---------------------------


class _Logits(nn.Module):
    """Return the logits tensor of a transformers image classifier instead of its ModelOutput."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values).logits


class _BertOutputs(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


def _resnet50() -> nn.Module:
    import transformers as tf  # noqa: PLC0415 - the optional 'models' extra

    config = tf.ResNetConfig(
        layer_type="bottleneck", depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048],
        embedding_size=64, num_labels=1000,
    )
    return _Logits(tf.ResNetForImageClassification(config))


def _mobilenet_v2() -> nn.Module:
    import transformers as tf  # noqa: PLC0415

    # tf_padding=False gives torchvision's symmetric padding instead of TF's "same" padding.
    config = tf.MobileNetV2Config(tf_padding=False, num_labels=1000)
    return _Logits(tf.MobileNetV2ForImageClassification(config))


def _bert_base() -> nn.Module:
    import transformers as tf  # noqa: PLC0415

    config = tf.BertConfig(attn_implementation="eager")  # bert-base-uncased's shape
    return _BertOutputs(tf.BertModel(config))


def _image(name: str = "pixel_values", size: int = 224) -> tuple[TensorSpec, ...]:
    return (TensorSpec(name, (1, 3, size, size), "float32"),)


@functools.cache
def registry() -> dict[str, ZooModel]:
    entries = [
        ZooModel("resnet50", "ResNet-50 (transformers config, random weights)", _resnet50,
                 _image(), needs="models"),
        ZooModel("mobilenet_v2", "MobileNetV2 1.0 (transformers config, random weights)",
                 _mobilenet_v2, _image(), needs="models"),
        ZooModel("bert-base", "BERT-base encoder, sequence 128 (transformers config)", _bert_base,
                 (TensorSpec("input_ids", (1, 128), "int64"),
                  TensorSpec("attention_mask", (1, 128), "int64")),
                 value_ranges={"input_ids": (0, 30522), "attention_mask": (0, 2)},
                 needs="models"),
        ZooModel("tiny-resnet", "conv-BN-ReLU stem and one bottleneck with downsample",
                 TinyResNet, _image("x", 32)),
        ZooModel("tiny-mobilenet", "two MobileNetV2 inverted residuals (depthwise conv, ReLU6)",
                 TinyMobileNet, _image("x", 32)),
        ZooModel("tiny-transformer", "one BERT encoder layer (dim 64, 4 heads, sequence 16)",
                 TinyTransformer,
                 (TensorSpec("x", (1, 16, 64), "float32"), TensorSpec("mask", (1, 16), "float32")),
                 value_ranges={"mask": (0, 2)}),
    ]
    return {e.name: e for e in entries}


def get(name: str) -> ZooModel:
    try:
        return registry()[name]
    except KeyError:
        raise TvmfuseError(
            f"unknown model {name!r}: not a zoo name ({', '.join(registry())}), an existing "
            f".pt2/.onnx file, or a package.module:factory"
        ) from None
