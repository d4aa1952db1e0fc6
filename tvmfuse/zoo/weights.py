"""Random weights at a trained network's scale: BatchNorms with statistics (so folding one is never
a no-op) and convolutions whose activations neither vanish nor explode, so that a wrong build
cannot pass verification on an output that is (nearly) constant."""

from __future__ import annotations

import torch
from torch import nn


def randomize_norm_stats(module: nn.Module) -> None:
    """Random running statistics and affine terms for every BatchNorm (the zoo's tiny models,
    ResNet-50, MobileNetV2)."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)


def calibrate_batch_norms(module: nn.Module, inputs) -> None:
    """Give a convnet's weights a trained network's scale: convs variance-preserving (Kaiming),
    every BatchNorm the statistics of its input, then random affine terms (so folding it is never
    a no-op). With transformers' init (std 0.02) and unit running variance EfficientNet's
    activations vanish: its logits are all zero after 6 blocks, and any build would verify."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for conv in (m for m in module.modules() if isinstance(m, nn.Conv2d)):
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
    batch = [torch.cat([t, torch.randn_like(t) if t.is_floating_point() else t]) for t in inputs]
    with torch.no_grad():
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average over the calibration batch
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0.0, 0.1)
            bn.train()
        module(*batch)
    for bn in norms:
        bn.eval()


def kaiming_with_norm_stats(model: nn.Module) -> nn.Module:
    """Convs variance-preserving and BatchNorms with random statistics, without a calibration
    pass (the zoo's ResNet-18 and MobileViT): the logits do not vanish."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight)
        if isinstance(module, nn.BatchNorm2d):
            module.running_var.uniform_(0.5, 2.0)
            module.running_mean.normal_(0.0, 0.1)
            module.weight.data.uniform_(0.5, 1.5)
    return model.eval()
