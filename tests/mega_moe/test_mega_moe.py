"""mega_moe beyond the harness: bitwise equality with the unfused pipeline of our separate ops (upstream's
test; with and without fused shared experts), gradients against autograd through that pipeline, compile
fullgraph forward+backward, FLOPs, and expert parallelism on 2 gloo ranks against one process."""

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed.mega_moe_bodies import ep_worker
from tests.mega_moe.specs import samples, unfused
from torch_ascend_moe import mega_moe


@pytest.mark.parametrize("case", range(4))
def test_bitwise_equal_to_unfused_pipeline(case):
    args = samples("cpu", torch.bfloat16)[case].args
    *tensors, _, clamp = args
    idx, l1 = tensors[2], tensors[4]
    y, counts = torch.ops.ascend_moe.mega_moe(*args)
    expected = unfused(*tensors, activation_clamp=clamp)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert counts.tolist() == [int((idx == e).sum()) for e in range(l1.shape[0])]


def test_shared_experts_are_added_in_the_combine():
    """Fused shared experts == the routed-only op plus a dense SwiGLU MLP (up to the one rounding)."""
    from torch_ascend_moe.testing import calc_diff

    *tensors, _, clamp = samples("cpu", torch.bfloat16)[1].args
    x, idx, w, l1, l2, sl1, sl2 = (tensors[i] for i in (0, 2, 3, 4, 6, 8, 10))
    assert sl1 is not None
    routed, _ = mega_moe(x, idx, w, l1, l2, activation_clamp=clamp)
    fused, _ = mega_moe(x, idx, w, l1, l2, activation_clamp=clamp, shared_l1_weights=sl1, shared_l2_weights=sl2)
    gate, up = (x.double() @ sl1.double().T).chunk(2, dim=-1)
    gate, up = gate.clamp(max=clamp), up.clamp(-clamp, clamp)
    dense = (torch.nn.functional.silu(gate) * up) @ sl2.double().T
    assert calc_diff(fused, routed.double() + dense) < 1e-5
    assert calc_diff(fused, routed) > 1e-2  # the shared term is not negligible here


def test_gradients_match_the_unfused_pipeline():
    *tensors, _, clamp = samples("cpu", torch.bfloat16)[1].args
    positions = (0, 3, 4, 6, 8, 10)  # x, topk_weights, l1, l2, shared l1, shared l2
    leaves, twins = list(tensors), list(tensors)
    for i in positions:
        leaves[i], twins[i] = tensors[i].clone().requires_grad_(), tensors[i].clone().requires_grad_()
    c = torch.randn(tensors[0].shape).bfloat16()
    y, _ = torch.ops.ascend_moe.mega_moe(*leaves, None, clamp)
    (y.float() * c).sum().backward()
    ref = unfused(*twins, activation_clamp=clamp)
    (ref.float() * c).sum().backward()
    for i in positions:
        assert torch.equal(leaves[i].grad, twins[i].grad), i


def test_flop_count_includes_the_shared_experts():
    from torch.utils.flop_counter import FlopCounterMode

    *tensors, _, clamp = samples("cpu", torch.bfloat16)[1].args
    (t, h), (k, inter), shared = tensors[0].shape, (tensors[2].shape[1], tensors[4].shape[1] // 2), tensors[8]
    with FlopCounterMode(display=False) as counter:
        torch.ops.ascend_moe.mega_moe(*tensors, None, clamp)
    assert counter.get_total_flops() == 6 * t * k * h * inter + 6 * t * h * (shared.shape[0] // 2)


def test_compile_fullgraph_forward_backward():
    from torch._dynamo.testing import CompileCounterWithBackend

    x, _, idx, w, l1, _, l2, *_, clamp = samples("cpu", torch.bfloat16)[0].args

    def f(x, l1, l2):
        return mega_moe(x, idx, w, l1, l2, activation_clamp=clamp)[0].float().square().sum()

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    inputs = [t.clone().requires_grad_() for t in (x, l1, l2)]
    twins = [t.clone().requires_grad_() for t in (x, l1, l2)]
    compiled(*inputs).backward()
    f(*twins).backward()
    assert counter.frame_count == 1
    for a, b in zip(inputs, twins):
        torch.testing.assert_close(a.grad, b.grad)


def test_expert_parallel_matches_single_process(tmp_path):
    mp.spawn(ep_worker, args=(2, str(tmp_path / "store")), nprocs=2, join=True)


def test_nn_megamoe_matches_moe():
    from torch_ascend_moe.nn import MegaMoE, MoE
    from torch_ascend_moe.testing import calc_diff

    torch.manual_seed(0)
    config = dict(num_shared_experts=1, score_func="sigmoid", use_expert_bias=True, num_groups=2, topk_groups=1)
    moe = MoE(64, 32, 4, 2, dtype=torch.bfloat16, **config)
    mega = MegaMoE(64, 32, 4, 2, dtype=torch.bfloat16, **config)
    mega.load_state_dict(moe.state_dict())
    assert set(mega._fused_shared()) == {"shared_l1_weights", "shared_l2_weights"}  # shared experts in the op
    x = torch.randn(3, 5, 64).bfloat16()
    assert calc_diff(mega(x), moe(x)) < 1e-5  # MegaMoE rounds the activation to BF16 after the routing weight
    x = x.requires_grad_()
    mega(x).float().sum().backward()
    assert x.grad is not None and mega.experts.gate_up_proj.grad is not None
    assert (
        mega.shared_experts.gate_proj.weight.grad is not None and mega.shared_experts.down_proj.weight.grad is not None
    )


def test_nn_megamoe_keeps_the_shared_gate_and_up_in_one_buffer():
    """The shared experts' gate and up weights are views of one [2I, H] buffer (the op's shared_l1_weights): a
    forward without autograd passes that buffer (no per-call concatenation), with the same bits as the concatenated
    weights a recorded forward passes; the buffer survives load_state_dict and dtype conversions; parameters that
    no longer share it (assigned ones) are concatenated."""
    from torch_ascend_moe.nn import MegaMoE
    from torch_ascend_moe.nn.moe import _following_rows

    torch.manual_seed(4)
    mega = MegaMoE(64, 32, 4, 2, num_shared_experts=1)  # FP32 parameters, converted below
    gate, up = mega.shared_experts.gate_proj.weight, mega.shared_experts.up_proj.weight
    assert _following_rows(gate, up) is not None and len(list(mega.parameters())) == 6
    mega.load_state_dict({k: torch.randn_like(v) for k, v in mega.state_dict().items()})
    mega = mega.to(torch.bfloat16)
    gate, up = mega.shared_experts.gate_proj.weight, mega.shared_experts.up_proj.weight
    assert gate.dtype == torch.bfloat16 and _following_rows(gate, up) is not None
    with torch.no_grad():
        joined = mega._fused_shared()["shared_l1_weights"]
        assert joined.data_ptr() == gate.data_ptr() and torch.equal(joined, torch.cat([gate, up]))
    x = torch.randn(5, 64).bfloat16()
    with torch.no_grad():
        y = mega(x)
    recorded = mega(x)  # parameters require grad: torch.cat, recorded by autograd
    assert recorded.grad_fn is not None and torch.equal(y, recorded)
    mega.load_state_dict(mega.state_dict() | {"shared_experts.up_proj.weight": up.detach() * 2}, assign=True)
    assert _following_rows(mega.shared_experts.gate_proj.weight, mega.shared_experts.up_proj.weight) is None
    with torch.no_grad():
        assert not torch.equal(mega(x), y)  # the new up weights, concatenated


def test_shared_row_is_the_first_term_after_zero():
    """The local combine adds the shared experts' row to zero first, as ep_combine's bias: a -0.0 shared value with
    nothing routed (or only -0.0 rows) gives +0.0, as the concatenated [y_rows; shared] sum does."""
    from torch_ascend_moe.backends.portable.mega_moe import _combine_local
    from torch_ascend_moe.ops.moe_routing import moe_unpermute

    y_rows = torch.tensor([[-0.0, 1.0, -0.0], [2.0, -0.0, float("nan")]]).bfloat16()
    row_map = torch.tensor([[-1, -1], [0, -1], [1, 0]], dtype=torch.int32)
    shared = torch.tensor([[-0.0, -0.0, 3.0], [-0.0, 5.0, -0.0], [float("nan"), -0.0, 1.0]]).bfloat16()
    rows = torch.arange(3, dtype=torch.int32).unsqueeze(1) + 2
    expected = moe_unpermute(torch.cat([y_rows, shared]), torch.cat([rows, row_map], dim=1))
    got = _combine_local(y_rows, row_map, shared.clone())
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert got[0, 0].item() == 0 and not got[0, 0].signbit()


def test_nn_megamoe_fp8_serves_the_ops_block_scaled_mode():
    """``MegaMoE(fp8=True)``: the op's SM90 FP8 mode on the module's BF16 parameters quantized per 128x128 block
    (once, remade when a parameter changes), tokens per 1x128; shared experts beside it; as accurate as
    ``MoE(fp8=True)`` against the BF16 module; inference only, with clear errors."""
    from torch_ascend_moe.nn import MegaMoE, MoE
    from torch_ascend_moe.ops.mega_moe import mega_moe
    from torch_ascend_moe.ops.quant import quantize_fp8
    from torch_ascend_moe.testing import calc_diff

    torch.manual_seed(2)
    bf16 = MoE(256, 128, 4, 2, num_shared_experts=1, dtype=torch.bfloat16)
    moe = MoE(256, 128, 4, 2, num_shared_experts=1, fp8=True, dtype=torch.bfloat16)
    mega = MegaMoE(256, 128, 4, 2, num_shared_experts=1, fp8=True, dtype=torch.bfloat16)
    for m in (moe, mega):
        m.load_state_dict(bf16.state_dict())
    assert set(mega.state_dict()) == set(bf16.state_dict())  # the FP8 copy is not state
    x = torch.randn(3, 7, 256).bfloat16()
    with torch.no_grad():
        y, reference, y_moe = mega(x), bf16(x), moe(x)
        tokens = x.reshape(-1, 256)
        idx, weights, _ = mega.gate(tokens)
        quantized = []
        for w in (mega.experts.gate_up_proj, mega.experts.down_proj):
            q, sf = quantize_fp8(w.reshape(-1, w.shape[-1]), (128, 128), use_ue8m0=False)
            quantized += [q.view(w.shape), sf.view(w.shape[0], w.shape[1] // 128, w.shape[2] // 128)]
        x_q, x_sf = quantize_fp8(tokens, (1, 128), use_ue8m0=False)
        routed, _ = mega_moe(
            x_q, idx, weights.float(), quantized[0], quantized[2], x_sf=x_sf, l1_sf=quantized[1], l2_sf=quantized[3]
        )
    expected = (routed + mega.shared_experts(tokens)).view(x.shape)
    assert torch.equal(y, expected.detach())
    assert calc_diff(y, reference) < 2e-3 and calc_diff(y_moe, reference) < 2e-3
    cached = mega._fp8_weights
    with torch.no_grad():
        mega(x)
        assert mega._fp8_weights is cached  # the same parameters: no new quantization
        mega.experts.down_proj.mul_(2)  # an optimizer step, a load_state_dict: in place
        y2 = mega(x)
    assert mega._fp8_weights is not cached and not torch.equal(y2, y)
    with pytest.raises(RuntimeError, match="MegaMoE: fp8=True serves inference"):
        mega(x)  # parameters require grad
    with pytest.raises(ValueError, match="MegaMoE: argument 'hidden_size, intermediate_size'"):
        MegaMoE(192, 128, 4, 2, fp8=True)
    with pytest.raises(ValueError, match="MegaMoE: argument 'block'"):
        MegaMoE(256, 128, 4, 2, fp8=True, block=64)


def test_nn_megamoe_fp8_compiles_to_the_same_values():
    """Under torch.compile the FP8 copy is made in the graph (no cache): the same bits as eager (no shared experts:
    Inductor fuses a BF16 MLP's elementwise steps without their roundings, for MoE too)."""
    from torch_ascend_moe.nn import MegaMoE

    torch.manual_seed(3)
    mega = MegaMoE(256, 128, 4, 2, fp8=True, dtype=torch.bfloat16).eval()
    x = torch.randn(6, 256).bfloat16()
    with torch.no_grad():
        assert torch.equal(torch.compile(mega, fullgraph=True)(x), mega(x))


def test_nn_megamoe_with_fp8_linear_shared_experts_runs_them_beside_the_op():
    from torch_ascend_moe.nn import MegaMoE, MoE, convert_to_fp8_linear
    from torch_ascend_moe.testing import calc_diff

    torch.manual_seed(1)
    moe = MoE(128, 128, 4, 2, num_shared_experts=1, dtype=torch.bfloat16)
    mega = MegaMoE(128, 128, 4, 2, num_shared_experts=1, dtype=torch.bfloat16)
    mega.load_state_dict(moe.state_dict())
    convert_to_fp8_linear(moe.shared_experts)
    convert_to_fp8_linear(mega.shared_experts)
    assert mega._fused_shared() == {}
    x = torch.randn(6, 128).bfloat16()
    assert calc_diff(mega(x), moe(x)) < 1e-5


@pytest.mark.parametrize("weights", ["fp4", "fp8"])
def test_fp8_modes_take_any_layout_of_x_and_the_weights(weights):
    """FP8 tokens column-major or sliced at an odd column, and weights stored MN-major (packed FP4 included): the
    same bits as the row-major call (FP8 rows are permuted as byte pairs, which needs a row-major copy there; the
    grouped GEMMs read packed FP4 K-major)."""
    from torch_ascend_moe.ops.mega_moe import mega_moe

    g = torch.Generator().manual_seed(3)
    t, h, inter, e = 5, 64, 32, 2
    idx = torch.tensor([[0, 1], [1, -1], [0, 1], [1, 0], [-1, 0]])
    w = torch.rand(t, 2, generator=g)
    x_sf = torch.rand(t, h // 32, generator=g) + 0.5
    if weights == "fp4":
        l1 = torch.randint(0, 256, (e, 2 * inter, h // 2), dtype=torch.uint8, generator=g)
        l2 = torch.randint(0, 256, (e, h, inter // 2), dtype=torch.uint8, generator=g)
    else:
        l1 = torch.randn(e, 2 * inter, h, generator=g).to(torch.float8_e4m3fn)
        l2 = torch.randn(e, h, inter, generator=g).to(torch.float8_e4m3fn)
    l1_sf = torch.rand(e, 2 * inter, h // 32, generator=g) + 0.5
    l2_sf = torch.rand(e, h, inter // 32, generator=g) + 0.5
    wide = torch.randn(t, 2 * h + 1, generator=g).to(torch.float8_e4m3fn)
    x = wide[:, 1 : h + 1].contiguous()
    ref, _ = mega_moe(x, idx, w, l1, l2, x_sf=x_sf, l1_sf=l1_sf, l2_sf=l2_sf)

    def mn_major(t_):
        return t_.transpose(1, 2).contiguous().transpose(1, 2)

    for xs in (wide[:, 1 : h + 1], x.t().contiguous().t()):
        for w1, w2 in ((l1, l2), (mn_major(l1), mn_major(l2))):
            out, _ = mega_moe(xs, idx, w, w1, w2, x_sf=x_sf, l1_sf=l1_sf, l2_sf=l2_sf)
            assert torch.equal(out, ref), (xs.stride(), w1.stride())


def test_nn_megamoe_shared_experts_hooks_and_clamp():
    """A forward hook on a shared layer is honoured (the layer then runs beside the op), and ``activation_clamp``
    applies to the shared experts on both paths (fused into the op or beside it), as to the routed ones."""
    from torch_ascend_moe.nn import MegaMoE

    torch.manual_seed(0)
    m = MegaMoE(64, 32, 4, 2, num_shared_experts=1, activation_clamp=0.25, dtype=torch.bfloat16)
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        fused = m(x).float()
        handle = m.shared_experts.gate_proj.register_forward_hook(lambda mod, inp, out: out)  # an identity hook
        beside = m(x).float()
        handle.remove()
        assert (fused - beside).abs().max() <= 0.02 * fused.abs().max()  # BF16 rounding of the two paths
        calls = []
        handle = m.shared_experts.down_proj.register_forward_hook(lambda mod, inp, out: calls.append(1) or out * 0)
        routed_only = m(x).float()
        handle.remove()
        m.shared_experts = None
        assert calls == [1] and torch.equal(routed_only, m(x).float())
