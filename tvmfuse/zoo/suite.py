"""The suite: fourteen architectures from ``transformers`` configs (the ``models`` extra), random
weights, as a user brings them. Each is a zoo name at full size (``vit``) and at a small config
for tests (``tiny-vit``: a few layers, narrow), made by :func:`build` with its example inputs.

None of these shapes was tuned for: sequence 197 and 50 (ViT, CLIP), windows of 49 with shifts
(Swin), 1500 audio frames (Whisper), squeeze-excite and grouped convs (RegNet, EfficientNet),
causal decoders with rotary embeddings and RMSNorm (Llama), an encoder-decoder (T5).
"""

from __future__ import annotations

import torch
import transformers as tf
from torch import nn

from ..specs import SEED
from .weights import calibrate_batch_norms


class Field(nn.Module):
    """One tensor field of a transformers ModelOutput (``last_hidden_state``, ``logits``), the
    model called on the inputs in order and ``kwargs``."""

    def __init__(self, model: nn.Module, field: str, **kwargs):
        super().__init__()
        self.model, self.field, self.kwargs = model, field, kwargs

    def forward(self, *args):
        return getattr(self.model(*args, **self.kwargs), self.field)


class _Text(nn.Module):
    def __init__(self, model: nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids, attention_mask):
        return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask), self.field)


class _CausalLM(nn.Module):
    """A decoder LM without a cache: token ids in, next-token logits for every position out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


class _CachedLM(nn.Module):
    """A decoder LM with its KV cache as explicit tensors: token ids and every layer's past keys
    and values (stacked: ``[layers, batch, kv_heads, past, head_dim]``) in; logits and the
    updated keys and values out. Without past tensors it is the prefill, which starts the cache."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, past_keys=None, past_values=None):
        layers = None if past_keys is None else list(zip(past_keys.unbind(0),
                                                         past_values.unbind(0)))
        cache = tf.DynamicCache(layers, config=self.model.config)
        out = self.model(input_ids=input_ids, cache=cache, use_cache=True)
        present = (out.cache if hasattr(out, "cache") else out.past_key_values).layers
        return (out.logits, torch.stack([layer.keys for layer in present]),
                torch.stack([layer.values for layer in present]))


class _Prefill(_CachedLM):
    def forward(self, input_ids):
        return super().forward(input_ids)


class _Seq2Seq(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                          use_cache=False).logits


def token_ids(vocab: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(SEED))


def _image(size: int = 224, channels: int = 3) -> torch.Tensor:
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(SEED))


# --- the architectures: (config, wrapper, inputs) at full size and small ---------------------


def _gpt2(small: bool):
    kw = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000) if small else {}
    config = tf.GPT2Config(**kw)
    seq = 37 if small else 128
    return _CausalLM(tf.GPT2LMHeadModel(config)), (token_ids(config.vocab_size, 1, seq),)


def _llama(small: bool):
    kw = (dict(num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1000) if small else
          dict(num_hidden_layers=4, hidden_size=1024, intermediate_size=2816,
               num_attention_heads=16, num_key_value_heads=4, vocab_size=32000))
    config = tf.LlamaConfig(**kw)
    seq = 37 if small else 128
    return _CausalLM(tf.LlamaForCausalLM(config)), (token_ids(config.vocab_size, 1, seq),)


def _llama_decode(small: bool):
    """One token after 36 (small) or 127 cached ones."""
    module, (ids,) = _llama(small)
    config = module.model.config
    past = ids.shape[1] - 1
    shape = (config.num_hidden_layers, 1, config.num_key_value_heads, past,
             config.hidden_size // config.num_attention_heads)
    generator = torch.Generator().manual_seed(SEED)
    keys, values = (torch.randn(shape, generator=generator) for _ in range(2))
    return _CachedLM(module.model), (ids[:, -1:], keys, values)


def _llama_prefill(small: bool):
    module, inputs = _llama(small)
    return _Prefill(module.model), inputs


def _roberta(small: bool):
    kw = (dict(num_hidden_layers=2, hidden_size=64, intermediate_size=256,
               num_attention_heads=4, vocab_size=1000) if small else {})
    config = tf.RobertaConfig(**kw)
    ids = token_ids(config.vocab_size, 1, 77)
    return _Text(tf.RobertaModel(config, add_pooling_layer=False), "last_hidden_state"), (
        ids, torch.ones_like(ids))


def _distilbert(small: bool):
    kw = dict(n_layers=2, dim=64, hidden_dim=256, n_heads=4, vocab_size=1000) if small else {}
    config = tf.DistilBertConfig(**kw)
    ids = token_ids(config.vocab_size, 1, 50)
    return _Text(tf.DistilBertModel(config), "last_hidden_state"), (ids, torch.ones_like(ids))


def _t5(small: bool):
    kw = (dict(num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, d_kv=16, num_heads=4,
               vocab_size=1000) if small else
          dict(num_layers=6, num_decoder_layers=6, d_model=512, d_ff=2048, d_kv=64, num_heads=8))
    config = tf.T5Config(**kw)
    return _Seq2Seq(tf.T5ForConditionalGeneration(config)), (
        token_ids(config.vocab_size, 1, 61), token_ids(config.vocab_size, 1, 13))


def _vit(small: bool):
    kw = (dict(num_hidden_layers=2, hidden_size=64, intermediate_size=256,
               num_attention_heads=4, image_size=56, patch_size=8) if small else {})
    config = tf.ViTConfig(**kw)
    return Field(tf.ViTModel(config, add_pooling_layer=False), "last_hidden_state"), (
        _image(config.image_size),)


def _clip_vision(small: bool):
    kw = (dict(num_hidden_layers=2, hidden_size=64, intermediate_size=256,
               num_attention_heads=4, image_size=56, patch_size=8) if small else
          dict(image_size=224, patch_size=32))
    config = tf.CLIPVisionConfig(**kw)
    return Field(tf.CLIPVisionModel(config), "pooler_output"), (_image(config.image_size),)


def _swin(small: bool):
    kw = (dict(embed_dim=32, depths=[2, 2], num_heads=[2, 4], image_size=56, window_size=7)
          if small else {})
    config = tf.SwinConfig(**kw)
    return Field(tf.SwinModel(config), "pooler_output"), (_image(config.image_size),)


def _whisper_encoder(small: bool):
    kw = (dict(encoder_layers=2, d_model=64, encoder_ffn_dim=256, encoder_attention_heads=4,
               decoder_attention_heads=4, max_source_positions=75) if small else
          dict(encoder_layers=4, d_model=384, encoder_ffn_dim=1536, encoder_attention_heads=6,
               decoder_attention_heads=6))  # whisper-tiny's encoder: 1500 frames
    config = tf.WhisperConfig(**kw)
    frames = 2 * config.max_source_positions
    features = torch.randn(1, config.num_mel_bins, frames,
                           generator=torch.Generator().manual_seed(SEED))
    return Field(tf.WhisperModel(config).encoder, "last_hidden_state"), (features,)


def _regnet(small: bool):
    kw = (dict(hidden_sizes=[24, 56], depths=[1, 2], groups_width=8, embedding_size=16)
          if small else dict(hidden_sizes=[48, 104, 208, 440], depths=[1, 3, 6, 6],
                             groups_width=8, embedding_size=32))
    config = tf.RegNetConfig(layer_type="y", num_labels=1000, **kw)  # "y": squeeze-excite
    return Field(tf.RegNetForImageClassification(config), "logits"), (_image(64 if small else 224),)


def _efficientnet(small: bool):
    kw = (dict(width_coefficient=0.25, depth_coefficient=0.3, image_size=64, hidden_dim=320)
          if small else dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224,
                             hidden_dim=1280))  # EfficientNet-B0
    config = tf.EfficientNetConfig(num_labels=1000, **kw)
    return Field(tf.EfficientNetForImageClassification(config), "logits"), (
        _image(config.image_size),)


def _convnext(small: bool):
    kw = dict(hidden_sizes=[24, 48], depths=[1, 2], num_stages=2) if small else {}
    config = tf.ConvNextConfig(num_labels=1000, **kw)
    return Field(tf.ConvNextForImageClassification(config), "logits"), (
        _image(64 if small else 224),)


ARCHITECTURES = {
    "gpt2": _gpt2, "llama": _llama, "llama-prefill": _llama_prefill,
    "llama-decode": _llama_decode, "roberta": _roberta, "distilbert": _distilbert, "t5": _t5,
    "vit": _vit, "clip-vision": _clip_vision, "swin": _swin, "whisper-encoder": _whisper_encoder,
    "regnet": _regnet, "efficientnet": _efficientnet, "convnext": _convnext,
}


def build(name: str, small: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The architecture ``name`` at full size or small, and its example inputs; convnets'
    BatchNorms calibrated on those inputs."""
    torch.manual_seed(SEED)
    module, inputs = ARCHITECTURES[name](small)
    calibrate_batch_norms(module.eval(), inputs)
    return module, inputs
