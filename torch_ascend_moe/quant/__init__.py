"""Low-precision encodings and quantizers: FP8 E4M3, FP4 E2M1 (two codes per byte), UE8M0 scales.

DeepGEMM's exact semantics (specs/deepgemm_api.md §2.2, §12). The casts (``casts``: upstream's names and
signatures, backing ``torch_ascend_moe.deep_gemm.utils``) run on the quant family's ops
(``torch.ops.ascend_moe.quantize_fp8`` / ``quantize_fp4`` / ``dequantize``: a C++ kernel on CPU, opaque to
Dynamo); ``reference`` holds their plain-torch math, the portable kernel and the reference the kernels are
tested against bit for bit. The encodings are plain torch functions (Dynamo traces and fuses them).
"""

from torch_ascend_moe.quant.encodings import (
    E2M1_VALUES,
    FP4_MAX,
    FP8_MAX,
    ceil_to_ue8m0,
    decode_e2m1,
    encode_e2m1,
    pack_e2m1,
    pack_ue8m0_to_int,
    pack_ue8m0_to_int16,
    repack_ue8m0,
    round_to_tf32,
    scales_to_float,
    unpack_e2m1,
    unpack_ue8m0_from_int,
    unpack_ue8m0_from_int16,
)

# The casts and fake quantizers run the quant family's ops: loaded on first use, so the encodings and the plain-torch
# math (``reference``) import without the op layer (the kernels below the ops use them).
_ABOVE_THE_OPS = {
    "block_cast_to_fp8": "casts",
    "cast_back_from_fp4": "casts",
    "cast_back_from_fp8": "casts",
    "dequantize_fp8": "casts",
    "per_block_cast_to_fp8": "casts",
    "per_channel_cast_to_fp8": "casts",
    "per_custom_dims_cast_to_fp8": "casts",
    "per_token_cast_to_fp4": "casts",
    "per_token_cast_to_fp8": "casts",
    "transpose_packed_fp4": "casts",
    "dequantize_rows": "straight_through",
    "fake_quantize": "straight_through",
    "quantize_rows": "straight_through",
}


def __getattr__(name: str):
    if name in _ABOVE_THE_OPS:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_ABOVE_THE_OPS[name]}"), name)
        globals()[name] = value  # later lookups find it directly
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "block_cast_to_fp8",
    "E2M1_VALUES",
    "FP4_MAX",
    "FP8_MAX",
    "cast_back_from_fp4",
    "cast_back_from_fp8",
    "ceil_to_ue8m0",
    "decode_e2m1",
    "dequantize_fp8",
    "dequantize_rows",
    "encode_e2m1",
    "fake_quantize",
    "pack_e2m1",
    "pack_ue8m0_to_int",
    "pack_ue8m0_to_int16",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "per_token_cast_to_fp8",
    "quantize_rows",
    "repack_ue8m0",
    "round_to_tf32",
    "scales_to_float",
    "transpose_packed_fp4",
    "unpack_e2m1",
    "unpack_ue8m0_from_int",
    "unpack_ue8m0_from_int16",
]
