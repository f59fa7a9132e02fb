"""TileKernels' scoring-function enum (``str()`` is the lower-case name the gate functions take)."""

from __future__ import annotations

from enum import IntEnum


class ScoringFunc(IntEnum):
    SIGMOID = 0
    SQRTSOFTPLUS = 1
    SOFTMAX = 2
    IDENTITY = 3

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def from_str(cls, label: str) -> ScoringFunc:
        try:
            return cls[label.upper()]
        except KeyError:
            raise ValueError(f"{label} is not a valid {cls.__name__}") from None
