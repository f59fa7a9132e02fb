// Makes the extension importable as `torch_ascend_moe._C`; loading it runs the static TORCH_LIBRARY
// registrations. It also records how it was built, for `python -m torch_ascend_moe info`.
#include <Python.h>
#include <torch/version.h>

#define AM_STR2(x) #x
#define AM_STR(x) AM_STR2(x)

PyObject* ascend_moe_register_autograd(PyObject* self, PyObject* args);  // autograd_bridge.cpp
PyObject* ascend_moe_shm_publish(PyObject* self, PyObject* args);        // shared_flags.cpp
PyObject* ascend_moe_shm_wait(PyObject* self, PyObject* args);
PyObject* ascend_moe_kept_swiglu(PyObject* self, PyObject* args);  // mega_moe_cpu.cpp
PyObject* ascend_moe_kept_swiglu_backward(PyObject* self, PyObject* args);
PyObject* ascend_moe_mega_moe_bf16_local(PyObject* self, PyObject* args);
PyObject* ascend_moe_k_grouped_bf16_gemm_into(PyObject* self, PyObject* args);

namespace ascend_moe {
int set_native_bf16_dot(int forced);  // gemm_cpu.cpp
bool mkl_bf16_gemm_available();
void late_threads_state(bool reset, const long long region[4], long long state[4]);  // gemm_cpu.cpp
}  // namespace ascend_moe

static PyObject* ascend_moe_set_native_bf16_dot(PyObject*, PyObject* args) {
  int forced = -1;
  if (!PyArg_ParseTuple(args, "i", &forced)) return nullptr;
  return PyLong_FromLong(ascend_moe::set_native_bf16_dot(forced));
}

static PyObject* ascend_moe_mkl_bf16_gemm(PyObject*, PyObject*) {
  return PyBool_FromLong(ascend_moe::mkl_bf16_gemm_available());
}

static PyObject* ascend_moe_late_threads(PyObject*, PyObject* args) {
  int reset = 0;
  long long region[4] = {-1, 0, 0, 0};
  if (!PyArg_ParseTuple(args, "p|(LLLL)", &reset, &region[0], &region[1], &region[2], &region[3])) return nullptr;
  long long state[4];
  ascend_moe::late_threads_state(reset != 0, region, state);
  return Py_BuildValue("(LLLL)", state[0], state[1], state[2], state[3]);
}

static PyMethodDef ascend_moe_methods[] = {
    {"_register_autograd", ascend_moe_register_autograd, METH_VARARGS,
     "_register_autograd(name, impl): the C++ autograd kernel of ascend_moe::name, calling impl when a gradient "
     "is needed"},
    {"_set_native_bf16_dot", ascend_moe_set_native_bf16_dot, METH_VARARGS,
     "_set_native_bf16_dot(forced): the C++ kernels take their paths for CPUs with BF16 dot products (1), without "
     "them (0), or as the CPU says (-1); returns the previous setting (tests)"},
    {"_late_threads", ascend_moe_late_threads, METH_VARARGS,
     "_late_threads(reset, region=None): csrc/ops/tasks.h's LateThreads as (late regions in a row, calls left to run "
     "alone, the late region's wall ns, the calling thread's ps per unit of work), after clearing it when reset and "
     "then recording region = (wall ns, the calling thread's task ns, tasks the other threads took, work) as a "
     "region would (tests)"},
    {"_mkl_bf16_gemm", ascend_moe_mkl_bf16_gemm, METH_NOARGS,
     "_mkl_bf16_gemm(): whether MKL's BF16 x BF16 -> FP32 GEMM is linked"},
    {"_shm_publish", ascend_moe_shm_publish, METH_VARARGS,
     "_shm_publish(address, value): store value at address (an int64 in shared memory) with release order"},
    {"_shm_wait", ascend_moe_shm_wait, METH_VARARGS,
     "_shm_wait(addresses, target, seconds): wait (without the GIL) until every int64 at addresses is >= target, "
     "at most about seconds; returns -1 when they are, else the index of the first one that is not"},
    {"_kept_swiglu", ascend_moe_kept_swiglu, METH_VARARGS,
     "_kept_swiglu(h, row_w, clamp, block_elements): mega_moe's BF16 SwiGLU step on CPU (backends/portable/"
     "mega_moe.py's _activation, the same bits)"},
    {"_kept_swiglu_backward", ascend_moe_kept_swiglu_backward, METH_VARARGS,
     "_kept_swiglu_backward(h, row_w, clamp, grad_act, need_w, block_elements): its backward as autograd records "
     "it: (grad_h, grad_w or None)"},
    {"_mega_moe_bf16_local", ascend_moe_mega_moe_bf16_local, METH_VARARGS,
     "_mega_moe_bf16_local(x, topk_idx, topk_weights, l1, l2, clamp, shared_l1, shared_l2, block_elements): "
     "mega_moe's single-process BF16 steps 2-7 with the fused shared experts on CPU in one call "
     "(backends/portable/mega_moe.py's pipeline, the same bits): (y, counts), or None when an expert id is out of "
     "range"},
    {"_k_grouped_bf16_gemm_into", ascend_moe_k_grouped_bf16_gemm_into, METH_VARARGS,
     "_k_grouped_bf16_gemm_into(out, a, b, layout, num_groups): k_grouped_bf16_gemm(a, b, layout, num_groups, "
     "out_dtype=out.dtype) (psum layout) written into out, which it returns (mega_moe's eager backward)"},
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef ascend_moe_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, ascend_moe_methods};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* m = PyModule_Create(&ascend_moe_module);
  if (m == nullptr) return nullptr;
  PyModule_AddStringConstant(m, "built_with_torch", TORCH_VERSION);
#if defined(__clang__)
  PyModule_AddStringConstant(m, "compiler", "clang " __clang_version__);
#elif defined(__GNUC__)
  PyModule_AddStringConstant(m, "compiler", "gcc " __VERSION__);
#else
  PyModule_AddStringConstant(m, "compiler", "unknown");
#endif
#if defined(_OPENMP)
  PyModule_AddIntConstant(m, "openmp", 1);
#else
  PyModule_AddIntConstant(m, "openmp", 0);
#endif
  PyModule_AddStringConstant(m, "cxx_standard", AM_STR(__cplusplus));
  return m;
}
