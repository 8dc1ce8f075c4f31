// The Python module fakequant._C. Loading it runs the TORCH_LIBRARY blocks (the
// operators reach Python through torch.ops.fakequant); the module carries the numeric
// constants and range rules of the C++ library, so that Python reads them instead of
// writing them again, and a function per operator for eager calls (python_calls.cpp).
#include <Python.h>

#include <cstdint>

#include "fakequant/contract.h"
#include "python_calls.h"

namespace {

bool parse_bool(PyObject* obj, bool* out) {
  const int v = PyObject_IsTrue(obj);
  if (v < 0) return false;
  *out = v != 0;
  return true;
}

bool parse_num_bits(PyObject* obj, int64_t* out) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "fakequant: num_bits must be an int, got %R", obj);
    return false;
  }
  const long long v = PyLong_AsLongLong(obj);
  if (v == -1 && PyErr_Occurred()) return false;
  if (v < fakequant::kMinNumBits || v > fakequant::kMaxNumBits) {
    PyErr_Format(PyExc_ValueError, "fakequant: num_bits must be in [%lld, %lld], got %lld",
                 static_cast<long long>(fakequant::kMinNumBits),
                 static_cast<long long>(fakequant::kMaxNumBits), v);
    return false;
  }
  *out = v;
  return true;
}

// amax_bound(num_bits, unsigned) -> 2^(num_bits - 1 + unsigned) - 1
PyObject* py_amax_bound(PyObject*, PyObject* args) {
  PyObject *bits_obj, *unsigned_obj;
  if (!PyArg_ParseTuple(args, "OO:amax_bound", &bits_obj, &unsigned_obj)) return nullptr;
  int64_t num_bits;
  bool is_unsigned;
  if (!parse_num_bits(bits_obj, &num_bits) || !parse_bool(unsigned_obj, &is_unsigned)) return nullptr;
  return PyLong_FromLongLong(fakequant::amax_bound(num_bits, is_unsigned));
}

// amax_range(num_bits, unsigned, narrow_range) -> (quant_min, quant_max)
PyObject* py_amax_range(PyObject*, PyObject* args) {
  PyObject *bits_obj, *unsigned_obj, *narrow_obj;
  if (!PyArg_ParseTuple(args, "OOO:amax_range", &bits_obj, &unsigned_obj, &narrow_obj)) {
    return nullptr;
  }
  int64_t num_bits;
  bool is_unsigned, narrow;
  if (!parse_num_bits(bits_obj, &num_bits) || !parse_bool(unsigned_obj, &is_unsigned) ||
      !parse_bool(narrow_obj, &narrow)) {
    return nullptr;
  }
  const int64_t bound = fakequant::amax_bound(num_bits, is_unsigned);
  return Py_BuildValue("(LL)", static_cast<long long>(fakequant::amax_quant_min(bound, is_unsigned, narrow)),
                       static_cast<long long>(bound));
}

PyMethodDef methods[] = {
    {"amax_bound", py_amax_bound, METH_VARARGS,
     "amax_bound(num_bits, unsigned) -> int: 2^(num_bits - 1 + unsigned) - 1"},
    {"amax_range", py_amax_range, METH_VARARGS,
     "amax_range(num_bits, unsigned, narrow_range) -> (quant_min, quant_max) of the amax family"},
    {nullptr, nullptr, 0, nullptr}};

struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

// FLOAT_FORMATS: {(exponent_bits, mantissa_bits): (max, max_exponent)} of every small
// float format (float_formats.h).
bool add_float_formats(PyObject* m) {
  PyObject* formats = PyDict_New();
  if (formats == nullptr) return false;
  for (const fakequant::FloatFormat& f : fakequant::kFloatFormats) {
    PyObject* key = Py_BuildValue("(ii)", f.exponent_bits, f.mantissa_bits);
    PyObject* value = Py_BuildValue("(di)", static_cast<double>(f.max), f.max_exponent);
    const bool ok = key != nullptr && value != nullptr && PyDict_SetItem(formats, key, value) == 0;
    Py_XDECREF(key);
    Py_XDECREF(value);
    if (!ok) {
      Py_DECREF(formats);
      return false;
    }
  }
  return PyModule_AddObject(m, "FLOAT_FORMATS", formats) == 0;
}

bool add_constants(PyObject* m) {
  using namespace fakequant;
  return PyModule_AddObject(m, "AMAX_EPSILON", PyFloat_FromDouble(kAmaxEpsilon)) == 0 &&
         PyModule_AddIntConstant(m, "MIN_NUM_BITS", kMinNumBits) == 0 &&
         PyModule_AddIntConstant(m, "MAX_NUM_BITS", kMaxNumBits) == 0 &&
         PyModule_AddObject(m, "E4M3_MAX", PyFloat_FromDouble(kE4M3.max)) == 0 &&
         PyModule_AddObject(m, "E5M2_MAX", PyFloat_FromDouble(kE5M2.max)) == 0 &&
         PyModule_AddObject(m, "E2M1_MAX", PyFloat_FromDouble(kE2M1.max)) == 0 &&
         add_float_formats(m);
}

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m != nullptr && !(add_constants(m) && fakequant::add_operator_calls(m))) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
