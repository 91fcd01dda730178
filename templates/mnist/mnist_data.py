"""MNIST for the template: the standard idx files, or a deterministic MNIST-shaped stand-in.

``DATA_PATH`` names a directory holding ``train-images-idx3-ubyte`` and
``train-labels-idx1-ubyte`` (each optionally gzipped, ``.gz``), as in MindSpore's
``MNIST_Data/train``. Without it the template trains on :func:`synthetic_mnist`, so that
it runs anywhere, offline, with the same shapes and the same code path.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = ["IMAGES_FILE", "LABELS_FILE", "read_idx", "load_mnist", "SyntheticImages", "synthetic_mnist",
           "load_dataset"]

IMAGES_FILE = "train-images-idx3-ubyte"
LABELS_FILE = "train-labels-idx1-ubyte"
_UBYTE = 0x08
_SIDE = 28
_CLASSES = 10
_NOISE_SEED = 20240601


def _open(path: Path) -> bytes:
    if path.exists():
        return path.read_bytes()
    gz = path.with_name(path.name + ".gz")
    if gz.exists():
        return gzip.decompress(gz.read_bytes())
    raise FileNotFoundError(f"neither {path} nor {gz} exists")


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an idx file of unsigned bytes (or its ``.gz``) into an array of its shape.

    Raises:
        FileNotFoundError: neither the file nor its ``.gz`` exists.
        ValueError: the header is not an idx ubyte header, or the data is short or long.
    """
    path = Path(path)
    raw = _open(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an idx file (bad magic number)")
    if raw[2] != _UBYTE:
        raise ValueError(f"{path} holds idx type 0x{raw[2]:02x}; only unsigned bytes (0x08) are supported")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path} is truncated in its header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise ValueError(f"{path} holds {len(raw) - header} data bytes, its header says {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_mnist(directory: str | os.PathLike[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The training images (N, 28, 28) uint8 and labels (N,) int64 of an MNIST directory.

    Raises:
        ValueError: the two files do not fit together or are not MNIST-shaped.
    """
    directory = Path(directory)
    images = read_idx(directory / IMAGES_FILE)
    labels = read_idx(directory / LABELS_FILE)
    if images.ndim != 3 or images.shape[1:] != (_SIDE, _SIDE) or labels.ndim != 1:
        raise ValueError(f"{directory}: images {images.shape} and labels {labels.shape} are not MNIST-shaped")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{directory}: {images.shape[0]} images but {labels.shape[0]} labels")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


class SyntheticImages:
    """The images of the synthetic set, each one made when it is indexed.

    Building a 60 000-sample set up front took about 1 s, and a relaunched rank paid it
    while its peers waited for it; here an image is its class's pattern plus noise that is
    a pure function of (image index, pixel), so a batch costs what its 32 images cost.
    Index it like a tensor of shape (N, 28, 28): ``images[indices]`` gives uint8 images.
    """

    def __init__(self, patterns: torch.Tensor, labels: torch.Tensor) -> None:
        self._patterns = patterns
        self._labels = labels
        self.shape = torch.Size((len(labels), _SIDE, _SIDE))
        self.dtype = torch.uint8

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, indices: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
        index = torch.as_tensor(indices, dtype=torch.int64)
        flat = index.reshape(-1)
        if flat.numel() and not (0 <= int(flat.min()) and int(flat.max()) < len(self)):
            raise IndexError(f"index out of range for {len(self)} synthetic images")
        noise = torch.from_numpy(_pixel_noise(flat.numpy()))
        images = (self._patterns[self._labels[flat]] + noise).clamp(0, 255).to(torch.uint8)
        return images.reshape(*index.shape, _SIDE, _SIDE)


def _pixel_noise(indices: np.ndarray) -> np.ndarray:
    """Noise in [-255, 255] for every pixel of the images ``indices``: splitmix64 of the
    pixel's number in the set, so each image's noise is fixed whatever batch it is in."""
    pixels = _SIDE * _SIDE
    counters = (indices.astype(np.uint64)[:, None] * np.uint64(pixels)
                + np.arange(pixels, dtype=np.uint64) + np.uint64(_NOISE_SEED))
    with np.errstate(over="ignore"):
        mixed = counters * np.uint64(0x9E3779B97F4A7C15)
        mixed = (mixed ^ (mixed >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        mixed = (mixed ^ (mixed >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed ^= mixed >> np.uint64(31)
    noise = (mixed % np.uint64(511)).astype(np.int16) - 255
    return noise.reshape(len(indices), _SIDE, _SIDE)


def synthetic_mnist(size: int) -> tuple[SyntheticImages, torch.Tensor]:
    """A deterministic, learnable MNIST-shaped set: noisy copies of ten fixed 28x28 patterns.

    The same ``size`` always gives the same bytes, whatever the training seed. The labels
    are a tensor; the images are made when indexed (:class:`SyntheticImages`).
    """
    generator = torch.Generator().manual_seed(20240601)
    patterns = torch.randint(0, 256, (_CLASSES, _SIDE, _SIDE), generator=generator, dtype=torch.int16)
    labels = torch.randint(0, _CLASSES, (size,), generator=generator)
    return SyntheticImages(patterns, labels), labels


def load_dataset(data_path: str | None,
                 synthetic_size: int) -> tuple[torch.Tensor | SyntheticImages, torch.Tensor]:
    """MNIST from ``data_path`` when it is set, else the synthetic set of ``synthetic_size``."""
    if data_path:
        return load_mnist(data_path)
    return synthetic_mnist(synthetic_size)
