"""The bundled model zoo: real architectures with seeded random weights, built offline, by name.

- ``tiny-resnet``, ``tiny-mobilenet``, ``tiny-transformer`` (:mod:`.tiny`): plain PyTorch, small
  enough for tests to build and verify in seconds, each holding the patterns tvmfuse fuses.
- ``resnet50``, ``mobilenet_v2``, ``bert-base`` (:mod:`.classic`), with committed tuning
  databases.
- The suite (:mod:`.suite`): fourteen ``transformers`` architectures none of whose shapes was
  tuned for (``vit``, ``llama-decode``, ...), each also as ``tiny-<name>``, a small config for
  tests.
- Eight architectures beyond the suite (:mod:`.unseen`): ``tinybert``, ``mobilevit``, ...

The ``transformers`` models need the ``models`` extra; nothing is downloaded. This module lists
the names without importing torch (``tvmfuse build --list``); a model's module is imported when
it is built.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field

from ..errors import TvmfuseError
from ..specs import SEED, TensorSpec


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: the factory that builds the module, and its inputs at batch 1.

    ``factory`` is ``module:function`` within this package, called with ``args``. Where
    ``inputs`` is empty the factory returns ``(module, example_inputs)`` and the import takes
    the inputs' shapes and integer ranges from those examples (as for a user's
    ``file.py:factory``); otherwise it returns the module, and ``value_ranges`` bounds its integer
    inputs: ``name -> (low, high)``, high exclusive. ``needs`` names the pip extra the factory
    imports, if any.
    """

    name: str
    description: str
    factory: str
    args: tuple = ()
    inputs: tuple[TensorSpec, ...] = ()
    value_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    needs: str | None = None

    def load(self):
        """``(module, example_inputs)``: the module in eval mode, seeded, and the example
        tensors its factory made with it (``None`` where ``inputs`` says what it takes)."""
        import torch  # noqa: PLC0415 - listing the zoo must not import torch

        from .weights import randomize_norm_stats  # noqa: PLC0415 - imports torch

        module_name, _, function = self.factory.partition(":")
        torch.manual_seed(SEED)
        try:
            made = getattr(importlib.import_module(f"{__name__}.{module_name}"), function)(
                *self.args)
        except ImportError as err:
            if self.needs is None:
                raise
            raise TvmfuseError(
                f"zoo model {self.name!r} needs the '{self.needs}' extra "
                f"(pip install 'tvmfuse[{self.needs}]'): {err}"
            ) from None
        if self.inputs:
            randomize_norm_stats(made)
            return made.eval(), None
        module, examples = made
        return module.eval(), tuple(examples)

    def build(self):
        """The module alone (an ``nn.Module`` in eval mode)."""
        return self.load()[0]


def _image(name: str = "pixel_values", size: int = 224) -> tuple[TensorSpec, ...]:
    return (TensorSpec(name, (1, 3, size, size), "float32"),)


#: The suite's architectures: zoo name -> what it is, at full size.
SUITE = {
    "gpt2": "GPT-2 small, causal LM logits, sequence 128",
    "llama": "Llama (4 layers, 1024 wide, grouped-query attention), logits, sequence 128",
    "llama-prefill": "the Llama prefill: logits and a fresh KV cache, sequence 128",
    "llama-decode": "one Llama decode step over 127 cached tokens",
    "roberta": "RoBERTa-base encoder, sequence 77",
    "distilbert": "DistilBERT encoder, sequence 50",
    "t5": "T5-small encoder-decoder logits, sequences 61 and 13",
    "vit": "ViT-base/16 at 224 px (197 tokens)",
    "clip-vision": "CLIP ViT-B/32 vision tower at 224 px (50 tokens)",
    "swin": "Swin-tiny at 224 px (shifted windows of 49)",
    "whisper-encoder": "whisper-tiny's encoder (4 layers, 384 wide), 1500 positions",
    "regnet": "RegNetY-400MF (grouped convs, squeeze-excite) at 224 px",
    "efficientnet": "EfficientNet-B0 at 224 px",
    "convnext": "ConvNeXt-tiny at 224 px",
}

#: Architectures beyond the suite: zoo name -> (factory in .unseen, what it is).
UNSEEN = {
    "tinybert": ("tinybert", "TinyBERT-like encoder (312 wide, 12 heads of 26), sequence 93"),
    "deit-small-160": ("deit_small_160", "DeiT-small at 160 px (101 tokens)"),
    "albert": ("albert", "ALBERT (128 -> 768 embeddings, shared layers), sequence 45"),
    "electra-small": ("electra_small", "ELECTRA-small encoder (128 -> 256), sequence 61"),
    "opt-small": ("opt_small", "OPT causal LM (320 wide, 5 heads of 64), sequence 53"),
    "qwen2-small": ("qwen2_small", "Qwen2 causal LM (5 query heads on 1 key/value head), "
                                   "sequence 71"),
    "resnet-tf-160": ("resnet_tf_160", "ResNet-18 (transformers) at 160 px"),
    "mobilevit": ("mobilevit", "MobileViT-small at 192 px"),
}

#: The most downloaded architectures beyond the suite and the classic models, at their published
#: base sizes (:mod:`.popular`): zoo name -> what it is.
POPULAR = {
    "mistral": "Mistral-7B's widths and grouped-query attention, 2 of its 32 layers, logits, "
               "sequence 128",
    "qwen2": "Qwen2-0.5B's widths and 151936-token vocabulary, 6 of its 24 layers, logits, "
             "sequence 64",
    "bart": "BART-base encoder-decoder logits, sequences 61 and 13",
    "deit": "DeiT-base at 224 px (198 tokens)",
    "wav2vec2": "Wav2Vec2-base over one second of 16 kHz audio",
    "deberta-v2": "DeBERTa-v3-base encoder (disentangled relative attention), sequence 93",
    "segformer": "SegFormer-B0 semantic segmentation at 512 px",
    "dpt": "DPT (the config's ViT-base backbone) depth estimation at 384 px",
}


@functools.cache
def registry() -> dict[str, ZooModel]:
    """Every zoo entry by name, in the order ``tvmfuse build --list`` prints them."""
    entries = [
        ZooModel("resnet50", "ResNet-50 (transformers config, random weights)", "classic:resnet50",
                 inputs=_image(), needs="models"),
        ZooModel("mobilenet_v2", "MobileNetV2 1.0 (transformers config, random weights)",
                 "classic:mobilenet_v2", inputs=_image(), needs="models"),
        ZooModel("bert-base", "BERT-base encoder, sequence 128 (transformers config)",
                 "classic:bert_base",
                 inputs=(TensorSpec("input_ids", (1, 128), "int64"),
                         TensorSpec("attention_mask", (1, 128), "int64")),
                 value_ranges={"input_ids": (0, 30522), "attention_mask": (0, 2)},
                 needs="models"),
        ZooModel("tiny-resnet", "conv-BN-ReLU stem and one bottleneck with downsample",
                 "tiny:TinyResNet", inputs=_image("x", 32)),
        ZooModel("tiny-mobilenet", "two MobileNetV2 inverted residuals (depthwise conv, ReLU6)",
                 "tiny:TinyMobileNet", inputs=_image("x", 32)),
        ZooModel("tiny-transformer", "one BERT encoder layer (dim 64, 4 heads, sequence 16)",
                 "tiny:TinyTransformer",
                 inputs=(TensorSpec("x", (1, 16, 64), "float32"),
                         TensorSpec("mask", (1, 16), "float32")),
                 value_ranges={"mask": (0, 2)}),
    ]
    entries += [ZooModel(name, description, "suite:build", (name, False), needs="models")
                for name, description in SUITE.items()]
    entries += [ZooModel(f"tiny-{name}", f"{name} in a small config for tests (a few layers, "
                         f"narrow)", "suite:build", (name, True), needs="models")
                for name in SUITE]
    entries += [ZooModel(name, description, f"unseen:{function}", needs="models")
                for name, (function, description) in UNSEEN.items()]
    entries += [ZooModel(name, description, "popular:build", (name,), needs="models")
                for name, description in POPULAR.items()]
    return {e.name: e for e in entries}


def names() -> tuple[str, ...]:
    """The zoo's model names."""
    return tuple(registry())


def listing() -> str:
    """One line per zoo name with what it is: what ``tvmfuse build --list`` prints."""
    width = max(map(len, registry()))
    return "\n".join(f"{e.name:<{width}}  {e.description}" for e in registry().values())


def get(name: str) -> ZooModel:
    try:
        return registry()[name]
    except KeyError:
        raise unknown(name) from None


def unknown(source: str) -> TvmfuseError:
    """The error for a model that is neither a zoo name nor a file nor a factory."""
    return TvmfuseError(
        f"unknown model {source!r}: not a zoo name ({', '.join(registry())}), an existing "
        f".pt2/.onnx file, or a package.module:factory"
    )
