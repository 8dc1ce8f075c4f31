// fakequant._C.<operator>: each operator of csrc/fakequant.cpp called from eager Python
// without torch.ops' boxed path (docs/design.md, "A tensor's path"). The call still goes
// through the dispatcher, key by key (autograd, autocast, vmap, dispatch modes, the
// profiler, the device's host function); what it skips is the Python side of torch.ops:
// matching the arguments against the schema into a stack of IValues, the overload's
// Python __call__, and the boxed call (1.5 us of the 3.4 us an amax call took on the
// development machine, docs/performance.md).
//
// The fast path takes positional arguments of the plain types alone: every argument, and
// no keyword; tensors of the exact class torch.Tensor or nn.Parameter (no
// __torch_function__), ints, bools, floats, None or lists of ints where the schema says
// so; no torch function mode active and no TorchScript trace running. Anything else is
// passed, as given, to the operator's torch.ops overload, which gives torch's answer
// (its defaults, its conversions, its errors). Under torch.compile Dynamo traces
// fakequant.ops' polyfill of each (the torch.ops overload) instead of this function.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <cstdint>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "fakequant/library.h"
#include "ops/host.h"
#include "python_calls.h"

namespace fakequant {
namespace {

// An argument of C++ type T read from a Python object, where the object has the plain
// type the fast path takes (read returns false otherwise, and the call falls back).
template <class T>
struct Arg;

template <>
struct Arg<const at::Tensor&> {
  using Stored = const at::Tensor*;  // (the tensor of the argument, alive for the call)
  static bool read(PyObject* o, Stored& out) {
    if (!THPVariable_CheckExact(o)) return false;
    out = &THPVariable_Unpack(o);
    return true;
  }
  static const at::Tensor& pass(Stored& s) { return *s; }
};

template <>
struct Arg<at::Tensor&> {  // (an operator's buffers, updated in place)
  using Stored = at::Tensor;
  static bool read(PyObject* o, Stored& out) {
    if (!THPVariable_CheckExact(o)) return false;
    out = THPVariable_Unpack(o);
    return true;
  }
  static at::Tensor& pass(Stored& s) { return s; }
};

template <>
struct Arg<const std::optional<at::Tensor>&> {
  using Stored = std::optional<at::Tensor>;
  static bool read(PyObject* o, Stored& out) {
    if (o == Py_None) return true;
    if (!THPVariable_CheckExact(o)) return false;
    out = THPVariable_Unpack(o);
    return true;
  }
  static const std::optional<at::Tensor>& pass(Stored& s) { return s; }
};

bool read_int(PyObject* o, int64_t& out) {
  if (!PyLong_CheckExact(o)) return false;  // (bool is not an exact int)
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0) return false;  // (torch.ops says what it says of it)
  out = v;
  return true;
}

template <>
struct Arg<int64_t> {
  using Stored = int64_t;
  static bool read(PyObject* o, Stored& out) { return read_int(o, out); }
  static int64_t pass(Stored& s) { return s; }
};

template <>
struct Arg<std::optional<int64_t>> {
  using Stored = std::optional<int64_t>;
  static bool read(PyObject* o, Stored& out) {
    if (o == Py_None) return true;
    int64_t v = 0;
    if (!read_int(o, v)) return false;
    out = v;
    return true;
  }
  static std::optional<int64_t> pass(Stored& s) { return s; }
};

template <>
struct Arg<bool> {
  using Stored = bool;
  static bool read(PyObject* o, Stored& out) {
    if (o != Py_True && o != Py_False) return false;
    out = o == Py_True;
    return true;
  }
  static bool pass(Stored& s) { return s; }
};

template <>
struct Arg<double> {
  using Stored = double;
  static bool read(PyObject* o, Stored& out) {
    if (!PyFloat_CheckExact(o)) return false;  // (an int: torch.ops converts it)
    out = PyFloat_AS_DOUBLE(o);
    return true;
  }
  static double pass(Stored& s) { return s; }
};

template <>
struct Arg<at::OptionalIntArrayRef> {
  using Stored = std::optional<std::vector<int64_t>>;
  static bool read(PyObject* o, Stored& out) {
    if (o == Py_None) return true;
    if (!PyList_CheckExact(o) && !PyTuple_CheckExact(o)) return false;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    std::vector<int64_t> values(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!read_int(items[i], values[static_cast<size_t>(i)])) return false;
    }
    out = std::move(values);
    return true;
  }
  static at::OptionalIntArrayRef pass(Stored& s) {
    return s ? at::OptionalIntArrayRef(*s) : at::OptionalIntArrayRef();
  }
};

PyObject* wrap(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

template <class... T>
PyObject* wrap(std::tuple<T...>&& values) {
  PyObject* tuple = PyTuple_New(sizeof...(T));
  if (tuple == nullptr) return nullptr;
  bool ok = true;
  Py_ssize_t i = 0;
  std::apply(
      [&](auto&... v) {
        ((ok = ok && [&] {
            PyObject* item = wrap(std::move(v));
            if (item == nullptr) return false;
            PyTuple_SET_ITEM(tuple, i++, item);
            return true;
          }()),
         ...);
      },
      values);
  if (!ok) {
    Py_DECREF(tuple);
    return nullptr;
  }
  return tuple;
}

// The GIL released while the operator runs (as torch.ops does), restored on any exit.
class ReleasedGil {
 public:
  ReleasedGil() : state_(PyEval_SaveThread()) {}
  ~ReleasedGil() { PyEval_RestoreThread(state_); }
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

 private:
  PyThreadState* state_;
};

#define FAKEQUANT_STR_IN(x) #x
#define FAKEQUANT_STR(x) FAKEQUANT_STR_IN(x)

template <class Fn>
struct Call;

template <class R, class... A>
struct Call<R(A...)> {
  using Fn = R(A...);

  static PyObject* fallback(const char* name, PyObject*& overload, PyObject* const* args,
                            Py_ssize_t nargs, PyObject* kwnames) {
    if (overload == nullptr) {
      PyObject* ops = PyImport_ImportModule("torch.ops");  // (torch is imported already)
      PyObject* ns = ops ? PyObject_GetAttrString(ops, FAKEQUANT_STR(FAKEQUANT_NAMESPACE)) : nullptr;
      PyObject* packet = ns ? PyObject_GetAttrString(ns, name) : nullptr;
      overload = packet ? PyObject_GetAttrString(packet, "default") : nullptr;  // (kept)
      Py_XDECREF(packet);
      Py_XDECREF(ns);
      Py_XDECREF(ops);
      if (overload == nullptr) return nullptr;
    }
    return PyObject_Vectorcall(overload, args, static_cast<size_t>(nargs), kwnames);
  }

  template <size_t... I>
  static PyObject* run(const char* name, const c10::TypedOperatorHandle<Fn>& (*handle)(),
                       PyObject*& overload, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames, std::index_sequence<I...>) {
    std::tuple<typename Arg<A>::Stored...> stored{};
    const bool plain = kwnames == nullptr && nargs == static_cast<Py_ssize_t>(sizeof...(A)) &&
                       !at::impl::torch_function_mode_enabled() &&
                       !torch::jit::tracer::isTracing() &&
                       (Arg<A>::read(args[I], std::get<I>(stored)) && ...);
    if (!plain) return fallback(name, overload, args, nargs, kwnames);
    HANDLE_TH_ERRORS
    R result = [&]() -> R {
      const ReleasedGil no_gil;
      return handle().call(Arg<A>::pass(std::get<I>(stored))...);
    }();
    return wrap(std::move(result));
    END_HANDLE_TH_ERRORS
  }

  static PyObject* call(const char* name, const c10::TypedOperatorHandle<Fn>& (*handle)(),
                        PyObject*& overload, PyObject* const* args, Py_ssize_t nargs,
                        PyObject* kwnames) {
    return run(name, handle, overload, args, nargs, kwnames, std::index_sequence_for<A...>());
  }
};

// One Python function per operator (FAKEQUANT_OPERATORS, host.h).
#define FAKEQUANT_CALL(op)                                                                    \
  const c10::TypedOperatorHandle<decltype(op)>& op##_handle() {                               \
    static const c10::TypedOperatorHandle<decltype(op)> h =                                   \
        c10::Dispatcher::singleton()                                                          \
            .findSchemaOrThrow(FAKEQUANT_STR(FAKEQUANT_NAMESPACE) "::" #op, "")               \
            .typed<decltype(op)>();                                                           \
    return h;                                                                                 \
  }                                                                                           \
  PyObject* op##_overload = nullptr;                                                          \
  PyObject* py_##op(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) { \
    return Call<decltype(op)>::call(#op, &op##_handle, op##_overload, args, nargs, kwnames);  \
  }
FAKEQUANT_OPERATORS(FAKEQUANT_CALL)
#undef FAKEQUANT_CALL

#define FAKEQUANT_METHOD(op)                                                             \
  {#op, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&py_##op)),           \
   METH_FASTCALL | METH_KEYWORDS,                                                         \
   "torch.ops." FAKEQUANT_STR(FAKEQUANT_NAMESPACE) "." #op                               \
   ".default(*args), without torch.ops' boxed path where the arguments are plain (csrc/" \
   "python_calls.cpp)"},
PyMethodDef calls[] = {FAKEQUANT_OPERATORS(FAKEQUANT_METHOD){nullptr, nullptr, 0, nullptr}};
#undef FAKEQUANT_METHOD

}  // namespace

bool add_operator_calls(PyObject* module) {
#define FAKEQUANT_NAME(op) #op,
  static const char* const names[] = {FAKEQUANT_OPERATORS(FAKEQUANT_NAME)};
#undef FAKEQUANT_NAME
  PyObject* operators = PyTuple_New(std::size(names));
  if (operators == nullptr) return false;
  for (size_t i = 0; i < std::size(names); ++i) {
    PyObject* name = PyUnicode_FromString(names[i]);
    if (name == nullptr) {
      Py_DECREF(operators);
      return false;
    }
    PyTuple_SET_ITEM(operators, static_cast<Py_ssize_t>(i), name);
  }
  if (PyModule_AddObject(module, "OPERATORS", operators) != 0) {
    Py_DECREF(operators);
    return false;
  }
  return PyModule_AddFunctions(module, calls) == 0;
}

}  // namespace fakequant
