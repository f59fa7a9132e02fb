// The fp8_gemm family's argument checks (fp8_gemm, fp8_bmm, fp8_einsum), and the scaled-operand checks the
// fp8_linear and grouped families build on. Twin: torch_ascend_moe/checks/fp8_gemm.py (the same checks in the same
// order, the same words; tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"

namespace ascend_moe::fp8_gemm {

constexpr const char* kGemm = "ascend_moe::fp8_gemm";
constexpr const char* kBmm = "ascend_moe::fp8_bmm";
constexpr const char* kEinsum = "ascend_moe::fp8_einsum";

// fp8_einsum's equations: each is a batched GEMM over h after permuting data and scales together.
constexpr std::array<const char*, 3> kEquations{"bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"};

// The output shape and dtype of a call.
using Signature = std::pair<std::vector<int64_t>, at::ScalarType>;

// Packed FP4 crosses the op boundary as uint8, two E2M1 codes per byte along K.
inline bool is_fp4(const at::Tensor& t) { return t.scalar_type() == at::kByte; }

// Logical K of an operand: FP4 stores two values per byte along K (the last dim).
inline int64_t logical_k(const at::Tensor& t) { return is_fp4(t) ? 2 * t.size(-1) : t.size(-1); }

inline void check_scale_shape(const char* op, const char* sf_name, const at::Tensor& sf, at::IntArrayRef expected,
                              const std::string& how) {
  AM_CHECK_ARG(sf.sizes() == expected, op, sf_name, "shape", shape_str(expected) + " " + how, shape_str(sf.sizes()));
}

// One scaled operand: data [MN, K] (or [G, MN, K] when batched), its scales and recipe.
inline void check_fp8_operand(const char* op, const char* name, const char* sf_name, const at::Tensor& x,
                              const at::Tensor& sf, at::IntArrayRef recipe, const at::Tensor& ref, bool batched) {
  const int64_t lead = batched ? 1 : 0;
  check_rank(op, name, x, 2 + lead,
             batched ? "[G, MN, K] (FP8) or [G, MN, K/2] (FP4 packed in uint8)"
                     : "[MN, K] (FP8) or [MN, K/2] (FP4 packed in uint8)");
  AM_CHECK_ARG(x.scalar_type() == at::kFloat8_e4m3fn || x.scalar_type() == at::kByte, op, name, "dtype",
               "torch.float8_e4m3fn, or torch.uint8 (packed FP4)", dtype_name(x.scalar_type()));
  if (is_fp4(x)) {
    AM_CHECK_ARG(x.stride(-1) == 1, op, name, "stride(" + std::to_string(x.dim() - 1) + ")",
                 "1 (packed FP4 is K-major)", x.stride(-1));
  }
  check_same_device(op, name, x, ref);
  check_same_device(op, sf_name, sf, ref);
  check_recipe(op, (std::string("recipe_") + name).c_str(), recipe);
  const int64_t mn = x.size(lead), k = logical_k(x), gmn = recipe[0], gk = recipe[1];
  AM_CHECK_ARG(k % gk == 0, op, name, "K", "a multiple of gran_k=" + std::to_string(gk), k);
  check_scale_dtype(op, sf_name, sf);
  std::vector<int64_t> sf_shape{(mn + gmn - 1) / gmn, k / gk};
  if (batched) sf_shape.insert(sf_shape.begin(), x.size(0));
  check_scale_shape(op, sf_name, sf, sf_shape,
                    batched ? "(G, ceil(MN / gran_mn), K / gran_k)" : "(ceil(MN / gran_mn), K / gran_k)");
}

// Operands that may meet: FP4 A needs FP4 B (FP4 x FP8 is unsupported upstream), and one logical K.
inline void check_fp8_pairing(const char* op, const at::Tensor& a, const at::Tensor& b) {
  AM_CHECK_ARG(!(is_fp4(a) && !is_fp4(b)), op, "a", "dtype",
               "FP8 when b is FP8 (FP4 x FP8 is unsupported, as upstream)", "torch.uint8 (packed FP4)");
  AM_CHECK_ARG(logical_k(b) == logical_k(a), op, "b", "K", std::to_string(logical_k(a)) + " (a's K)",
               logical_k(b));
}

// out_dtype if given, else c's dtype, else `fallback`; BF16 or FP32 only, and c must agree.
inline at::ScalarType check_scaled_out_dtype(const char* op, const std::optional<at::Tensor>& c,
                                             std::optional<at::ScalarType> out_dtype, at::ScalarType fallback) {
  if (out_dtype.has_value()) {
    AM_CHECK_ARG(*out_dtype == at::kBFloat16 || *out_dtype == at::kFloat, op, "out_dtype", "value",
                 "torch.bfloat16 or torch.float32", dtype_name(*out_dtype));
  }
  const at::ScalarType out_t = out_dtype.value_or(c.has_value() ? c->scalar_type() : fallback);
  if (c.has_value() && !out_dtype.has_value()) {  // c's dtype is the output dtype: the same two choices
    AM_CHECK_ARG(out_t == at::kBFloat16 || out_t == at::kFloat, op, "c", "dtype", "torch.bfloat16 or torch.float32",
                 dtype_name(out_t));
  }
  if (c.has_value()) {
    AM_CHECK_ARG(c->scalar_type() == out_t, op, "c", "dtype", dtype_name(out_t) + " (out_dtype)",
                 dtype_name(c->scalar_type()));
  }
  return out_t;
}

// Both operands and their pairing; returns the output dtype.
inline at::ScalarType check_fp8_pair(const char* op, const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                     const at::Tensor& sfb, const std::optional<at::Tensor>& c,
                                     at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                     std::optional<at::ScalarType> out_dtype, bool batched) {
  check_fp8_operand(op, "a", "sfa", a, sfa, recipe_a, a, batched);
  if (batched) {
    check_rank(op, "b", b, 3, "[G, MN, K] (FP8) or [G, MN, K/2] (FP4 packed in uint8)");
    check_dim_size(op, "b", b, 0, "batch", a.size(0), "a.size(0)");
  }
  check_fp8_operand(op, "b", "sfb", b, sfb, recipe_b, a, batched);
  check_fp8_pairing(op, a, b);
  return check_scaled_out_dtype(op, c, out_dtype, at::kBFloat16);
}

inline Signature fp8_gemm_signature(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                    const at::Tensor& sfb, const std::optional<at::Tensor>& c,
                                    at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                    std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = check_fp8_pair(kGemm, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype, false);
  std::vector<int64_t> shape{a.size(0), b.size(0)};
  check_accumulator(kGemm, c, a, shape);
  return {shape, dtype};
}

inline Signature fp8_bmm_signature(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                   const at::Tensor& sfb, const std::optional<at::Tensor>& c, at::IntArrayRef recipe_a,
                                   at::IntArrayRef recipe_b, std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = check_fp8_pair(kBmm, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype, true);
  std::vector<int64_t> shape{a.size(0), a.size(1), b.size(1)};
  check_accumulator(kBmm, c, a, shape);
  return {shape, dtype};
}

inline std::string supported_equations() {
  std::string s = "one of";
  for (size_t i = 0; i < kEquations.size(); ++i) s += std::string(i ? ", '" : " '") + kEquations[i] + "'";
  return s;
}

// Subscripts of a, b, out and the permutations putting each in batched-GEMM order (h, m|n, k).
struct EinsumPlan {
  std::string sa, sb, so;
  std::array<int64_t, 3> perm_a, perm_b, perm_out;
};

inline EinsumPlan einsum_plan(const std::string& equation) {
  const std::string sa = equation.substr(0, 3), sb = equation.substr(4, 3), so = equation.substr(9);
  // h batches; m is a's output letter, n b's; k is contracted.
  char m = 0, n = 0, k = 0;
  for (char l : sa) {
    if (l != 'h' && so.find(l) != std::string::npos) m = l;
    if (l != 'h' && so.find(l) == std::string::npos) k = l;
  }
  for (char l : sb) {
    if (l != 'h' && so.find(l) != std::string::npos) n = l;
  }
  const auto pos = [](const std::string& s, char l) { return static_cast<int64_t>(s.find(l)); };
  return {sa, sb, so, {pos(sa, 'h'), pos(sa, m), pos(sa, k)}, {pos(sb, 'h'), pos(sb, n), pos(sb, k)},
          {pos(so, 'h'), pos(so, m), pos(so, n)}};
}

// Scale shape of an einsum operand: its own subscripts, h kept, the output letter divided by gran_mn (rounded up),
// the contracted letter divided by gran_k.
inline std::vector<int64_t> einsum_scale_shape(const std::string& subs, const at::Tensor& x, char mn_letter,
                                               at::IntArrayRef recipe) {
  std::vector<int64_t> shape;
  for (int64_t j = 0; j < 3; ++j) {
    const int64_t size = x.size(j);
    shape.push_back(subs[j] == 'h'         ? size
                    : subs[j] == mn_letter ? (size + recipe[0] - 1) / recipe[0]
                                           : size / recipe[1]);
  }
  return shape;
}

inline Signature fp8_einsum_signature(const std::string& equation, const at::Tensor& a, const at::Tensor& sfa,
                                      const at::Tensor& b, const at::Tensor& sfb, const std::optional<at::Tensor>& c,
                                      at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                      std::optional<at::ScalarType> out_dtype) {
  AM_CHECK_ARG(std::find(kEquations.begin(), kEquations.end(), equation) != kEquations.end(), kEinsum, "equation",
               "value", supported_equations(), "'" + equation + "'");
  const EinsumPlan p = einsum_plan(equation);
  const char k = p.sa[p.perm_a[2]];
  for (const auto& [name, x, subs] : {std::tuple{"a", &a, p.sa}, std::tuple{"b", &b, p.sb}}) {
    check_rank(kEinsum, name, *x, 3, ("[" + subs + "]").c_str());
    AM_CHECK_ARG(x->scalar_type() == at::kFloat8_e4m3fn, kEinsum, name, "dtype",
                 "torch.float8_e4m3fn (fp8_einsum takes FP8 operands)", dtype_name(x->scalar_type()));
  }
  check_same_device(kEinsum, "b", b, a);
  for (int64_t j = 0; j < 3; ++j) {
    const auto i = p.sa.find(p.sb[j]);
    if (i != std::string::npos) {
      check_dim_size(kEinsum, "b", b, j, std::string("'") + p.sb[j] + "'", a.size(i),
                     "a.size(" + std::to_string(i) + ")");
    }
  }
  for (const auto& [name, sf_name, x, sf, subs, perm, recipe] :
       {std::tuple{"a", "sfa", &a, &sfa, p.sa, p.perm_a, recipe_a},
        std::tuple{"b", "sfb", &b, &sfb, p.sb, p.perm_b, recipe_b}}) {
    check_recipe(kEinsum, (std::string("recipe_") + name).c_str(), recipe);
    const int64_t kdim = static_cast<int64_t>(subs.find(k));
    const char letter = subs[perm[1]];
    AM_CHECK_ARG(x->size(kdim) % recipe[1] == 0, kEinsum, name, "size(" + std::to_string(kdim) + ") ('" + k + "')",
                 "a multiple of gran_k=" + std::to_string(recipe[1]), x->size(kdim));
    check_scale_shape(kEinsum, sf_name, *sf, einsum_scale_shape(subs, *x, letter, recipe),
                      "([" + subs + "] with '" + letter + "' / gran_mn rounded up, '" + k + "' / gran_k)");
  }
  const at::ScalarType dtype = check_fp8_pair(kEinsum, a.permute(p.perm_a), sfa.permute(p.perm_a),
                                              b.permute(p.perm_b), sfb.permute(p.perm_b), c, recipe_a, recipe_b,
                                              out_dtype, true);
  std::vector<int64_t> shape;
  for (char l : p.so) shape.push_back(p.sa.find(l) == std::string::npos ? b.size(p.sb.find(l)) : a.size(p.sa.find(l)));
  check_accumulator(kEinsum, c, a, shape);
  return {shape, dtype};
}

}  // namespace ascend_moe::fp8_gemm
