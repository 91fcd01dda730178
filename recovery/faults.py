"""Errors a rank can recover from in place, and how to tell them from the ones it cannot.

A :class:`DeviceError` raised inside a training step (by the user, by a test, by
``tftctl inject --fault uce``) is *recoverable*: the rank does not die; the trainer pauses
every rank at the step boundary and copies a healthy replica's state into the faulty one
(docs/recovery.md, "In-place recovery"). On CUDA, torch reports uncorrectable memory
errors as a ``RuntimeError`` (``torch.AcceleratorError`` in recent versions) whose text
names the CUDA error; :func:`is_recoverable_device_error` maps those by name.
Any other exception is a bug in the step and still ends the rank.
"""

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
