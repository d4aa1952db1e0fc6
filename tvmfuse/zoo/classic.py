"""The zoo's first full-size models, ResNet-50, MobileNetV2 and BERT-base: ``transformers``
configs (the ``models`` extra) with random weights, nothing downloaded. Their inputs are the
registry's; their committed tuning databases cover every kernel they build."""

from __future__ import annotations

import transformers as tf
from torch import nn


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


def resnet50() -> nn.Module:
    config = tf.ResNetConfig(
        layer_type="bottleneck", depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048],
        embedding_size=64, num_labels=1000,
    )
    return _Logits(tf.ResNetForImageClassification(config))


def mobilenet_v2() -> nn.Module:
    # tf_padding=False gives torchvision's symmetric padding instead of TF's "same" padding.
    config = tf.MobileNetV2Config(tf_padding=False, num_labels=1000)
    return _Logits(tf.MobileNetV2ForImageClassification(config))


def bert_base() -> nn.Module:
    config = tf.BertConfig(attn_implementation="eager")  # bert-base-uncased's shape
    return _BertOutputs(tf.BertModel(config))
