"""DeepGEMM-Ascend's GEMM epilogues (``deep_gemm.epilogue``) for the BF16 family.

``Identity()`` leaves ``D = A @ B^T (+ C)``; ``Alpha(alpha)`` scales the product. (The FP8-output
``FP8Quantization(sfd)`` epilogue belongs to the FP8 family.)
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Identity:
    """No epilogue: ``D = A @ B^T (+ C)``."""


@dataclasses.dataclass(frozen=True)
class Alpha:
    """``D = alpha * A @ B^T (+ C)``."""

    alpha: float


def resolve_alpha(api: str, alpha: float | None, epilogue: object | None) -> float:
    """The scale a call asks for through ``alpha=`` or an epilogue (not both)."""
    if epilogue is not None and not isinstance(epilogue, (Identity, Alpha)):
        raise TypeError(f"{api}: argument 'epilogue': expected None, Identity() or Alpha(alpha), got {epilogue!r}")
    if isinstance(epilogue, Alpha):
        if alpha is not None:
            raise ValueError(f"{api}: argument 'alpha': expected None when epilogue=Alpha(...) is given, got {alpha}")
        return float(epilogue.alpha)
    return 1.0 if alpha is None else float(alpha)
