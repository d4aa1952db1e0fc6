"""Eight architectures beyond the suite, at sizes nothing was fitted to, as a user would bring
them: ``transformers`` configs (the ``models`` extra), random weights, each factory returning the
module and its example inputs.

TinyBERT-like (312 wide, 12 heads of 26, sequence 93), DeiT-small at 160 px (101 tokens), ALBERT
(factorized 128 -> 768 embeddings, shared layers, sequence 45), ELECTRA-small (128 -> 256,
sequence 61), OPT (320 wide, 5 heads of 64, sequence 53), Qwen2 (5 query heads on 1 key/value
head, sequence 71), ResNet-18 from transformers at 160 px, MobileViT at 192 px.

The text models take their token ids only (``Field`` passes its inputs on in order, and the
import names them from ``forward(*args)``: one input), as they were benchmarked.
"""

from __future__ import annotations

import torch
import transformers as tf

from ..specs import SEED
from .suite import Field, token_ids
from .weights import kaiming_with_norm_stats


def _text(model: torch.nn.Module, seq: int):
    ids = token_ids(model.config.vocab_size, 1, seq)
    return Field(model.eval(), "last_hidden_state"), (ids, torch.ones_like(ids))


def _causal_lm(model: torch.nn.Module, seq: int):
    """Token ids in, every position's logits out, no cache."""
    return (Field(model.eval(), "logits", use_cache=False),
            (token_ids(model.config.vocab_size, 1, seq),))


def tinybert():
    torch.manual_seed(SEED)
    config = tf.BertConfig(hidden_size=312, num_hidden_layers=4, num_attention_heads=12,
                           intermediate_size=1200)
    return _text(tf.BertModel(config, add_pooling_layer=False), 93)


def deit_small_160():
    torch.manual_seed(SEED)
    config = tf.ViTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                          intermediate_size=1536, image_size=160, patch_size=16)
    return (Field(tf.ViTModel(config, add_pooling_layer=False).eval(), "last_hidden_state"),
            (torch.randn(1, 3, 160, 160),))


def albert():
    torch.manual_seed(SEED)
    config = tf.AlbertConfig(embedding_size=128, hidden_size=768, num_hidden_layers=6,
                             num_attention_heads=12, intermediate_size=3072)
    return _text(tf.AlbertModel(config, add_pooling_layer=False), 45)


def electra_small():
    torch.manual_seed(SEED)
    config = tf.ElectraConfig(embedding_size=128, hidden_size=256, num_hidden_layers=12,
                              num_attention_heads=4, intermediate_size=1024)
    return _text(tf.ElectraModel(config), 61)


def opt_small():
    torch.manual_seed(SEED)
    config = tf.OPTConfig(hidden_size=320, num_hidden_layers=4, num_attention_heads=5,
                          ffn_dim=1280, vocab_size=5000, max_position_embeddings=256,
                          word_embed_proj_dim=320)
    return _causal_lm(tf.OPTForCausalLM(config), 53)


def qwen2_small():
    torch.manual_seed(SEED)
    config = tf.Qwen2Config(hidden_size=320, num_hidden_layers=4, num_attention_heads=5,
                            num_key_value_heads=1, intermediate_size=864, vocab_size=5000,
                            max_position_embeddings=512)
    return _causal_lm(tf.Qwen2ForCausalLM(config), 71)


def resnet_tf_160():
    torch.manual_seed(SEED)
    config = tf.ResNetConfig(depths=[2, 2, 2, 2], layer_type="basic",
                             hidden_sizes=[64, 128, 256, 512])
    model = kaiming_with_norm_stats(tf.ResNetForImageClassification(config))
    return Field(model, "logits"), (torch.randn(1, 3, 160, 160),)


def mobilevit():
    torch.manual_seed(SEED)
    model = kaiming_with_norm_stats(
        tf.MobileViTForImageClassification(tf.MobileViTConfig(image_size=192)))
    return Field(model, "logits"), (torch.randn(1, 3, 192, 192),)
