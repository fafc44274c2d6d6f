// The rank's compute backend as comm::DeviceAccess: host staging
// (comm/staged_comm.h, comm.device = host) copies a device buffer's bytes
// with the backend's download and upload, on its stream, after the work
// queued there (an upload returns before it lands, ahead of what follows).
// On the CPU backend nothing is a device buffer, and a staged communicator
// passes every buffer to MPI as it is.
#pragma once

#include <cstddef>

#include "comm/staged_comm.h"
#include "ops/kernels.h"

namespace meshlm {

class KernelsDeviceAccess final : public comm::DeviceAccess {
public:
  // `k` must outlive this.
  explicit KernelsDeviceAccess(const ops::Kernels& k) : k_(k) {}
  bool on_device(const void* p) const override { return k_.holds(p); }
  void to_host(void* host, const void* device, size_t bytes, comm::Stream) const override {
    k_.download(host, device, bytes);
  }
  void to_device(void* device, const void* host, size_t bytes, comm::Stream) const override {
    k_.upload(device, host, bytes);
  }

private:
  const ops::Kernels& k_;
};

}  // namespace meshlm
