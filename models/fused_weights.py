"""Several linear layers of one input as one product: their weights and biases stacked."""
from __future__ import annotations

import torch


def stacked(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias of several nn.Linear of one input stacked along the output (one fused
    product computes them all)."""
    weight = torch.cat([lin.weight for lin in linears], 0)
    biases = [lin.bias for lin in linears]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        raise ValueError("fused linears must all have a bias or none")
    return weight, None if biases[0] is None else torch.cat(biases, 0)
