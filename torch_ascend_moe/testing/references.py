"""fp64 references: the math of each op, computed in float64 from the (exactly representable) inputs."""

from __future__ import annotations

import torch


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(torch.float64)


def gemm_reference(a, b, c=None, alpha=1.0, out_dtype=None) -> torch.Tensor:
    out = alpha * (_f64(a) @ _f64(b).T)
    return out if c is None else out + _f64(c)


def bmm_reference(a, b, c=None, alpha=1.0, out_dtype=None) -> torch.Tensor:
    out = alpha * (_f64(a) @ _f64(b).transpose(1, 2))
    return out if c is None else out + _f64(c)


def einsum_reference(equation, a, b, c=None, alpha=1.0, out_dtype=None) -> torch.Tensor:
    out = alpha * torch.einsum(equation, _f64(a), _f64(b))
    return out if c is None else out + _f64(c)
