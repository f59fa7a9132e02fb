// Argument validation shared by every CPU kernel. The Python twin is torch_ascend_moe/checks/__init__.py:
// both produce the same words, so an error reads the same in eager, in a fake under torch.compile,
// and in the CUDA/NPU backends. A family's own checks sit in <family>_checks.h, beside their Python twin
// torch_ascend_moe/checks/<family>.py (tests/test_validation_twins.py compares each pair).
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace ascend_moe {

// "torch.bfloat16": the Python spelling, so C++ and Python messages match.
inline std::string dtype_name(at::ScalarType t) {
  return std::string("torch.") + std::string(c10::getDtypeNames(t).first);
}

inline std::string shape_str(at::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

// Python's str() of a float (the fake prints the value that way): "nan", "-inf", "-1.0", "0.5", "1e+20".
inline std::string float_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string text(buf);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

// Python's repr() of a str (the checks print a bad string argument that way): single quotes unless the text holds
// one and no double quote, backslash escapes for the quote, backslashes and ASCII control characters. Bytes above
// ASCII pass through (printable UTF-8 text reads the same).
inline std::string str_repr(const std::string& text) {
  constexpr char kDouble = 34, kSingle = 39;  // as numbers: tests/test_validation_twins.py reads this file as text
  const char quote = text.find(kSingle) != std::string::npos && text.find(kDouble) == std::string::npos ? kDouble
                                                                                                          : kSingle;
  std::string out(1, quote);
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + quote;
}

// "<op>: argument '<arg>' <what>: expected <expected>, got <actual>"
#define AM_CHECK_ARG(cond, op, arg, what, expected, actual)                                  \
  TORCH_CHECK_VALUE((cond), op, ": argument '", arg, "' ", what, ": expected ", expected, \
                    ", got ", actual)

// Upper bound of every integer argument (alignments, block sizes, counts, lengths): layouts and lengths
// are int32, and with every argument and size below 2^31 a product or round-up of two of them stays
// inside int64 (the build wraps on overflow, so an unbounded argument corrupts results silently).
constexpr int64_t kMaxIntArg = 2147483647;

// `value` in [lo, 2^31 - 1]; lo is 0 or 1, read as "non-negative" or "positive".
inline void check_int_arg(const char* op, const char* arg, int64_t value, int64_t lo) {
  AM_CHECK_ARG(value >= lo, op, arg, "value", lo > 0 ? "a positive integer" : "a non-negative integer", value);
  AM_CHECK_ARG(value <= kMaxIntArg, op, arg, "value", "at most 2147483647 (integer arguments are int32-sized)",
               value);
}

// A recipe [gran_mn, gran_k]: two positive entries, each bounded as check_int_arg does.
inline void check_recipe(const char* op, const char* arg, at::IntArrayRef recipe) {
  AM_CHECK_ARG(recipe.size() == 2 && recipe[0] > 0 && recipe[1] > 0, op, arg, "value",
               "[gran_mn, gran_k] with positive entries", shape_str(recipe));
  AM_CHECK_ARG(recipe[0] <= kMaxIntArg && recipe[1] <= kMaxIntArg, op, arg, "value",
               "[gran_mn, gran_k] with entries at most 2147483647", shape_str(recipe));
}

// FP32 or E8M0 scales (fp8_gemm's and mqa_logits' operands): packed int32/int16 UE8M0 words are unpacked first.
inline void check_scale_dtype(const char* op, const char* sf_name, const at::Tensor& sf) {
  AM_CHECK_ARG(sf.scalar_type() == at::kFloat || sf.scalar_type() == at::kFloat8_e8m0fnu, op, sf_name, "dtype",
               "torch.float32 or torch.float8_e8m0fnu (unpack int32/int16 UE8M0 first)", dtype_name(sf.scalar_type()));
}

inline bool is_gemm_dtype(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat || t == at::kDouble;
}

constexpr const char* kGemmDtypes = "one of torch.bfloat16, torch.float16, torch.float32, torch.float64";

inline void check_rank(const char* op, const char* arg, const at::Tensor& t, int64_t rank,
                       const char* layout) {
  AM_CHECK_ARG(t.dim() == rank, op, arg, "rank", std::to_string(rank) + "-D " + layout,
               std::to_string(t.dim()) + "-D tensor of shape " + shape_str(t.sizes()));
}

inline void check_same_device(const char* op, const char* arg, const at::Tensor& t,
                              const at::Tensor& ref) {
  AM_CHECK_ARG(t.device() == ref.device(), op, arg, "device", ref.device().str() + " (same as 'a')",
               t.device().str());
}

inline void check_dim_size(const char* op, const char* arg, const at::Tensor& t, int64_t dim,
                           const std::string& what, int64_t expected, const std::string& source) {
  AM_CHECK_ARG(t.size(dim) == expected, op, arg, "size(" + std::to_string(dim) + ") (" + what + ")",
               std::to_string(expected) + " (" + source + ")", t.size(dim));
}

// Floating operands of the BF16 family: a's dtype decides, b must match it.
inline void check_operand_dtypes(const char* op, const at::Tensor& a, const at::Tensor& b) {
  AM_CHECK_ARG(is_gemm_dtype(a.scalar_type()), op, "a", "dtype", kGemmDtypes, dtype_name(a.scalar_type()));
  AM_CHECK_ARG(b.scalar_type() == a.scalar_type(), op, "b", "dtype",
               dtype_name(a.scalar_type()) + " (same as 'a')", dtype_name(b.scalar_type()));
}

// Output dtype: out_dtype if given, else c's dtype, else a's dtype; c must agree with it.
inline at::ScalarType resolve_out_dtype(const char* op, const at::Tensor& a,
                                        const std::optional<at::Tensor>& c,
                                        std::optional<at::ScalarType> out_dtype) {
  if (out_dtype.has_value()) {
    AM_CHECK_ARG(is_gemm_dtype(*out_dtype), op, "out_dtype", "value", kGemmDtypes, dtype_name(*out_dtype));
  }
  at::ScalarType resolved = out_dtype.value_or(c.has_value() ? c->scalar_type() : a.scalar_type());
  if (c.has_value()) {
    AM_CHECK_ARG(c->scalar_type() == resolved, op, "c", "dtype", dtype_name(resolved) + " (out_dtype)",
                 dtype_name(c->scalar_type()));
  }
  return resolved;
}

inline void check_accumulator(const char* op, const std::optional<at::Tensor>& c, const at::Tensor& a,
                              at::IntArrayRef out_shape) {
  if (!c.has_value()) return;
  check_same_device(op, "c", *c, a);
  AM_CHECK_ARG(c->sizes() == out_shape, op, "c", "shape", shape_str(out_shape) + " (the output shape)",
               shape_str(c->sizes()));
}

}  // namespace ascend_moe
