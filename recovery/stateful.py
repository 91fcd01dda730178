"""What a checkpoint sees of the objects it saves besides the model: two methods, as
torch's own ``torch.distributed.checkpoint.stateful.Stateful``. This module imports nothing
of the project.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Stateful"]


@runtime_checkable
class Stateful(Protocol):
    """An object whose state a checkpoint can hold and put back; ``state_dict()`` must return
    only tensors and plain data (a checkpoint loads with ``torch.load(weights_only=True)``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...
