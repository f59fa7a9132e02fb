// Flags in shared memory for the ranks of one host (torch_ascend_moe/distributed/shared_rows.py): a rank
// publishes a barrier count with a release store and waits for its peers' counts with acquire loads, so every
// byte a peer wrote before publishing (rows, a header) is visible once its count is seen, on x86 and on Arm
// (Ascend hosts) alike. The waits run without the GIL; the caller bounds them (deadline, dead peers) between
// calls. Addresses come from Python as integers: the caller keeps the mapped tensors alive.
#include <Python.h>

#include <sched.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AM_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define AM_PAUSE() asm volatile("yield" ::: "memory")
#else
#define AM_PAUSE() ((void)0)
#endif

namespace {

bool parse_address(PyObject* obj, int64_t** out) {
  unsigned long long address = PyLong_AsUnsignedLongLong(obj);
  if (PyErr_Occurred()) return false;
  if (address == 0 || address % alignof(int64_t) != 0) {
    PyErr_Format(PyExc_ValueError, "shared flag address %llx: expected a non-null 8-byte aligned address", address);
    return false;
  }
  *out = reinterpret_cast<int64_t*>(address);
  return true;
}

}  // namespace

PyObject* ascend_moe_shm_publish(PyObject*, PyObject* args) {
  PyObject* obj = nullptr;
  long long value = 0;
  if (!PyArg_ParseTuple(args, "OL", &obj, &value)) return nullptr;
  int64_t* flag = nullptr;
  if (!parse_address(obj, &flag)) return nullptr;
  __atomic_store_n(flag, static_cast<int64_t>(value), __ATOMIC_RELEASE);
  Py_RETURN_NONE;
}

PyObject* ascend_moe_shm_wait(PyObject*, PyObject* args) {
  PyObject* seq = nullptr;
  long long target = 0;
  double seconds = 0;
  if (!PyArg_ParseTuple(args, "OLd", &seq, &target, &seconds)) return nullptr;
  PyObject* fast = PySequence_Fast(seq, "shared flag addresses: expected a sequence of ints");
  if (fast == nullptr) return nullptr;
  std::vector<int64_t*> flags(PySequence_Fast_GET_SIZE(fast));
  for (size_t i = 0; i < flags.size(); ++i) {
    if (!parse_address(PySequence_Fast_GET_ITEM(fast, i), &flags[i])) {
      Py_DECREF(fast);
      return nullptr;
    }
  }
  Py_DECREF(fast);
  long waiting = -1;  // the first flag still below the target, -1 when none is
  Py_BEGIN_ALLOW_THREADS;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto limit = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  size_t next = 0;
  long sleep_ns = 1000;
  for (uint64_t round = 0;; ++round) {
    while (next < flags.size() && __atomic_load_n(flags[next], __ATOMIC_ACQUIRE) >= target) ++next;
    if (next == flags.size()) break;
    // Spin a few microseconds (a peer that is about to arrive), then yield the core (ranks may outnumber
    // cores), then sleep with a growing pause of at most 0.2 ms: a long wait costs no CPU.
    if (round < 4096) {
      AM_PAUSE();
      continue;
    }
    const auto now = clock::now();
    if (now >= limit) {
      waiting = static_cast<long>(next);
      break;
    }
    if (now - start < std::chrono::milliseconds(1)) {
      sched_yield();
    } else {
      timespec pause{0, sleep_ns};
      nanosleep(&pause, nullptr);
      sleep_ns = sleep_ns < 200000 ? sleep_ns * 2 : 200000;
    }
  }
  Py_END_ALLOW_THREADS;
  return PyLong_FromLong(waiting);
}
