"""A digest of a model's parameters, to compare two runs bit for bit."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["params_sha256"]


def params_sha256(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name and bytes, in registration order."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
