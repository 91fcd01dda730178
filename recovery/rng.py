"""Capture and restore the random number generators a training step may draw from, as tensors
and plain values only, so that a checkpoint holding them loads with ``weights_only=True``."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["GlobalRngState"]


class GlobalRngState:
    """The process's global generators as a stateful object that a checkpoint saves.

    Hand one to :class:`recovery.ckpt.checkpoint.CheckpointSaver` (``rng=GlobalRngState()``).
    """

    def state_dict(self) -> dict[str, Any]:
        """The states of python's ``random``, numpy's global RNG, torch's CPU and CUDA RNGs."""
        py_version, py_internal, py_gauss = random.getstate()
        np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
        return {
            "python": {
                "version": py_version,
                "state": torch.from_numpy(np.array(py_internal, dtype=np.int64)),
                "gauss": py_gauss,
            },
            "numpy": {
                "kind": np_kind,
                "keys": torch.from_numpy(np_keys.astype(np.int64)),
                "pos": int(np_pos),
                "has_gauss": int(np_has_gauss),
                "gauss": float(np_gauss),
            },
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned; CUDA states only where this process sees
        CUDA, so that a GPU checkpoint still resumes on a CPU-only machine."""
        py = state_dict["python"]
        random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
        npy = state_dict["numpy"]
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["gauss"]))
        torch.set_rng_state(state_dict["torch"])
        if state_dict["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
