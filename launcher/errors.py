"""The launcher's domain errors. They are caught only at the CLI boundary."""

from __future__ import annotations

__all__ = ["TftrunError", "ConfigError"]


class TftrunError(Exception):
    """Base of every error the CLIs turn into one line on stderr and an exit status."""

    exit_code = 1


class ConfigError(TftrunError):
    """Bad input: nothing has been started. Exit status 2, as for any usage error."""

    exit_code = 2

