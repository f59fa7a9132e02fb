// CPU kernel of the topk_select family: DeepSelect's top-k (specs/tilekernels_deepselect.md §11), the
// selection behind DeepSeek Sparse Attention's indexer (BF16 logits, k <= 4096 of up to millions of
// positions) and the sampler (FP32 logits over a ~128K vocabulary).
//
// Per row: the k largest of input[row, :end[row]] by an order-preserving integer key of the value's bits
// (so +0.0 ranks above -0.0 and equal bit patterns go to the lower column: one valid choice of DeepSelect's
// arbitrary ties, the same on every path of this op). The selection is a radix select on 8-bit digits of
// the key, most significant first: a histogram of the row's top digit fixes the threshold bucket, the
// bucket's columns become the candidates of the next digit, and so on until the k-th key is known (or a
// whole bucket is taken); a last pass in column order writes the selected columns. The row is read three
// times and nothing of size V is sorted (torch.topk copies the row into (value, index) pairs and
// partitions them). Rows are split over threads; a row's result never depends on the thread count.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tasks.h"
#include "topk_select_checks.h"

namespace ascend_moe {
namespace {

// DeepSelect's marker of a row that held NaN (abort_when_nan_found=False): every index of the row.
constexpr int64_t kNanMarker = 0x3F3F3F3F;
constexpr int64_t kWorkPerTask = 1 << 15;  // elements a thread takes at least (small rows share a thread)

template <typename scalar_t>
using key_of = std::conditional_t<sizeof(scalar_t) == 2, uint16_t,
                                  std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint64_t>>;

// Order-preserving key: the bits with the sign bit set for non-negative values and all bits flipped for
// negative ones, so unsigned order is the float order (-0.0 just below +0.0; NaN outside [-inf, +inf]).
template <typename scalar_t>
inline key_of<scalar_t> order_key(scalar_t v) {
  using K = key_of<scalar_t>;
  K u;
  std::memcpy(&u, &v, sizeof(K));
  constexpr K sign = K(1) << (8 * sizeof(K) - 1);
  return (u & sign) ? K(~u) : K(u | sign);
}

// NaN from the bits (exponent all ones, mantissa nonzero): no conversion of 16-bit types to float.
template <typename scalar_t>
inline bool is_nan(scalar_t v) {
  using K = key_of<scalar_t>;
  constexpr K magnitude = K(~K(0)) >> 1;
  const scalar_t inf = std::numeric_limits<scalar_t>::infinity();
  K u, inf_bits;
  std::memcpy(&u, &v, sizeof(K));
  std::memcpy(&inf_bits, &inf, sizeof(K));
  return (u & magnitude) > inf_bits;
}

struct RowResult {
  int64_t nan_col = -1;  // first NaN column in [0, n), -1 if none
  int64_t count = 0;     // selected columns written
};

template <typename scalar_t>
int64_t first_nan(const scalar_t* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (is_nan(x[j])) return j;
  return -1;
}

// Scratch a thread keeps between rows.
struct Scratch {
  std::vector<int64_t> pre, above, cand, next;
  std::vector<int32_t> hist;
};

constexpr int kTopBits = 11;  // the first digit: sign, exponent and (FP32) 2 mantissa bits in 2048 buckets
constexpr int64_t kSample = 1024;  // keys sampled from a long row to guess a threshold below its k-th largest

// Calls f(column) for the columns of `list` (ascending), or for [0, n) when there is no list.
template <typename F>
inline void for_each_column(const std::vector<int64_t>* list, int64_t n, F f) {
  if (list != nullptr) {
    for (int64_t c : *list) f(c);
  } else {
    for (int64_t j = 0; j < n; ++j) f(j);
  }
}

// Selects row `x` (n valid columns) into cols[0, count): ascending column order, or by key descending
// (ties to the lower column) when `sorted`.
template <typename scalar_t>
RowResult select_row(const scalar_t* x, int64_t n, int64_t topk, bool sorted, Scratch& s, int64_t* cols) {
  using K = key_of<scalar_t>;
  constexpr int kBits = 8 * sizeof(K);
  constexpr int kTopShift = kBits - kTopBits;
  constexpr int kBuckets = 1 << kTopBits;
  const K neg_inf_key = order_key(-std::numeric_limits<scalar_t>::infinity());
  RowResult r;
  auto key = [&](int64_t j) { return order_key(x[j]); };
  if (n <= topk) {
    r.nan_col = first_nan(x, n);
    if (r.nan_col >= 0) return r;
    for (int64_t j = 0; j < n; ++j) cols[j] = j;
    r.count = n;
  } else {
    // A long row with a small k (the sampler, the indexer over long contexts) is first filtered against a
    // threshold from evenly spaced samples, set a few standard deviations below where the k-th largest should
    // fall: one streaming compare per element, and the histogram passes below run over the few survivors.
    // Exact whatever the data: the survivors hold the top k whenever there are at least k of them (else the
    // whole row is used), and they stay in column order, so ties resolve as without the filter.
    const std::vector<int64_t>* pre = nullptr;
    if (n >= 16 * kSample && topk * 16 <= n) {
      std::vector<K> sample(static_cast<size_t>(kSample));
      const int64_t step = n / kSample;
      for (int64_t i = 0; i < kSample; ++i) sample[i] = key(i * step);
      const double expect = static_cast<double>(topk) * kSample / static_cast<double>(n);
      const auto rank = std::min<int64_t>(kSample - 1, static_cast<int64_t>(expect + 4.0 * std::sqrt(expect) + 8));
      std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<K>());
      const K threshold = sample[rank];
      bool negative_nan = false;  // a NaN with its sign set keys below -inf, so it never passes the threshold
      s.pre.clear();
      for (int64_t j = 0; j < n; ++j) {
        const K k = key(j);
        if (k >= threshold) s.pre.push_back(j);
        negative_nan |= k < neg_inf_key;
      }
      if (negative_nan) {
        r.nan_col = first_nan(x, n);
        return r;
      }
      if (static_cast<int64_t>(s.pre.size()) >= topk && static_cast<int64_t>(s.pre.size()) <= n / 4) pre = &s.pre;
    }
    // Pass 1: histogram of the top digit (over the whole row: two interleaved tables, so runs of equal
    // buckets, the common case for real data, do not serialize on one counter).
    s.hist.assign(2 * kBuckets, 0);
    int32_t* h0 = s.hist.data();
    int32_t* h1 = h0 + kBuckets;
    if (pre != nullptr) {
      for (int64_t c : *pre) ++h0[key(c) >> kTopShift];
    } else {
      int64_t j = 0;
      for (; j + 1 < n; j += 2) {
        ++h0[key(j) >> kTopShift];
        ++h1[key(j + 1) >> kTopShift];
      }
      if (j < n) ++h0[key(j) >> kTopShift];
      for (int b = 0; b < kBuckets; ++b) h0[b] += h1[b];
    }
    // NaN keys lie beyond ±inf's: only buckets from +inf's up or from -inf's down can hold one.
    const int pos_inf = static_cast<int>(order_key(std::numeric_limits<scalar_t>::infinity()) >> kTopShift);
    const int neg_inf = static_cast<int>(neg_inf_key >> kTopShift);
    int64_t extreme = 0;
    for (int b = 0; b <= neg_inf; ++b) extreme += h0[b];
    for (int b = pos_inf; b < kBuckets; ++b) extreme += h0[b];
    if (extreme > 0) {
      r.nan_col = first_nan(x, n);
      if (r.nan_col >= 0) return r;
    }
    int64_t need = topk;
    int d = kBuckets - 1;
    while (h0[d] < need) need -= h0[d--];
    // Pass 2: the columns above the bucket and the bucket's, each in column order.
    s.above.clear();
    s.cand.clear();
    const K top = static_cast<K>(d);
    for_each_column(pre, n, [&](int64_t j) {
      const K k = key(j) >> kTopShift;
      if (k > top)
        s.above.push_back(j);
      else if (k == top)
        s.cand.push_back(j);
    });
    if (static_cast<int64_t>(s.cand.size()) > need) {
      // Narrow the bucket 8 bits at a time until `need` of it is exactly the largest keys, ties to the lower
      // column (candidates stay in column order).
      int shift = kTopShift;
      K want = top;
      while (shift > 0 && static_cast<int64_t>(s.cand.size()) > need) {
        const int width = std::min(8, shift);
        shift -= width;
        std::array<int64_t, 256> hist{};
        for (int64_t c : s.cand) ++hist[(key(c) >> shift) & K((1 << width) - 1)];
        int dd = (1 << width) - 1;
        while (hist[dd] < need) need -= hist[dd--];
        want = static_cast<K>((want << width) | K(dd));
        s.next.clear();
        const auto split = static_cast<std::ptrdiff_t>(s.above.size());
        for (int64_t c : s.cand) {
          const K k = key(c) >> shift;
          if (k > want)
            s.above.push_back(c);
          else if (k == want)
            s.next.push_back(c);
        }
        s.cand.swap(s.next);
        std::inplace_merge(s.above.begin(), s.above.begin() + split, s.above.end());
      }
      s.cand.resize(static_cast<size_t>(need));  // equal keys (or a whole bucket): the lowest columns
    }
    int64_t* last = std::merge(s.above.begin(), s.above.end(), s.cand.begin(), s.cand.end(), cols);
    r.count = last - cols;
  }
  if (sorted) {
    std::sort(cols, cols + r.count, [&](int64_t a, int64_t b) {
      const K ka = key(a), kb = key(b);
      return ka != kb ? ka > kb : a < b;
    });
  }
  return r;
}

std::tuple<at::Tensor, at::Tensor> topk_select_cpu(const at::Tensor& input, int64_t topk,
                                                   const std::optional<at::Tensor>& end,
                                                   const std::optional<at::Tensor>& output_idx_offset, bool sorted,
                                                   std::optional<at::ScalarType> indices_dtype,
                                                   int64_t idx_oob_fill_value,
                                                   std::optional<double> value_oob_fill_value,
                                                   bool abort_when_nan_found) {
  const at::ScalarType idx_t = topk_select::topk_select_signature(input, topk, end, output_idx_offset, indices_dtype,
                                                                  idx_oob_fill_value);
  const bool int32 = idx_t == at::kInt;

  const int64_t b = input.size(0), V = input.size(1);
  const auto x = input.contiguous();
  std::vector<int64_t> ends(static_cast<size_t>(b), V);
  if (end.has_value()) {
    const auto e = end->contiguous();
    topk_select::check_end_values(e, V);
    std::copy_n(e.const_data_ptr<int32_t>(), b, ends.begin());
  }
  std::vector<int64_t> offsets(static_cast<size_t>(b), 0);
  if (output_idx_offset.has_value()) {
    const auto o = output_idx_offset->contiguous();
    std::copy_n(o.data_ptr<int32_t>(), b, offsets.begin());
  }

  auto values = at::empty({b, topk}, input.options());
  auto indices = at::empty({b, topk}, input.options().dtype(idx_t));
  // Per row: the selected columns, then its NaN column (-1 if none) and count.
  auto cols = at::empty({b, topk}, input.options().dtype(at::kLong));
  std::vector<RowResult> results(static_cast<size_t>(b));
  // One region per call, rows taken a few at a time (tasks.h): a thread slowed by another process on its core
  // holds up the rows it has taken, not half of the call (bench topk_select --busy). Each task selects its rows
  // and writes their values and indices while the rows are still in cache; the errors are raised after the
  // region, in row order, as before (a call that raises returns nothing, so what its rows wrote is never seen).
  const int64_t rows_per_task = std::max<int64_t>(1, kWorkPerTask / std::max<int64_t>(1, V));
  const int64_t tasks = (b + rows_per_task - 1) / rows_per_task;
  std::vector<Scratch> scratch(static_cast<size_t>(std::max(1, at::get_num_threads())));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "topk_select", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    int64_t* cp = cols.data_ptr<int64_t>();
    scalar_t* vp = values.data_ptr<scalar_t>();
    const scalar_t fill = static_cast<scalar_t>(value_oob_fill_value.value_or(-std::numeric_limits<double>::infinity()));
    const scalar_t nan = std::numeric_limits<scalar_t>::quiet_NaN();
    AT_DISPATCH_INDEX_TYPES(idx_t, "topk_select_indices", [&] {
      index_t* ip = indices.data_ptr<index_t>();
      parallel_tasks(tasks, tasks, [&](int64_t t) {
        Scratch& s = scratch[static_cast<size_t>(at::get_thread_num())];
        for (int64_t i = t * rows_per_task; i < std::min(b, (t + 1) * rows_per_task); ++i) {
          const RowResult r = results[i] = select_row(xp + i * V, ends[i], topk, sorted, s, cp + i * topk);
          index_t* irow = ip + i * topk;
          scalar_t* vrow = vp + i * topk;
          if (r.nan_col >= 0) {
            std::fill(irow, irow + topk, static_cast<index_t>(kNanMarker));
            std::fill(vrow, vrow + topk, nan);
            continue;
          }
          for (int64_t j = 0; j < r.count; ++j) {
            const int64_t c = cp[i * topk + j];
            irow[j] = static_cast<index_t>(c + offsets[i]);
            vrow[j] = xp[i * V + c];
          }
          std::fill(irow + r.count, irow + topk, static_cast<index_t>(idx_oob_fill_value));
          std::fill(vrow + r.count, vrow + topk, fill);
        }
      });
    });
  });

  for (int64_t i = 0; i < b && abort_when_nan_found; ++i) {
    if (results[i].nan_col >= 0) topk_select::nan_error(i, results[i].nan_col);
  }
  if (int32) {
    const int64_t* cp = cols.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      if (results[i].nan_col >= 0 || offsets[i] == 0) continue;
      for (int64_t s = 0; s < results[i].count; ++s) {
        const int64_t v = cp[i * topk + s] + offsets[i];
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
          topk_select::offset_error(cp[i * topk + s], offsets[i], i);
        }
      }
    }
  }
  return {values, indices};
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- topk_select family: DeepSelect's top-k (indexer and sampler) ----
  m.set_python_module("torch_ascend_moe.fakes.topk_select");
  // (values [b, topk] in input's dtype, indices [b, topk] int64 or int32): the topk largest of
  // input[i, :end[i]], in ascending column order (or by value descending when `sorted`), plus
  // output_idx_offset[i]; short rows are padded with the fill values (not offset); a row holding NaN raises
  // (abort_when_nan_found) or gets 0x3F3F3F3F indices and NaN values. value_oob_fill_value None is -inf.
  m.def(
      "topk_select(Tensor input, int topk, Tensor? end=None, Tensor? output_idx_offset=None, bool sorted=False, "
      "ScalarType? indices_dtype=None, int idx_oob_fill_value=2147483647, float? value_oob_fill_value=None, "
      "bool abort_when_nan_found=True) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) { m.impl("topk_select", &topk_select_cpu); }

}  // namespace ascend_moe
