"""Test helpers for the MNIST template: tiny idx files, and its data module by path."""

from __future__ import annotations

import gzip
import importlib.util
import struct
from pathlib import Path
from types import ModuleType

import numpy as np

from support import REPO

TEMPLATE = REPO / "templates" / "mnist"


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> Path:
    """Write ``array`` (uint8) as an idx file; ``compress`` adds ``.gz`` to the name."""
    raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def write_mnist(directory: Path, samples: int, compress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A tiny MNIST directory; returns its images and labels."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (samples, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, samples, dtype=np.uint8)
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte", images, compress)
    write_idx(directory / "train-labels-idx1-ubyte", labels, compress)
    return images, labels


def mnist_data() -> ModuleType:
    """templates/mnist/mnist_data.py, loaded by path as the script itself sees it."""
    spec = importlib.util.spec_from_file_location("mnist_data", TEMPLATE / "mnist_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
