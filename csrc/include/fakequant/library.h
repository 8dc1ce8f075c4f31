#pragma once
// The operators' namespace: `fakequant`, or what FAKEQUANT_NAMESPACE names.
// The emulation build (tools/emulate.py) names `fakequant_emulated`, so that
// its library, the CUDA kernels run by the SIMT emulator on the CPU, loads
// into one process with fakequant._C and the two can be compared.
#include <torch/library.h>

#ifndef FAKEQUANT_NAMESPACE
#define FAKEQUANT_NAMESPACE fakequant
#endif

// (two levels, so that FAKEQUANT_NAMESPACE is expanded before TORCH_LIBRARY pastes it)
#define FAKEQUANT_LIBRARY_IN(ns, m) TORCH_LIBRARY(ns, m)
#define FAKEQUANT_LIBRARY(m) FAKEQUANT_LIBRARY_IN(FAKEQUANT_NAMESPACE, m)
#define FAKEQUANT_LIBRARY_IMPL_IN(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define FAKEQUANT_LIBRARY_IMPL(key, m) FAKEQUANT_LIBRARY_IMPL_IN(FAKEQUANT_NAMESPACE, key, m)
