// The Autograd-key kernel every differentiable ascend_moe op shares. When nothing needs a gradient (grad mode
// off, or no input requires grad) it redispatches below autograd in C++, so an inference call pays no Python
// for autograd (a Python autograd kernel cost about two thirds of a small op's call even under no_grad).
// Otherwise it calls the op's Python autograd implementation (torch.library's, built from the family's
// setup_context and backward in torch_ascend_moe/autograd/<family>.py), registered by name from Python.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

// op name -> the Python autograd implementation, ``impl(keyset, *args, **kwargs)``. Never freed: kernels may
// run while the interpreter shuts down, and the registrations live as long as the process.
std::unordered_map<std::string, PyObject*>& python_impls() {
  static auto* impls = new std::unordered_map<std::string, PyObject*>();
  return *impls;
}
std::mutex impls_mutex;

// An argument as Python sees it from a Python call: a ScalarType travels on the stack as an int (its JIT type),
// which toPyObject would hand to setup_context as a plain int; the schema's real type turns it into a dtype.
py::object argument_to_python(const c10::Argument& arg, c10::IValue&& value) {
  auto type = arg.real_type();
  if (auto inner = type->castRaw<c10::OptionalType>()) type = inner->getElementType();
  if (value.isInt() && type->kind() == c10::TypeKind::ScalarTypeType) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(value.toInt()))));
  }
  return torch::jit::toPyObject(std::move(value));
}

bool requires_grad(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().requires_grad();
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.requires_grad()) return true;
    }
    return false;
  }
  if (v.isList()) {  // Tensor?[]
    for (const c10::IValue& e : v.toListRef()) {
      if (requires_grad(e)) return true;
    }
  }
  return false;
}

void autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  bool needed = false;
  if (c10::GradMode::is_enabled()) {
    for (size_t i = stack->size() - n; i < stack->size() && !needed; ++i) needed = requires_grad((*stack)[i]);
  }
  if (!needed) {
    at::AutoDispatchBelowAutograd guard;
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
    return;
  }
  PyObject* impl = nullptr;
  {
    std::lock_guard<std::mutex> lock(impls_mutex);
    impl = python_impls().at(op.schema().name());
  }
  py::gil_scoped_acquire gil;
  // Positional arguments as given, keyword-only ones as keywords: the calling convention of torch.library's
  // Python kernels (torch's own stack converter is not exported from libtorch_python).
  const auto& schema = op.schema();
  std::vector<c10::IValue> arguments = torch::jit::pop(*stack, n);
  size_t positional = 0;
  while (positional < n && !schema.arguments()[positional].kwarg_only()) ++positional;
  py::tuple args(positional + 1);
  py::dict kwargs;
  args[0] = py::cast(ks);
  for (size_t i = 0; i < n; ++i) {
    py::object value = argument_to_python(schema.arguments()[i], std::move(arguments[i]));
    if (i < positional) {
      args[i + 1] = std::move(value);
    } else {
      kwargs[py::str(schema.arguments()[i].name())] = std::move(value);
    }
  }
  PyObject* out = PyObject_Call(impl, args.ptr(), kwargs.ptr());
  if (out == nullptr) throw python_error();
  const auto result = py::reinterpret_steal<py::object>(out);
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(result, returns[0].type()));
  } else {
    const auto items = py::reinterpret_borrow<py::tuple>(result);
    TORCH_CHECK(items.size() == returns.size(), schema.name(), ": the autograd implementation returned ",
                items.size(), " values, the schema has ", returns.size());
    for (size_t i = 0; i < returns.size(); ++i) stack->push_back(torch::jit::toIValue(items[i], returns[i].type()));
  }
}

torch::Library& library() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "ascend_moe", std::nullopt, __FILE__, __LINE__);
  return *lib;
}

}  // namespace

// Python: ``_C._register_autograd(name, impl)``; registers the shared kernel for ``ascend_moe::name``.
PyObject* ascend_moe_register_autograd(PyObject* /*self*/, PyObject* args) {
  HANDLE_TH_ERRORS
  const char* name = nullptr;
  PyObject* impl = nullptr;
  if (!PyArg_ParseTuple(args, "sO", &name, &impl)) return nullptr;
  TORCH_CHECK(PyCallable_Check(impl), "_register_autograd: impl must be callable");
  {
    std::lock_guard<std::mutex> lock(impls_mutex);
    auto& impls = python_impls();
    const std::string qualname = std::string("ascend_moe::") + name;
    TORCH_CHECK(impls.find(qualname) == impls.end(), "_register_autograd: ", qualname, " is registered already");
    Py_INCREF(impl);
    impls[qualname] = impl;
  }
  library().impl(name, torch::dispatch(c10::DispatchKey::Autograd,
                                       torch::CppFunction::makeFromBoxedFunction<&autograd_kernel>()));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}
