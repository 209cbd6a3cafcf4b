"""Stand-ins for the runtime's collaborators in operator-level tests."""

from __future__ import annotations

from collections.abc import Callable


class Collect:
    """A fused aggregate's fan-out (`fjords.runtime.operators.aggregate.FanOut`) that hands
    each delivery to `deliver` and is never cut short."""

    pending = False

    def __init__(self, deliver: Callable[[list], object]) -> None:
        self.deliver = deliver

    def drain(self) -> bool:
        return True

    def settle(self) -> None:
        pass
