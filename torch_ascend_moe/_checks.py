"""Former home of the shared argument checks, now :mod:`torch_ascend_moe.checks`.

Kept as a re-export while modules owned elsewhere (backends/, quant/, distributed/, the ep family, compat
packages) still import it under this name; new code imports ``torch_ascend_moe.checks``.
"""

from torch_ascend_moe.checks import GEMM_DTYPES as GEMM_DTYPES
from torch_ascend_moe.checks import GEMM_DTYPES_TEXT as GEMM_DTYPES_TEXT
from torch_ascend_moe.checks import MAX_INT_ARG as MAX_INT_ARG
from torch_ascend_moe.checks import MAX_INT_ARG_TEXT as MAX_INT_ARG_TEXT
from torch_ascend_moe.checks import _text as _text
from torch_ascend_moe.checks import check_accumulator as check_accumulator
from torch_ascend_moe.checks import check_arg as check_arg
from torch_ascend_moe.checks import check_dim_size as check_dim_size
from torch_ascend_moe.checks import check_int_arg as check_int_arg
from torch_ascend_moe.checks import check_operand_dtypes as check_operand_dtypes
from torch_ascend_moe.checks import check_rank as check_rank
from torch_ascend_moe.checks import check_same_device as check_same_device
from torch_ascend_moe.checks import message as message
from torch_ascend_moe.checks import resolve_out_dtype as resolve_out_dtype
from torch_ascend_moe.checks import shape_str as shape_str
