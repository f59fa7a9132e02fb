// One parallel region per call, tasks taken one at a time (issue 51).
//
// at::parallel_for splits its range statically: each thread gets an equal share up front. When another process
// keeps a core busy, the thread that shares that core runs at half speed or later, and the call waits for its whole
// share. Here each thread takes the next task when it is free, so a slowed thread holds up at most the task it has
// taken, and the other threads finish the rest. Callers make tasks small enough for balance (a few per thread) and
// large enough to amortise the shared counter (tens of microseconds each).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

namespace ascend_moe {

// Multiply-adds below which a second thread costs more than it saves: waking a thread and the region's closing
// barrier take microseconds on an idle machine and up to a scheduler slice on a busy one. Measured on bf16_gemm's
// panel path, 2 threads over 1 on an idle 2-core EPYC (median of 400 calls): 1.41x the time at 2^18 (16x128x128),
// 1.11x at 2^20 (16x256x256), 0.79x at 2^21 (32x256x256), 0.62-0.73x from 2^22 on. Two threads from 2^21.
constexpr int64_t kMinWorkPerThread = int64_t{1} << 20;

// How many threads `work` is worth: one per kMinWorkPerThread of it, at least one.
inline int64_t threads_for(int64_t work, int64_t per_thread = kMinWorkPerThread) {
  return std::max<int64_t>(1, work / per_thread);
}

// FP32 values of B a panel task converts (or decodes) and multiplies: the block stays in L2/L3 across its SGEMM.
constexpr int64_t kPanelElements = int64_t{1} << 20;

// Multiply-adds of a panel task at least: its fixed costs (taking the task, narrowing, converting B's block, the
// SGEMM call: ~10 us) stay a small share. Without it a call of four 32x128x128 experts ran 32 tasks of 16 columns
// (450 us, against 110 us in 4 tasks).
constexpr int64_t kMinTaskWork = int64_t{1} << 18;

// Columns per panel task for an M x K A and an N x K B whose GEMM is `share` of the call's blocked work: at most
// kPanelElements FP32 values of B, at least 16 (a multiple of 16), narrow enough that the call as a whole gives
// every thread about four tasks, each job in proportion to its work (a thread slowed by another process then holds
// up a quarter of its share, not all of it; an expert with many rows is split more), and wide enough for
// kMinTaskWork. The gemm and fp8_gemm workers' rule.
inline int64_t panel_columns(int64_t N, int64_t K, int64_t M, double share, int64_t threads) {
  const int64_t cache_cols = kPanelElements / std::max<int64_t>(K, 1);
  const int64_t blocks = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(4.0 * threads * share)));
  const int64_t balance_cols = (N + blocks - 1) / blocks;
  const int64_t work_cols = (kMinTaskWork + std::max<int64_t>(M * K, 1) - 1) / std::max<int64_t>(M * K, 1);
  const int64_t cols = std::min(cache_cols, std::max(balance_cols, work_cols));
  return std::clamp<int64_t>((cols + 15) / 16 * 16, 16, std::max<int64_t>(N, 16));
}

// Columns of B per streaming (few-row) task: about 2^17 values of B, enough to amortise taking a task (~100 us of
// decoding), small enough to balance two to many cores.
inline int64_t streaming_columns(int64_t K) {
  return std::max<int64_t>(16, (int64_t{1} << 17) / std::max<int64_t>(K, 1));
}

// Runs task(i) for every i in [0, n) over at most `max_threads` intra-op threads (one thread: inline, no parallel
// region). Inside another parallel region the tasks run inline on the calling thread: never a nested region.
template <typename F>
void parallel_tasks(int64_t n, int64_t max_threads, const F& task) {
  if (n <= 0) return;
  const int64_t workers = at::in_parallel_region() ? 1 : std::min<int64_t>({n, max_threads, at::get_num_threads()});
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) task(i);
    return;
  }
  std::atomic<int64_t> next{0};
  // Tasks call ATen ops: the other threads take the caller's dispatch state (below autograd inside a kernel, grad
  // mode, inference mode), or an op on a tensor that requires grad would go through autograd there.
  const at::ThreadLocalState state;
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    at::ThreadLocalStateGuard guard(state);
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed))
      task(i);
  });
}

// MKL's per-thread thread count (weak: the extension loads without MKL; libtorch_cpu exports it where PyTorch
// links MKL statically). The by-value C entry point: the lower-case mkl_set_num_threads_local beside it is the
// Fortran one, which takes a pointer.
extern "C" __attribute__((weak)) int MKL_Set_Num_Threads_Local(int nthreads);

// A task's SGEMM on its own thread. Inside parallel_tasks' region MKL already runs sequentially; in the one-thread
// case (no region) it would open one of its own, which the work was judged too small for.
struct SequentialMkl {
  int previous = 0;
  SequentialMkl() {
    if (MKL_Set_Num_Threads_Local != nullptr) previous = MKL_Set_Num_Threads_Local(1);
  }
  ~SequentialMkl() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous);  // 0: the global count again
  }
  SequentialMkl(const SequentialMkl&) = delete;
  SequentialMkl& operator=(const SequentialMkl&) = delete;
};

}  // namespace ascend_moe
