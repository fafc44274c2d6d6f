#include "quant/node_store.h"

namespace meshlm::quant {

std::unique_ptr<NodeStore> NodeStore::shared(MPI_Comm node, size_t bytes) {
  std::unique_ptr<NodeStore> s(new NodeStore);
  s->window_ = std::make_unique<comm::SharedWindow>(node, bytes);  // zeroed by its owner
  s->data_ = s->window_->data();
  s->bytes_ = bytes;
  s->holder_ = s->window_->owner();
  if (s->holder_) MemTracker::get().on_alloc(MemCategory::quantized, Device::cpu, bytes);
  return s;
}

std::unique_ptr<NodeStore> NodeStore::private_copy(size_t bytes) {
  std::unique_ptr<NodeStore> s(new NodeStore);
  s->private_ = Buffer(bytes, MemCategory::quantized, "quant.base_private");
  s->data_ = s->private_.as<uint8_t>();  // zeroed by Buffer
  s->bytes_ = bytes;
  s->holder_ = true;
  return s;
}

void NodeStore::publish() {
  if (window_) window_->fence();
}

NodeStore::~NodeStore() {
  if (window_ && holder_) MemTracker::get().on_free(MemCategory::quantized, Device::cpu, bytes_);
}

}  // namespace meshlm::quant
