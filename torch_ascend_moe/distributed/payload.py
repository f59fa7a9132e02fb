"""Rows as bytes: what every transport moves. A ``[rows, ...]`` tensor of any dtype (FP8 included) travels as
``[rows, bytes per row]`` uint8; these helpers view, gather (with an index, ``-1`` for a zero padding row), place
and split such rows without host syncs, and give CPU receive buffers pages that are already faulted in. No
collective and no op name here."""

from __future__ import annotations

import itertools
import threading

import torch

from torch_ascend_moe.distributed import capture


def row_bytes(t: torch.Tensor) -> int:
    """Bytes per row of ``[rows, ...]``."""
    width = t.element_size()
    for d in t.shape[1:]:
        width *= d
    return width


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``[rows, ...]`` as ``[rows, bytes per row]`` uint8."""
    width = row_bytes(t)
    if t.numel() == 0:  # empty tensors count as contiguous whatever their strides, and may not be viewable
        return torch.empty(t.shape[0], width, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], width)


def offsets(splits, rows: int, r: int) -> list[int]:
    """Where each rank's rows start (and, last, the total): ``splits`` summed up; None: ``rows`` split equally."""
    return list(itertools.accumulate([rows // r] * r if splits is None else splits, initial=0))


def gather_rows(rows, index, begin: int, end: int, padded: bool, out=None) -> torch.Tensor:
    """Rows ``begin:end`` of what is sent (``rows[index]``, or ``rows`` without an index) as bytes, into ``out``
    (uint8 ``[end - begin, row bytes]``) if given."""
    src = as_bytes(rows)
    if index is None:
        return src[begin:end] if out is None else out.copy_(src[begin:end])
    idx = index[begin:end]
    if out is None:
        out = new_rows(src, end - begin, src.shape[1])
    if not src.shape[0]:  # nothing to take from: only padding can be asked for
        return out.zero_()
    # uint8 rows: CPU index_select copies whole rows of bytes (int64 words take a per-element path, 5x slower).
    torch.index_select(src, 0, idx.clamp(min=0) if padded else idx, out=out)
    if padded:  # zero the padding rows through 8-byte words when the width allows (a byte-wise fill is 2x slower)
        words = out.view(torch.int64) if out.shape[1] % 8 == 0 and out.shape[1] else out
        words.masked_fill_((idx < 0).unsqueeze(1), 0)
    return out


def take_rows(rows: torch.Tensor, index: torch.Tensor, padded: bool) -> torch.Tensor:
    """``rows[index]`` (any dtype); with ``padded``, -1 entries give zero rows. No host sync."""
    out = gather_rows(rows, index, 0, index.shape[0], padded)
    return out.view(rows.dtype).view(index.shape[0], *rows.shape[1:])


def place_rows(rows: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """``out[index[i]] = rows[i]`` into ``n`` zero rows; -1 entries are dropped. No host sync (they land in a
    spare row)."""
    b = as_bytes(rows)
    width = b.shape[1]
    # 8-byte words when the width allows: CPU index_copy_ of byte rows goes element by element.
    word = torch.int64 if width % 8 == 0 else torch.uint8
    buf = b.new_zeros(n + 1, width)
    if rows.shape[0]:
        buf.view(word).index_copy_(0, torch.where(index >= 0, index, n), b.view(word))
    return buf[:n].view(rows.dtype).view(n, *rows.shape[1:])


def pad8(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Payload parts padded with zero bytes to a multiple of 8 bytes per row."""
    width = sum(p.shape[1] for p in parts)
    pad = (-width) % 8
    return parts + [parts[0].new_zeros(parts[0].shape[0], pad)] if pad else parts


def join(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # one part: its own bytes, no copy


def split(payload: torch.Tensor, widths: list[int]) -> list[torch.Tensor]:
    if widths and widths[0] == payload.shape[1]:
        return [payload]  # one part: no copy
    out, start = [], 0
    for w in widths:
        out.append(payload[:, start : start + w].clone(memory_format=torch.contiguous_format))
        start += w
    return out


# glibc maps blocks of 32 MiB or more fresh, and smaller ones come from a heap whose top it trims back to the kernel
# once more than twice its (dynamic) mmap threshold lies free: a dispatch's 2 MB receive buffer was 244 page faults
# per call at T=256 (435 at T=1024), more time than moving its rows.
_REUSE_MIN_BYTES = 256 << 10
_REUSE_KEEP = 4  # storages kept for reuse (a step's dispatch and combine outputs): resident while unused
_kept: list[torch.UntypedStorage] = []
_kept_lock = threading.Lock()


def new_rows(like: torch.Tensor, rows: int, *shape: int) -> torch.Tensor:
    """``like.new_empty(rows, *shape)``. On CPU a block of 256 KiB or more takes the memory of an earlier block
    that no tensor references any more: a fresh block is pages faulted in and zeroed on first touch, which costs
    more than filling them (35 ms for 48 MiB on the 2-core CI machine, 3x the copy; the CUDA caching allocator
    avoids the same cost there)."""
    nbytes = like.element_size() * rows
    for d in shape:
        nbytes *= d
    if nbytes < _REUSE_MIN_BYTES or like.device.type != "cpu" or not capture.host_readable(like):
        return like.new_empty(rows, *shape)
    with _kept_lock:
        for storage in _kept:
            # Use count 1: only this list holds the storage (a tensor or view of it anywhere holds another).
            if nbytes <= storage.nbytes() <= 2 * nbytes and torch._C._storage_Use_Count(storage._cdata) == 1:
                _kept.remove(storage)
                _kept.append(storage)
                return like.new_empty(0).set_(storage, 0, (rows, *shape))
        out = like.new_empty(rows, *shape)
        _kept.append(out.untyped_storage())
        del _kept[:-_REUSE_KEEP]
        return out
