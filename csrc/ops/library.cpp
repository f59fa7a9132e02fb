// Opens the ascend_moe namespace. Each family defines its own schemas next to its CPU kernels, in
// <family>_cpu.cpp (TORCH_LIBRARY_FRAGMENT, with set_python_module naming the module of its fakes, so tracing
// before the fakes are imported fails with a hint naming that module); fakes, autograd formulas and the
// portable kernels live in the Python package (torch_ascend_moe/{meta,autograd,backends/portable}/<family>.py).
#include <torch/library.h>

TORCH_LIBRARY(ascend_moe, m) {}
