// Makes the extension importable as `torch_ascend_moe._C`; loading it runs the static TORCH_LIBRARY
// registrations. It also records how it was built, for `python -m torch_ascend_moe info`.
#include <Python.h>
#include <torch/version.h>

#define AM_STR2(x) #x
#define AM_STR(x) AM_STR2(x)

PyObject* ascend_moe_register_autograd(PyObject* self, PyObject* args);  // autograd_bridge.cpp

static PyMethodDef ascend_moe_methods[] = {
    {"_register_autograd", ascend_moe_register_autograd, METH_VARARGS,
     "_register_autograd(name, impl): the C++ autograd kernel of ascend_moe::name, calling impl when a gradient "
     "is needed"},
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
