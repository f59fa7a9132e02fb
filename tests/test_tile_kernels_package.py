"""``torch_ascend_moe.tile_kernels`` has TileKernels' module layout and public names (v1 @ 36d9e45 and the Ascend
era's), so ``import tile_kernels`` code finds everything it imports; importing under upstream's name works."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest
import torch

import torch_ascend_moe.tile_kernels as tk

NAMES = {
    "moe": "topk_gate topk_sum_and_topk_group_idx top2_sum_gate normalize_weight aux_fi group_count "
    "inplace_unique_group_indices mask_indices_by_tp get_fused_mapping expand_to_fused expand_to_fused_with_sf "
    "reduce_fused moe_topk_gate moe_topk_gate_forward moe_topk_gate_backward",
    "quant": "per_token_cast per_token_cast_with_sf_only per_token_cast_with_precomputed_sf per_block_cast "
    "per_block_cast_with_sf_only per_block_cast_with_precomputed_sf per_channel_cast per_channel_cast_fused "
    "per_channel_cast_and_transpose per_block_cast_lossless cast_back per_token_cast_back "
    "swiglu_forward_and_per_token_cast swiglu_forward_and_per_channel_cast_and_transpose "
    "swiglu_backward_and_per_token_cast unpack_from_e2m1fn_x2 swiglu_forward swiglu_backward norm_forward "
    "norm_forward_and_per_token_cast norm_backward",
    "transpose": "transpose batched_transpose",
    "engram": "engram_hash fused_weight engram_gate_fwd engram_gate_bwd grad_w_reduce",
    "transform": "apply_rotary",
    "modeling.mhc": "expand_from_embedding mhc_pre mhc_head",
    "modeling.mhc.ops": "expand_to_mhc mhc_pre_norm_fn mhc_pre_split_mixes sinkhorn_normalize mhc_pre_apply_mix "
    "mhc_post mhc_post_fwd mhc_post_bwd mhc_head_compute_mix mhc_pre_big_fuse mhc_multilayer_recompute",
    "modeling.engram": "engram_gate EngramGateFn",
    "torch": "cast cast_back cast_to_e5m6 cast_back_from_e5m6 expand_to_fused expand_to_fused_with_sf reduce_fused "
    "swiglu_forward swiglu_backward stable_topk topk_sum_and_topk_group_idx top2_sum_gate "
    "inplace_unique_group_indices aux_fi group_count mask_indices_by_tp normalize_weight per_channel_cast_fused "
    "moe_topk_gate_forward moe_topk_gate_backward norm_forward_ref norm_backward_ref rotary_embedding_ref "
    "get_mapping_from_psum",
    "torch.mhc": "expand_to_mhc_ref mhc_head_compute_mix_ref mhc_post_ref mhc_pre_apply_mix_ref mhc_pre_norm_fn_ref "
    "mhc_pre_split_mixes_ref sinkhorn_normalize_ref",
    "torch.engram": "make_offsets engram_hash_ref engram_gate_ref",
    "testing": "clear_unused_sf bench numeric generator quant",
    "testing.numeric": "assert_equal calc_diff check_bias count_bytes",
    "testing.generator": "generate_num_tokens generate_hidden_sizes generate_num_sms generate_moe_params "
    "generate_topk_idx generate_rand_float generate_e5m6_inputs",
    "config": "set_num_sms get_num_sms get_device_num_sms get_max_smem_per_sm set_token_alignment "
    "get_token_alignment is_ascend",
    "utils": "align ceil_div is_power_of_two",
    "quant.types": "QuantTensor",
}


def test_public_names():
    for module, names in NAMES.items():
        mod = importlib.import_module(f"{tk.__name__}.{module}")
        missing = [n for n in names.split() if not hasattr(mod, n)]
        assert not missing, f"tile_kernels.{module} lacks {missing}"
    assert callable(tk.set_num_sms) and tk.mhc is not None


@pytest.fixture
def as_upstream(monkeypatch):
    """``tk`` importable as ``tile_kernels`` within the test, and as before afterwards: importing ``tile_kernels.x``
    makes a second module and sets ``tk.x`` to it, so a later test patching ``tk.x`` (``tk.config.is_ascend``) would
    patch the copy while our code reads the original."""
    saved, before = dict(vars(tk)), set(sys.modules)
    monkeypatch.setitem(sys.modules, "tile_kernels", tk)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("tile_kernels."):
            del sys.modules[name]
    for key in set(vars(tk)) - set(saved):
        delattr(tk, key)
    for key, value in saved.items():
        setattr(tk, key, value)


def test_importable_under_upstreams_name(as_upstream):
    for info in pkgutil.walk_packages(tk.__path__, "tile_kernels."):
        importlib.import_module(info.name.replace("tile_kernels.", tk.__name__ + ".", 1))
    from tile_kernels.modeling.mhc.ops.post import mhc_post  # noqa: F401  (a submodule path upstream's tests use)
    from tile_kernels.torch.mhc import mhc_post_ref  # noqa: F401


# Every module of TileKernels @ 36d9e45 (tile_kernels/**/*.py): callers import kernels by module path (SGLang:
# ``tile_kernels.moe.top2_sum_gate_kernel``; upstream's benchmark plugin, loaded by its tests' conftest:
# ``tile_kernels.testing.bench.make_param_key``).
UPSTREAM_MODULES = """
config engram engram.engram_fused_weight_kernel engram.engram_gate_kernel engram.engram_grad_w_reduce_kernel
engram.engram_hash_kernel mhc mhc.expand_kernel mhc.head_compute_mix_kernel mhc.multilayer_recompute_kernel
mhc.norm_fn_kernel mhc.post_kernel mhc.pre_apply_mix_kernel mhc.pre_big_fuse_kernel mhc.pre_split_mixes_kernel
mhc.sinkhorn_kernel modeling modeling.engram modeling.engram.engram_gate modeling.mhc modeling.mhc.functional
modeling.mhc.ops modeling.mhc.ops.expand modeling.mhc.ops.head_compute_mix modeling.mhc.ops.multilayer_recompute
modeling.mhc.ops.norm_fn modeling.mhc.ops.post modeling.mhc.ops.pre_apply_mix modeling.mhc.ops.pre_big_fuse
modeling.mhc.ops.pre_split_mixes modeling.mhc.ops.sinkhorn moe moe.aux_fi_kernel moe.common moe.expand_to_fused_kernel
moe.get_fused_mapping_kernel moe.group_count_kernel moe.inplace_unique_group_indices_kernel
moe.mask_indices_by_tp_kernel moe.normalize_weight_kernel moe.reduce_fused_kernel moe.scoring moe.top2_sum_gate_kernel
moe.topk_gate_kernel moe.topk_sum_and_topk_group_idx_kernel quant quant.cast_back_e5m6_kernel quant.cast_back_kernel
quant.common quant.per_block_cast_kernel quant.per_block_cast_lossless_kernel
quant.per_channel_cast_and_transpose_kernel quant.per_channel_cast_fused_kernel quant.per_channel_cast_kernel
quant.per_token_cast_kernel quant.per_token_cast_to_e5m6_kernel quant.swiglu_backward_and_per_token_cast_kernel
quant.swiglu_forward_and_per_channel_cast_and_transpose_kernel quant.swiglu_forward_and_per_token_cast_kernel
quant.types testing testing.bench testing.generator testing.numeric testing.quant torch torch.cast torch.cast_e5m6
torch.engram torch.expand_to_fused torch.mhc torch.moe torch.per_channel_cast_fused torch.reduce_fused torch.swiglu
torch.topk transpose transpose.batched_transpose_kernel utils
""".split()


def test_every_upstream_module_path_imports(as_upstream):
    """Each of upstream's module paths imports under its name; a kernel module holds its functions (the same
    objects as the package's); a reference submodule named as its function (``torch.cast``, ``torch.reduce_fused``)
    leaves the function, not the module, on ``tile_kernels.torch``, as upstream's package does."""
    for name in UPSTREAM_MODULES:
        importlib.import_module(f"tile_kernels.{name}")
    import tile_kernels
    from tile_kernels.moe.top2_sum_gate_kernel import top2_sum_gate
    from tile_kernels.quant.per_token_cast_kernel import per_token_cast

    ours = {m: sys.modules[f"{tk.__name__}.{m}"] for m in ("moe", "quant")}  # not the copies made under the alias
    assert top2_sum_gate is ours["moe"].top2_sum_gate and per_token_cast is ours["quant"].per_token_cast
    for name in "cast cast_back cast_to_e5m6 expand_to_fused reduce_fused swiglu_forward stable_topk aux_fi".split():
        assert callable(getattr(tile_kernels.torch, name)), name
    for name in NAMES["torch.mhc"].split():  # upstream's torch/__init__ binds the mHC references too
        assert callable(getattr(tile_kernels.torch, name)), name
    from tile_kernels.testing.bench import make_param_key

    params = {"num_tokens": 64, "hidden": 7168, "use_packed_ue8m0": True, "sf": None, "fmt": "e4m3"}
    assert make_param_key(params) == "num_tokens=   64,hidden=7168,ue8m0=1,fmt=e4m3"


# The Ascend-era fork's (Butterfingrz/TileKernels @ 828cc15) kernel modules and the test helpers its tests import.
ASCEND_ERA = {
    "moe.moe_topk_gate_forward_kernel": "moe_topk_gate moe_topk_gate_forward",
    "moe.moe_topk_gate_backward_kernel": "moe_topk_gate_backward",
    "quant.norm_forward_kernel": "norm_forward norm_forward_and_per_token_cast",
    "quant.norm_backward_kernel": "norm_backward",
    "quant.swiglu_forward_kernel": "swiglu_forward swiglu_forward_and_per_token_cast",
    "quant.swiglu_backward_kernel": "swiglu_backward swiglu_backward_and_per_token_cast",
    "transform.rope_kernel": "apply_rotary",
    "torch.norm": "norm_forward_ref norm_backward_ref",
    "torch.rope": "rotary_embedding_ref",
    "torch.topk": "sqrt_softplus_ref moe_topk_gate_forward moe_topk_gate_backward",
    "torch.swiglu": "get_mapping_from_psum",
    "rand": "randn randn_like set_seed",
    "rand.seed": "reserve_seed set_seed",
    "testing.moe": "construct_logits",
    "testing.generator": "get_test_level is_precompile generate_samples generate_cast_config generate_psum_layout",
    "config": "get_device set_pdl get_pdl use_deterministic_algorithms get_deterministic_algorithms get_num_vec_cores "
    "get_num_ai_cores get_num_cube_cores reset_runtime_config",
    "utils": "str_to_dtype dtype_to_str next_power_of_two",
    "testing.bench": "get_cast_params",
}


def test_ascend_era_paths_and_test_helpers(as_upstream, monkeypatch):
    """The fork's module paths import under upstream's name with its names; its tests' helpers run on a CPU-only
    machine (``get_device()`` is the CPU there, ``generate_num_sms(level)`` stays >= 1) and take both generations'
    call forms."""
    for module, names in ASCEND_ERA.items():
        mod = importlib.import_module(f"tile_kernels.{module}")
        missing = [n for n in names.split() if not hasattr(mod, n)]
        assert not missing, f"tile_kernels.{module} lacks {missing}"
    import tile_kernels
    from tile_kernels.testing import generator as gen

    assert tile_kernels.config.get_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    assert tile_kernels.rand.randn(2, 3).shape == (2, 3) and tile_kernels.rand.randn((4,)).shape == (4,)
    assert callable(tile_kernels.set_token_alignment) and tile_kernels.utils.str_to_dtype("e2m1") == torch.int8
    monkeypatch.delenv("TK_FULL_TEST", raising=False)
    monkeypatch.delenv("TK_TEST_LEVEL", raising=False)
    assert gen.get_test_level() == 1
    assert gen.generate_num_tokens() == [4001, 8001] and gen.generate_num_tokens(128, is_benchmark=True) == [4096, 8064]
    assert gen.generate_num_tokens(0, backward_only=True) == [8001] and gen.generate_num_tokens(2) == [0, 1, 512, 8001]
    assert gen.generate_num_tokens(1, alignment=64) == [512, 8064] == gen.generate_num_tokens(level=1, alignment=64)
    assert all(n >= 1 for n in gen.generate_num_sms(2)) and gen.generate_num_sms(0) == [gen.get_device_num_sms()]
    assert len(list(gen.generate_moe_params(0))) == 2 and len(list(gen.generate_moe_params(True))) == 12
    assert list(gen.generate_moe_params(is_benchmark=False)) == list(gen.generate_moe_params())  # v1's keyword
    monkeypatch.setenv("TK_FULL_TEST", "1")
    assert len(list(gen.generate_moe_params(is_benchmark=False))) == len(list(gen.generate_moe_params(True))) + 1
    monkeypatch.delenv("TK_FULL_TEST")
    assert list(gen.generate_samples(1, a=[1, 2, 3], b=[0])) == [{"a": 1, "b": 0}, {"a": 2, "b": 0}, {"a": 3, "b": 0}]
    mask, psum = gen.generate_psum_layout(
        {"num_send_tokens": 50, "num_experts": 4, "num_topk": 3, "num_ep_ranks": 2, "alignment": 16}
    )
    start, valid = 0, 0
    for end in psum.tolist():  # each expert's block: its rows from start, then padding to a multiple of 16
        assert bool(mask[start:end].all()) and not bool(mask[end : start + -(-(end - start) // 16) * 16].any())
        valid, start = valid + end - start, start + -(-(end - start) // 16) * 16
    assert start == mask.shape[0] and valid == int(mask.sum()) > 0
    params = {"num_tokens": 7, "num_padded_tokens": 2, "num_seqs": 2, "num_routed_experts": 16, "num_topk": 4}
    logits = tile_kernels.testing.moe.construct_logits(params, {"bias": None, "image_token_mask": None})
    best = torch.topk(tile_kernels.torch.topk.sqrt_softplus_ref(logits), 5).values
    assert logits.shape == (18, 16) and bool((best[:, 3] - best[:, 4] > 1e-6).all())
    empty = torch.zeros(0, 2, dtype=torch.int32)  # 0 tokens (level 2): packed scales of no row
    assert tile_kernels.testing.clear_unused_sf(empty, 256, 32).shape == (0, 8)


def test_reference_names_take_upstreams_keywords():
    from torch_ascend_moe.tile_kernels.mhc.norm_fn_kernel import round_to_tf32

    scores = torch.rand(5, 4, 8, generator=torch.Generator().manual_seed(0))
    got = tk.torch.topk_sum_and_topk_group_idx(scores, num_group_sum_topk=2, num_topk_groups=3)
    assert torch.equal(got, tk.moe.topk_sum_and_topk_group_idx(scores, num_topk_sum=2, num_topk_groups=3))
    x = torch.tensor([1.0, 1.0 + 2.0**-11, -3.0])
    assert round_to_tf32(x).view(torch.int32).tolist() == (x.view(torch.int32) + 0x1000).tolist()


def test_settings_are_shared_by_every_copy_of_config(as_upstream):
    """Importing under upstream's name may create a second ``config`` module; both read the same settings."""
    copy = importlib.import_module("tile_kernels.config")
    try:
        copy.set_token_alignment(64)
        assert tk.config.get_token_alignment() == 64
        copy.set_num_sms(1)
        assert tk.config.get_num_sms() == 1
    finally:
        copy.set_token_alignment(128)
        tk.config._state.NUM_SMS.clear()
