"""int8 weight-only quantization: the fast target on CPUs without AVX512-BF16.

There, bf16 matrix products are emulated, compute-bound at any batch size, so a forward over n
tokens costs nearly n times one token and speculation cannot pay (benchmarks/README.md, engine-
int8-1.5b). PyTorch's int8-weight kernel (`_weight_int8pack_mm`, the one torchao uses on CPU) reads
half the bytes and scales better with rows. Its activation stays in the model's dtype and each
output row has its own scale, so a row's result does not depend on the other rows in the batch:
verifying k tokens at once gives what k single steps would.
"""

from __future__ import annotations

import torch
from torch import nn


class Int8WeightLinear(nn.Module):
    """y = x @ (weight_int8 * scale)^T + bias, with one symmetric scale per output row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # [out]
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).to(torch.int8))  # [out, in]
        self.register_buffer("scale", scale.to(linear.weight.dtype))  # [out]
        self.bias = linear.bias  # [out] or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]"""
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scale)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias


def quantize_int8_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of model (output head included) by an Int8WeightLinear, in place."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8WeightLinear(child))
    return model
