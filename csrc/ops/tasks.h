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
#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>

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

// Whether a call's tasks may run on the calling thread alone when the other threads keep arriving late
// (LateThreads). Only for tasks that open no parallel region of their own (our kernels' column blocks): outside a
// region, an ATen or oneDNN op inside a task would open one per task.
enum class Alone { kNever, kWhenLate };

// Tasks taken one at a time still end at the region's closing barrier, which waits for every thread to arrive, even
// one that took no task. With another process on a core, the thread sharing that core starts the region up to a
// scheduler slice late: a 0.35 ms GEMV waited up to 8 ms for a thread that then found nothing left (bench gemm
// --busy, 1x4096x2048 NN: 2.9x torch.mm idle, 2.1x busy). A region where the other threads took no task and the
// calling thread waited past its own work is late. After two in a row, the next kAloneCalls calls run on the calling
// thread alone where that should take less than the late region did: the late region's own work gives the calling
// thread's time per unit of work (the caller's `work`: any measure its time is about proportional to). A call
// alone that takes half as long again as expected (plus 20 us) ends the run: the calling thread is slowed itself, it
// shares the busy core, and there the other threads take tasks. Then regions with all threads check again. On an
// idle machine the other threads take tasks, so nothing changes. Process-wide, like the busy core it detects. Every
// Alone::kWhenLate caller gives the same bits on any thread count, so the choice changes no value.
struct LateThreads {
  static constexpr int64_t kLateInARow = 2;
  static constexpr int64_t kAloneCalls = 64;
  static constexpr int64_t kSlackNs = 20000;
  std::atomic<int64_t> late_in_a_row{0};
  std::atomic<int64_t> alone_calls{0};
  std::atomic<int64_t> late_wall_ns{0};
  std::atomic<int64_t> ps_per_work{0};  // the calling thread's picoseconds per unit of work, from the late region

  // One state per kind of caller, each with its own unit of work: a GEMM's time per unit says nothing about a
  // gate's, and one kind's slow call alone must not end another's run. The busy core each detects is the same.
  enum class Units { kFewRowGemm, kGateRows, kCount };
  static LateThreads& get(Units units = Units::kFewRowGemm) {
    static LateThreads states[static_cast<int>(Units::kCount)];
    return states[static_cast<int>(units)];
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // The calling thread's expected time for `work` alone.
  int64_t expected_ns(int64_t work) const {
    return static_cast<int64_t>(static_cast<double>(work) * static_cast<double>(ps_per_work.load()) * 1e-3);
  }
  // Whether this call runs alone (taking one of the calls left): calls are left and alone it should take less than
  // the late region did (larger work pays for the wait).
  bool take_alone_call(int64_t work) {
    int64_t left = alone_calls.load(std::memory_order_relaxed);
    if (left <= 0 || expected_ns(work) > late_wall_ns.load(std::memory_order_relaxed)) return false;
    while (left > 0 && !alone_calls.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
    }
    return left > 0;
  }
  void alone_call_took(int64_t ns, int64_t work) {
    const int64_t expected = expected_ns(work);
    if (ns <= expected + expected / 2 + kSlackNs) return;
    alone_calls.store(0, std::memory_order_relaxed);
    late_in_a_row.store(0, std::memory_order_relaxed);
  }
  void region_took(int64_t wall_ns, int64_t caller_task_ns, int64_t others_tasks, int64_t work) {
    const bool late = others_tasks == 0 && wall_ns > caller_task_ns + caller_task_ns / 4;
    if (!late) {
      late_in_a_row.store(0, std::memory_order_relaxed);
      return;
    }
    if (late_in_a_row.fetch_add(1, std::memory_order_relaxed) + 1 < kLateInARow) return;
    // One late region after the run of alone calls ends starts the next run.
    late_in_a_row.store(kLateInARow - 1, std::memory_order_relaxed);
    late_wall_ns.store(wall_ns, std::memory_order_relaxed);
    ps_per_work.store(caller_task_ns * 1000 / std::max<int64_t>(work, 1), std::memory_order_relaxed);
    alone_calls.store(kAloneCalls, std::memory_order_relaxed);
  }
  void reset() {
    late_in_a_row.store(0);
    alone_calls.store(0);
    late_wall_ns.store(0);
    ps_per_work.store(0);
  }
};

// Runs task(i) for every i in [0, n) over at most `max_threads` intra-op threads (one thread: inline, no parallel
// region). Inside another parallel region the tasks run inline on the calling thread: never a nested region.
// The work of a few-row kernel's column block (M rows of A, K, w columns of B) for LateThreads: reading B dominates
// and each row of A adds about a quarter of that (this VM, 2 threads: 1x2112x7168 0.6 ms, 16 rows 2.0 ms).
inline int64_t few_rows_work(int64_t M, int64_t K, int64_t w) { return w * K * (M + 4); }

// `alone`, `work` (the call's work, in the caller's own units) and `units` (which LateThreads keeps them): see
// LateThreads.
template <typename F>
void parallel_tasks(int64_t n, int64_t max_threads, const F& task, Alone alone = Alone::kNever, int64_t work = 0,
                    LateThreads::Units units = LateThreads::Units::kFewRowGemm) {
  if (n <= 0) return;
  const int64_t workers = at::in_parallel_region() ? 1 : std::min<int64_t>({n, max_threads, at::get_num_threads()});
  // Only the callers that may run alone are timed: the others pay no clock reads.
  const bool observe = workers > 1 && alone == Alone::kWhenLate;
  LateThreads& late = LateThreads::get(units);
  const bool taken_alone = observe && late.take_alone_call(work);
  if (workers <= 1 || taken_alone) {
    const int64_t start = taken_alone ? LateThreads::now_ns() : 0;
    for (int64_t i = 0; i < n; ++i) task(i);
    if (taken_alone) late.alone_call_took(LateThreads::now_ns() - start, work);
    return;
  }
  std::atomic<int64_t> next{0}, others_tasks{0};
  int64_t caller_task_ns = 0;  // written by the calling thread only
  const std::thread::id caller = std::this_thread::get_id();
  const int64_t start = observe ? LateThreads::now_ns() : 0;
  // Tasks call ATen ops: the other threads take the caller's dispatch state (below autograd inside a kernel, grad
  // mode, inference mode), or an op on a tensor that requires grad would go through autograd there.
  const at::ThreadLocalState state;
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    at::ThreadLocalStateGuard guard(state);
    const bool is_caller = std::this_thread::get_id() == caller, timed = observe && is_caller;
    int64_t taken = 0;
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t t0 = timed ? LateThreads::now_ns() : 0;
      task(i);
      if (timed) caller_task_ns += LateThreads::now_ns() - t0;
      ++taken;
    }
    if (!is_caller) others_tasks.fetch_add(taken, std::memory_order_relaxed);
  });
  if (observe) late.region_took(LateThreads::now_ns() - start, caller_task_ns, others_tasks.load(), work);
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
