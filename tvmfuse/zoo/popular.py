"""The most downloaded ``transformers`` architectures that neither the suite nor the classic zoo
holds: with those, the first twenty of the coverage sweep's popularity order
(``benchmarks/coverage.py``'s ``POPULAR``) at their published base sizes, random weights, batch 1.

Mistral and Qwen2 keep their published widths, heads and vocabulary but fewer layers (a 7B or
0.5B model's every layer is the same kernels again, and two cores would spend minutes on one
run); every other model is whole: BART-base, DeiT-base at 224 px (198 tokens with the
distillation token), Wav2Vec2-base over one second of 16 kHz audio, DeBERTa-v3-base (relative
position buckets, disentangled attention), SegFormer-B0 at 512 px, DPT at 384 px.
"""

from __future__ import annotations

import torch
import transformers as tf

from ..specs import SEED
from .suite import Field, _CausalLM, _image, _Seq2Seq, _Text, token_ids


def _mistral():
    """Mistral-7B's widths (4096, 32 query heads on 8 key/value heads, FFN 14336, vocab 32000),
    2 of its 32 layers, sequence 128."""
    config = tf.MistralConfig(num_hidden_layers=2)
    return _CausalLM(tf.MistralForCausalLM(config)), (token_ids(config.vocab_size, 1, 128),)


def _qwen2():
    """Qwen2-0.5B's widths (896, 14 query heads on 2 key/value heads, FFN 4864, vocab 151936,
    tied embeddings), 6 of its 24 layers, sequence 64."""
    config = tf.Qwen2Config(hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                            num_key_value_heads=2, num_hidden_layers=6, vocab_size=151936,
                            tie_word_embeddings=True)
    return _CausalLM(tf.Qwen2ForCausalLM(config)), (token_ids(config.vocab_size, 1, 64),)


def _bart():
    """BART-base (768 wide, 6 + 6 layers), logits over sequences 61 and 13."""
    config = tf.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6,
                           encoder_attention_heads=12, decoder_attention_heads=12,
                           encoder_ffn_dim=3072, decoder_ffn_dim=3072)
    return _Seq2Seq(tf.BartForConditionalGeneration(config)), (
        token_ids(config.vocab_size, 1, 61), token_ids(config.vocab_size, 1, 13))


def _deit():
    """DeiT-base at 224 px: 196 patches, the class and the distillation token."""
    config = tf.DeiTConfig()
    return Field(tf.DeiTModel(config, add_pooling_layer=False), "last_hidden_state"), (
        _image(config.image_size),)


def _wav2vec2():
    """Wav2Vec2-base: the conv feature encoder and 12 transformer layers over 16000 samples."""
    samples = torch.randn(1, 16000, generator=torch.Generator().manual_seed(SEED))
    return Field(tf.Wav2Vec2Model(tf.Wav2Vec2Config()), "last_hidden_state"), (samples,)


def _deberta_v2():
    """DeBERTa-v3-base's config (768 wide, 12 layers, 256 relative position buckets, shared
    attention keys), sequence 93."""
    config = tf.DebertaV2Config(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        vocab_size=128100, relative_attention=True, position_buckets=256,
        max_relative_positions=-1, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
        share_att_key=True, position_biased_input=False, type_vocab_size=0)
    ids = token_ids(config.vocab_size, 1, 93)
    return _Text(tf.DebertaV2Model(config), "last_hidden_state"), (ids, torch.ones_like(ids))


def _segformer():
    """SegFormer-B0 (the config's defaults) for semantic segmentation at 512 px: logits of 150
    classes at 128 x 128."""
    config = tf.SegformerConfig(num_labels=150)
    return Field(tf.SegformerForSemanticSegmentation(config), "logits"), (_image(512),)


def _dpt():
    """DPT (the config's defaults: a ViT-base backbone, 12 layers) depth estimation at 384 px."""
    config = tf.DPTConfig()
    return Field(tf.DPTForDepthEstimation(config), "predicted_depth"), (
        _image(config.image_size),)


#: Zoo name -> factory (their descriptions: ``tvmfuse.zoo.POPULAR``).
FACTORIES = {"mistral": _mistral, "qwen2": _qwen2, "bart": _bart, "deit": _deit,
             "wav2vec2": _wav2vec2, "deberta-v2": _deberta_v2, "segformer": _segformer,
             "dpt": _dpt}


def build(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The architecture ``name`` in eval mode and its example inputs."""
    torch.manual_seed(SEED)
    module, inputs = FACTORIES[name]()
    return module.eval(), inputs
