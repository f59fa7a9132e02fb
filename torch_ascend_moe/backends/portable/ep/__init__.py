"""The ep family's kernels: expert-parallel dispatch / combine on ``torch.distributed`` (gloo on CPU, NCCL on
CUDA, HCCL on Ascend), device-generic Python: registered on CPU here, on CUDA / NPU with the portable kernels.
One module per stage, read top to bottom:

    layout        where each token goes: per rank / node / expert counts, the token-by-rank mask
      │
    dispatch      rows to the ranks owning their experts (+ a metadata row each); the cached dispatch replays it
      │   route   a dispatch's handle as splits and sizes, checked to pair up on every rank
    expand        (optional) one row per (row, local expert) slot, expert-major, aligned: a grouped GEMM's input
      │
    [experts]
      │
    combine       each token's copies back, summed in FP32 with up to two biases, rounded once

    low_latency   the decode path: dispatch / combine through static per-expert buffers, no host sync

Beside them: ``header`` (what every rank's call must agree on, before rows move), ``outputs`` (placeholders for
absent outputs). Below them, knowing no op: ``distributed.agreement`` (the header exchange),
``distributed.transport`` (the all-to-all of rows), ``distributed.payload`` (rows as bytes), ``distributed.waits``.

Every rank ``all_gather``s one fixed-length header (the op, its shapes, dtypes, options, local validation result
and, for a compact dispatch, its send counts) before moving data, so a mismatch between ranks, different ops, or
a bad argument on one rank raises a clear error on every rank instead of a hang. Every collective waits at most
``timeout_s``: a rank that never arrives produces an error on the others.

While a CUDA graph is being captured, the static ops (``num_worst_tokens`` dispatch, combine / cached dispatch of
its handle, low-latency dispatch / combine) skip the header and make no host sync: equal splits, scatters into a
spare row instead of boolean masks, device-side asserts instead of raised errors.

Receive order (DeepEP V1's): source-rank-major, then ascending source token index, identical on every backend.
Combine adds biases first, then each source rank's copies in ascending rank order, in FP32 (FP64 for FP64 rows),
and rounds once.
"""

from torch_ascend_moe._registry import import_families

import_families(__name__, __path__)
