"""Factories for the GPU checks of `benchmarks/gpu.sh checks`: transformers models at their
real configs (random init) whose CUDA builds crashed or failed on the H100."""
import torch
from transformers import (
    BeitConfig,
    BeitModel,
    SegformerConfig,
    SegformerForSemanticSegmentation,
    Wav2Vec2Config,
    Wav2Vec2Model,
)


def wav2vec2():
    torch.manual_seed(0)
    return Wav2Vec2Model(Wav2Vec2Config()).eval(), (torch.randn(1, 16000),)


def segformer():
    torch.manual_seed(0)
    model = SegformerForSemanticSegmentation(SegformerConfig()).eval()
    return model, (torch.randn(1, 3, 512, 512),)


def beit():
    torch.manual_seed(0)
    return BeitModel(BeitConfig()).eval(), (torch.randn(1, 3, 224, 224),)
