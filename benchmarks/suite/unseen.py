"""Architectures that are not in the suite (``models.py``), at sizes nothing was fitted to, as a
user would bring them: each a factory returning ``(module, example_inputs)``, random weights
(convnets' convs Kaiming, batch norms given statistics, so that nothing vanishes).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m tvmfuse bench benchmarks/suite/unseen.py:tinybert \
        --engines tvmfuse,onnxruntime --no-db --repeat 7

TinyBERT-like (312 wide, 12 heads of 26, sequence 93), DeiT-small at 160 px (101 tokens), ALBERT
(factorized 128 -> 768 embeddings, shared layers, sequence 45), ELECTRA-small (128 -> 256,
sequence 61), OPT (320 wide, 5 heads of 64, sequence 53), Qwen2 (5 query heads on 1 key/value
head, sequence 71), ResNet-18 from transformers at 160 px, MobileViT at 192 px.
"""
from __future__ import annotations

import torch
import transformers as tf


def _ids(vocab: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(0))


def _text(model: torch.nn.Module, seq: int):
    ids = _ids(model.config.vocab_size, seq)
    return _Field(model.eval(), "last_hidden_state"), (ids, torch.ones_like(ids))


def _convnet(model: torch.nn.Module) -> torch.nn.Module:
    """Convs variance-preserving and batch norms with statistics, so the logits do not vanish."""
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight)
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_var.uniform_(0.5, 2.0)
            module.running_mean.normal_(0.0, 0.1)
            module.weight.data.uniform_(0.5, 1.5)
    return model.eval()


def _causal_lm(model: torch.nn.Module, seq: int):
    """Token ids in, every position's logits out, no cache."""
    return (_Field(model.eval(), "logits", use_cache=False),
            (_ids(model.config.vocab_size, seq),))


class _Field(torch.nn.Module):
    """One field of a transformers output (``last_hidden_state``, ``logits``)."""

    def __init__(self, model: torch.nn.Module, field: str, **kwargs):
        super().__init__()
        self.model, self.field, self.kwargs = model, field, kwargs

    def forward(self, *args):
        return getattr(self.model(*args, **self.kwargs), self.field)


def tinybert():
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=312, num_hidden_layers=4, num_attention_heads=12,
                           intermediate_size=1200)
    return _text(tf.BertModel(config, add_pooling_layer=False), 93)


def deit_small_160():
    torch.manual_seed(0)
    config = tf.ViTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                          intermediate_size=1536, image_size=160, patch_size=16)
    return (_Field(tf.ViTModel(config, add_pooling_layer=False).eval(), "last_hidden_state"),
            (torch.randn(1, 3, 160, 160),))


def albert():
    torch.manual_seed(0)
    config = tf.AlbertConfig(embedding_size=128, hidden_size=768, num_hidden_layers=6,
                             num_attention_heads=12, intermediate_size=3072)
    return _text(tf.AlbertModel(config, add_pooling_layer=False), 45)


def electra_small():
    torch.manual_seed(0)
    config = tf.ElectraConfig(embedding_size=128, hidden_size=256, num_hidden_layers=12,
                              num_attention_heads=4, intermediate_size=1024)
    return _text(tf.ElectraModel(config), 61)


def opt_small():
    torch.manual_seed(0)
    config = tf.OPTConfig(hidden_size=320, num_hidden_layers=4, num_attention_heads=5,
                          ffn_dim=1280, vocab_size=5000, max_position_embeddings=256,
                          word_embed_proj_dim=320)
    return _causal_lm(tf.OPTForCausalLM(config), 53)


def qwen2_small():
    torch.manual_seed(0)
    config = tf.Qwen2Config(hidden_size=320, num_hidden_layers=4, num_attention_heads=5,
                            num_key_value_heads=1, intermediate_size=864, vocab_size=5000,
                            max_position_embeddings=512)
    return _causal_lm(tf.Qwen2ForCausalLM(config), 71)


def resnet_tf_160():
    torch.manual_seed(0)
    config = tf.ResNetConfig(depths=[2, 2, 2, 2], layer_type="basic",
                             hidden_sizes=[64, 128, 256, 512])
    model = _convnet(tf.ResNetForImageClassification(config))
    return _Field(model, "logits"), (torch.randn(1, 3, 160, 160),)


def mobilevit():
    torch.manual_seed(0)
    model = _convnet(tf.MobileViTForImageClassification(tf.MobileViTConfig(image_size=192)))
    return _Field(model, "logits"), (torch.randn(1, 3, 192, 192),)
