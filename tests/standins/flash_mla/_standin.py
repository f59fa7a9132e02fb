"""Control surface of the CPU stand-in for FlashMLA G2 (see the package docstring): ``configure(arch=9)`` (the SM major
of the imitated GPU: 9 (SM90a), 10 (SM100f), anything else refused as upstream refuses it), the call log ``CALLS`` /
``reset()``, and ``Panic`` (what the real kernel would trap on or compute as garbage, where upstream raises
nothing)."""

from __future__ import annotations

__all__ = ["CALLS", "Panic", "configure", "reset"]

CALLS: list = []


class Panic(RuntimeError):
    """The real kernel would not raise here: it would trap on the device or compute garbage."""


class _State:
    arch = 9


STATE = _State()


def configure(arch: int = 9) -> None:
    STATE.arch = arch


def reset() -> None:
    CALLS.clear()
