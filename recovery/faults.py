"""Errors a rank can recover from in place (docs/recovery.md, "In-place recovery"), and how to
tell them from the ones it cannot: torch reports CUDA's uncorrectable errors only as a
``RuntimeError`` whose text names them, so they are matched by text."""

from __future__ import annotations

__all__ = ["DeviceError", "RECOVERABLE_CUDA_ERRORS", "is_recoverable_device_error"]


class DeviceError(RuntimeError):
    """A device fault the rank survives: its state is lost, its process is not."""


RECOVERABLE_CUDA_ERRORS = (
    # cudaErrorECCUncorrectable (214): an uncorrectable ECC error in device memory.
    "uncorrectable ECC error encountered",
    # cudaErrorNvlinkUncorrectable (220): an uncorrectable NVLink error.
    "uncorrectable NVLink error",
)
"""The texts of the CUDA errors (as torch prints them) treated as :class:`DeviceError`."""


def is_recoverable_device_error(error: BaseException) -> bool:
    """True for a :class:`DeviceError`, or a torch error carrying a recoverable CUDA error."""
    if isinstance(error, DeviceError):
        return True
    return isinstance(error, RuntimeError) and any(text in str(error) for text in RECOVERABLE_CUDA_ERRORS)
