"""Every integer argument of every op with a CPU kernel (the ep family's on a one-rank gloo group) is
bounded before any arithmetic (issue 14.3): the C++ kernels compute sizes in wrapping int64 (``-fwrapv``),
so an unchecked ``alignment=2**62+1`` or a negative count corrupted results silently. A huge or negative
value must raise a ValueError naming the op and the argument, with the same words in the eager kernel, the
portable kernel and the fake."""

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests._families import family_specs
from torch_ascend_moe.backends.portable import moe_routing as portable_routing

_SPECS = [s for specs in family_specs().values() for s in specs]
_BAD = (2**62 + 1, 2**63 - 1, 2**31, -1, -(2**63))


def _int_arguments(spec):
    """(position, name, is_list) of the schema's int, int? and int[] arguments."""
    for i, arg in enumerate(spec.op._schema.arguments):
        kind = str(arg.type)
        # ScalarType arguments are ints in the schema's type system too.
        if kind in ("int", "Optional[int]", "List[int]") and not arg.name.endswith("dtype"):
            yield i, arg.name, kind == "List[int]"


def _cases():
    for spec in _SPECS:
        for i, name, is_list in _int_arguments(spec):
            entries = (0, 1) if is_list else (None,)
            # A fill value is data written into an int32-sized output, not a size: any int32 is valid (-1 too).
            bads = [b for b in _BAD if not -(2**31) <= b < 2**31] if name.endswith("_fill_value") else _BAD
            for entry in entries:
                for bad in bads:
                    label = f"{spec.name}-{name}{'' if entry is None else f'[{entry}]'}={bad}"
                    yield pytest.param(spec, i, name, entry, bad, id=label)


def _error(fn) -> str:
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize("spec,position,name,entry,bad", list(_cases()))
def test_integer_argument_bounded(spec, position, name, entry, bad):
    sample = spec.sample_inputs("cpu", spec.dtypes[-1], small=True)[0]
    args = list(sample.args)
    if entry is None:
        args[position] = bad
    else:
        args[position] = list(args[position])
        args[position][entry] = bad

    def fake_call():
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            spec.op(*(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args))

    eager = _error(lambda: spec.op(*args))
    assert re.search(rf"{spec.name}: argument '{name}' value", eager), eager
    assert _error(fake_call) == eager
    if spec.portable is not None:
        assert _error(lambda: spec.portable(*args, **spec.portable_variants[0])) == eager


def test_moe_permute_rows_fit_int32():
    """The issue's case: each alignment is valid alone, but the output's rows would not fit in int32."""
    x, idx = torch.randn(4, 8), torch.tensor([[0, 1], [1, 0], [0, 1], [1, 1]])
    for fn in (torch.ops.ascend_moe.moe_permute, portable_routing.moe_permute):
        with pytest.raises(ValueError, match=r"moe_permute: argument 'alignment' value: .* fit in int32"):
            fn(x, idx, 2**31 - 1, 2**31 - 1)


def test_ep_combine_reduce_num_tokens():
    """The C++ helper behind the ep combine sizes its buckets by num_tokens."""
    rows, dest = torch.randn(3, 4), torch.tensor([0, 1, -1])
    for bad in (-1, 2**62 + 1):
        with pytest.raises(ValueError, match=r"ep_combine_reduce: argument 'num_tokens' value"):
            torch.ops.ascend_moe_kernels.ep_combine_reduce([rows], dest, bad, None, None)
