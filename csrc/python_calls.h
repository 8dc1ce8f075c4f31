#pragma once
// fakequant._C's functions that call the operators from eager Python (python_calls.cpp).
#include <Python.h>

namespace fakequant {

// Adds one function per operator to the module, and OPERATORS, the tuple of their names;
// false with a Python error set on failure.
bool add_operator_calls(PyObject* module);

}  // namespace fakequant
