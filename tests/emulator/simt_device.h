#pragma once
// The emulated device's memory (simt_device.cpp) is readable by the host only
// while device work runs: launch_kernel (csrc/cuda/launch.cuh) and the device's
// copies hold a SimtDeviceAccess. Nested and from any thread: the memory is
// readable while at least one is alive.
void simt_device_begin_access();
void simt_device_end_access();

struct SimtDeviceAccess {
  SimtDeviceAccess() { simt_device_begin_access(); }
  ~SimtDeviceAccess() { simt_device_end_access(); }
  SimtDeviceAccess(const SimtDeviceAccess&) = delete;
  SimtDeviceAccess& operator=(const SimtDeviceAccess&) = delete;
};
