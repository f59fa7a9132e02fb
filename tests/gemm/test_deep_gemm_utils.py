"""``deep_gemm.utils`` / ``deep_gemm.testing`` as upstream's test files import them, and the layout
helpers' strides on size-1 dims (issue 14, points 6 and 10)."""

from __future__ import annotations

import importlib
import io
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm

# Every name upstream's tests/*.py (DeepGEMM 54e2261) import or read off each module, found with an AST
# walk over `from deep_gemm... import` statements and `deep_gemm.<name>` attribute reads.
UPSTREAM_TEST_IMPORTS = {
    "": [
        "bf16_gemm_nt",
        "bf16_mega_moe",
        "cublaslt_gemm_nt",
        "einsum",
        "fp8_einsum",
        "fp8_fp4_gemm_nt",
        "fp8_fp4_mega_moe",
        "fp8_fp4_mqa_logits",
        "fp8_fp4_paged_mqa_logits",
        "fp8_gemm_nt_skip_head_mid",
        "get_num_sms",
        "get_paged_mqa_logits_metadata",
        "get_symm_buffer_for_mega_moe",
        "get_theoretical_mk_alignment_for_contiguous_layout",
        "k_grouped_bf16_gemm_tn_contiguous",
        "k_grouped_fp8_gemm_nt_contiguous",
        "k_grouped_fp8_gemm_tn_contiguous",
        "legacy",
        "m_grouped_bf16_gemm_nt_contiguous",
        "m_grouped_bf16_gemm_nt_masked",
        "m_grouped_fp8_fp4_gemm_nt_contiguous",
        "m_grouped_fp8_fp4_gemm_nt_masked",
        "set_mk_alignment_for_contiguous_layout",
        "tf32_hc_prenorm_gemm",
        "transform_sf_into_required_layout",
        "transform_weights_for_mega_moe",
    ],
    ".testing": [
        "assert_bitwise_equal",
        "bench_kineto",
        "calc_diff",
        "count_bytes",
        "get_arch_major",
        "ignore_env",
        "test_filter",
    ],
    ".utils": [
        "align",
        "cast_back_from_fp4",
        "ceil_div",
        "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
        "get_mk_alignment_for_contiguous_layout",
        "get_mn_major_tma_aligned_packed_ue8m0_tensor",
        "get_mn_major_tma_aligned_tensor",
        "get_tma_aligned_size",
        "per_block_cast_to_fp8",
        "per_channel_cast_to_fp8",
        "per_custom_dims_cast_to_fp8",
        "per_token_cast_to_fp4",
        "per_token_cast_to_fp8",
        "set_mk_alignment_for_contiguous_layout",
        "transpose_packed_fp4",
    ],
    ".utils.math": ["ceil_div", "per_block_cast_to_fp8", "per_channel_cast_to_fp8", "per_token_cast_to_fp8"],
    ".utils.dist": ["dist_print", "init_dist", "uneven_all_gather"],
}


@pytest.mark.parametrize("module", sorted(UPSTREAM_TEST_IMPORTS))
def test_upstream_test_imports_resolve(module):
    mod = importlib.import_module("torch_ascend_moe.deep_gemm" + module)
    missing = [name for name in UPSTREAM_TEST_IMPORTS[module] if not hasattr(mod, name)]
    assert not missing, f"deep_gemm{module} lacks {missing}"


def test_utils_submodules_and_star_exports():
    # Upstream: `from . import math, layout`, star-exports both, and `from .dist import init_dist, ...`.
    assert deep_gemm.utils.layout.get_mn_major_tma_aligned_tensor is deep_gemm.get_mn_major_tma_aligned_tensor
    assert deep_gemm.utils.layout.get_m_alignment_for_contiguous_layout() == 128
    assert deep_gemm.utils.math.align(5, 4) == 8
    for name in ("init_dist", "uneven_all_gather", "get_tma_aligned_size", "get_mk_alignment_for_contiguous_layout"):
        assert name in deep_gemm.utils.__all__ and name in deep_gemm.__all__
    assert deep_gemm.init_dist is deep_gemm.utils.dist.init_dist
    for name in ("bench", "bench_kineto", "suppress_stdout_stderr", "empty_suppress"):
        assert name in deep_gemm.testing.__all__
    # Upstream's testing submodules; `testing.bench` is the function there too (the star export shadows it).
    assert deep_gemm.testing.numeric.assert_bitwise_equal is deep_gemm.testing.assert_bitwise_equal
    assert deep_gemm.testing.utils.ignore_env is deep_gemm.testing.ignore_env
    assert callable(deep_gemm.testing.bench)


def test_bench_kineto_times_our_op_in_seconds():
    a = torch.randn(64, 64, dtype=torch.bfloat16)
    d = torch.empty(64, 64, dtype=torch.bfloat16)
    t = deep_gemm.testing.bench_kineto(lambda: deep_gemm.bf16_gemm_nt(a, a, d), "bf16_gemm", num_tests=3)
    assert 0 < t < 1
    both = deep_gemm.testing.bench_kineto(
        lambda: deep_gemm.bf16_gemm_nt(a, a, d),
        ("bf16_gemm", "no_such_kernel"),
        num_tests=2,
        suppress_kineto_output=True,
    )
    # a name matching nothing (upstream's kernel names on a CPU) times the whole call: upstream's tests divide by it
    assert isinstance(both, tuple) and both[0] > 0 and 0 < both[1] < 1


def test_bench_kineto_skips_under_nvidia_tools(monkeypatch):
    monkeypatch.setenv("DG_USE_NVIDIA_TOOLS", "1")
    assert deep_gemm.testing.bench_kineto(lambda: None, ("a", "b")) == (1, 1)


def test_suppress_stdout_stderr_silences_file_descriptors(capfd):
    with deep_gemm.testing.suppress_stdout_stderr():
        print("hidden")
        # The streams' own descriptors are redirected (as upstream; C/C++ prints go there too).
        os.write(sys.stderr.fileno(), b"hidden too\n")
    print("shown")
    out, err = capfd.readouterr()
    assert out == "shown\n" and "hidden" not in err
    with deep_gemm.testing.empty_suppress() as ctx:
        assert ctx is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_init_dist_and_uneven_all_gather_two_ranks(tmp_path):
    # Two real processes with gloo, the way upstream's test_mega_moe.py spawns its ranks.
    script = textwrap.dedent(
        """
        import sys, torch, torch.multiprocessing as mp
        from torch_ascend_moe.deep_gemm.utils.dist import dist_print, init_dist, uneven_all_gather

        def worker(local_rank, num_ranks):
            rank, world, group = init_dist(local_rank, num_ranks)
            assert (rank, world) == (local_rank, num_ranks)
            x = torch.full((rank + 1, 3), float(rank))
            y = uneven_all_gather(x, group=group)
            assert torch.equal(y, torch.tensor([[0.0] * 3, [1.0] * 3, [1.0] * 3]))
            z = uneven_all_gather(x.T.contiguous(), dim=1, group=group)
            assert torch.equal(z, y.T)
            dist_print(f"ok {rank}", once_in_node=True)
            torch.distributed.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(worker, args=(2,), nprocs=2)
        """
    )
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="1", RANK="0")
    env["CUDA_VISIBLE_DEVICES"] = ""
    path = tmp_path / "two_ranks.py"  # mp.spawn pickles `worker` by module, so it needs a file
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok 0"


def _pow2(shape):
    return torch.exp2(torch.randint(-3, 4, shape).float())


@pytest.mark.parametrize("shape", [(5, 1), (4, 1), (1, 1), (1, 3), (7, 3), (2, 5, 1), (2, 1, 3), (3, 1, 1), (2, 4, 1)])
def test_layout_helpers_strides_with_size_one_dims(shape):
    # Upstream allocates (align(mn, 4) * sf_k, 1, align(mn, 4)) whatever the sizes (and squeezes 2-D).
    sf = _pow2(shape)
    mn, k = shape[-2], shape[-1]
    aligned = deep_gemm.align(mn, 4)
    out = deep_gemm.get_mn_major_tma_aligned_tensor(sf)
    assert torch.equal(out, sf)
    assert out.stride() == (aligned * k, 1, aligned)[3 - sf.dim() :]
    assert deep_gemm.get_mn_major_tma_aligned_tensor(out) is out
    packed = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    pk = deep_gemm.ceil_div(k, 4)
    assert packed.shape == (*shape[:-1], pk)
    assert packed.stride() == (aligned * pk, 1, aligned)[3 - sf.dim() :]
    # transform_sf_into_required_layout validates int32 scales with upstream's check_sf_layout rule.
    groups = shape[0] if sf.dim() == 3 else None
    kept = deep_gemm.transform_sf_into_required_layout(packed, mn, k * 128, (1, 128), num_groups=groups)
    assert kept is packed


def test_transform_rejects_unit_k_stride_for_one_column():
    # A [mn, 1] int32 tensor with stride (1, 1) is not TMA-aligned upstream (stride(-1) must be align(mn, 4)).
    sf = torch.zeros(5, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="MN-major"):
        deep_gemm.transform_sf_into_required_layout(sf, 5, 128, (1, 128))


def test_bench_prints_nothing_itself():
    buf = io.StringIO()
    sys.stdout, saved = buf, sys.stdout
    try:
        t = deep_gemm.testing.bench(lambda: None, num_warmups=1, num_tests=2)
    finally:
        sys.stdout = saved
    assert t >= 0 and buf.getvalue() == ""


@pytest.mark.parametrize("ks_cpu", [None, []])
def test_k_grouped_packing_psum_without_host_sizes_has_upstreams_row_count(ks_cpu):
    # Upstream can't count rows without ks_cpu, so it allocates (S + 3G) / 4; the leading rows are the packs.
    ks, gran_k = [256, 96, 640], 32
    rows = [deep_gemm.ceil_div(k, gran_k) for k in ks]
    sf = _pow2((sum(rows), 8))
    ends, start = [], 0
    for k in ks:
        ends.append(start + k)
        start = deep_gemm.align(start + k, 32)
    layout = torch.tensor(ends, dtype=torch.int32)
    fn = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor
    out = fn(sf, layout, ks_cpu, gran_k, 32, use_psum_layout=True)
    exact = fn(sf, layout, ks, gran_k, 32, use_psum_layout=True)
    assert out.shape == ((sf.shape[0] + 3 * len(ks)) // 4, 8) and out.is_contiguous()
    assert exact.shape[0] == sum(deep_gemm.ceil_div(r, 4) for r in rows)
    assert torch.equal(out[: exact.shape[0]], exact)
