// The Python module fakequant._build: what fakequant._C was built for (the
// fakequant version, the torch version, the CUDA version and architectures, or
// None for a CPU-only build). setup.py generates fakequant_build_info.h into
// the build directory; nothing of it is in the source tree.
//
// This module uses Python's C API only and links no torch library, so that it
// loads into any torch: fakequant/_extension.py reads it and refuses, with an
// ImportError naming both versions, to load _C into a torch it was not built
// for (which could fail on an unresolved symbol, or load and misbehave).
#include <Python.h>

#include "fakequant_build_info.h"

namespace {

PyObject* string_or_none(const char* value) {
  if (value == nullptr) Py_RETURN_NONE;
  return PyUnicode_FromString(value);
}

int add(PyObject* m, const char* name, const char* value) {
  PyObject* obj = string_or_none(value);
  if (obj == nullptr) return -1;
  if (PyModule_AddObject(m, name, obj) < 0) {
    Py_DECREF(obj);
    return -1;
  }
  return 0;
}

struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_build",
    "What fakequant._C was built for: VERSION, TORCH_VERSION, CUDA_VERSION, CUDA_ARCH_LIST.", -1, nullptr};

}  // namespace

extern "C" PyObject* PyInit__build(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  if (add(m, "VERSION", FAKEQUANT_BUILD_VERSION) < 0 || add(m, "TORCH_VERSION", FAKEQUANT_BUILD_TORCH_VERSION) < 0 ||
      add(m, "CUDA_VERSION", FAKEQUANT_BUILD_CUDA_VERSION) < 0 ||
      add(m, "CUDA_ARCH_LIST", FAKEQUANT_BUILD_CUDA_ARCH_LIST) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
