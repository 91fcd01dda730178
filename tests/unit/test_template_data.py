"""The MNIST template's data: the idx loader (plain and .gz) and the synthetic set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from support.mnist import mnist_data, write_idx, write_mnist

data = mnist_data()


@pytest.mark.parametrize("compress", [False, True])
def test_loads_idx_files_plain_or_gzipped(tmp_path: Path, compress: bool) -> None:
    images, labels = write_mnist(tmp_path, 7, compress)
    got_images, got_labels = data.load_dataset(str(tmp_path), synthetic_size=0)
    assert got_images.dtype == torch.uint8 and got_images.shape == (7, 28, 28)
    assert np.array_equal(got_images.numpy(), images)
    assert got_labels.dtype == torch.int64 and got_labels.tolist() == labels.tolist()


def test_a_short_file_is_refused(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "x", np.zeros((4, 3), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="holds 11 data bytes, its header says 12"):
        data.read_idx(path)


def test_a_file_that_is_not_idx_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"\x1f\x8b\x08\x00junk")
    with pytest.raises(ValueError, match="bad magic number"):
        data.read_idx(tmp_path / "x")


def test_images_and_labels_must_agree(tmp_path: Path) -> None:
    write_mnist(tmp_path, 5)
    write_idx(tmp_path / data.LABELS_FILE, np.zeros(4, dtype=np.uint8))
    with pytest.raises(ValueError, match="5 images but 4 labels"):
        data.load_mnist(tmp_path)


def test_missing_files_name_both_spellings(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz"):
        data.load_mnist(tmp_path)


def test_the_synthetic_set_is_deterministic_and_mnist_shaped() -> None:
    torch.manual_seed(1)
    images, labels = data.load_dataset(None, synthetic_size=50)
    torch.manual_seed(2)
    again, again_labels = data.synthetic_mnist(50)
    everything = torch.arange(50)
    assert len(images) == 50 and images.shape == (50, 28, 28)
    assert images[everything].shape == (50, 28, 28) and images[everything].dtype == torch.uint8
    assert torch.equal(images[everything], again[everything]) and torch.equal(labels, again_labels)
    assert set(labels.tolist()) <= set(range(10))


def test_a_synthetic_image_is_the_same_in_any_batch() -> None:
    """Made on demand, each image depends on its index only, not on its batch-mates."""
    images, _ = data.synthetic_mnist(1000)
    batch = images[torch.tensor([999, 3, 500])]
    assert torch.equal(batch[1], images[3]) and torch.equal(batch[0], images[[999]][0])
    assert not torch.equal(images[3], images[500])


def test_synthetic_images_are_their_class_pattern_under_noise() -> None:
    """Learnable: the mean image of a class is far nearer its own class's mean than another's."""
    images, labels = data.synthetic_mnist(2000)
    pixels = images[torch.arange(2000)].float()
    means = torch.stack([pixels[labels == c].mean(0) for c in range(10)])
    half = torch.stack([pixels[:1000][labels[:1000] == c].mean(0) for c in range(10)])
    distances = torch.cdist(half.flatten(1), means.flatten(1))
    assert torch.equal(distances.argmin(1), torch.arange(10))


def test_indexing_past_the_synthetic_set_is_refused() -> None:
    images, _ = data.synthetic_mnist(10)
    with pytest.raises(IndexError, match="10 synthetic images"):
        images[torch.tensor([10])]
