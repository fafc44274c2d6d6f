#include "comm/comm.h"

#include <exception>
#include <string>
#include <utility>

#include "comm/errors.h"
#include "core/error.h"

namespace meshlm::comm {

HandleImpl::~HandleImpl() = default;
Communicator::~Communicator() = default;

Handle::Handle() = default;
Handle::Handle(std::unique_ptr<HandleImpl> impl) : impl_(std::move(impl)) {}
Handle::Handle(Handle&& other) noexcept : impl_(std::move(other.impl_)) {}

Handle& Handle::operator=(Handle&& other) {
  if (this != &other) {
    wait();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Handle::~Handle() {
  try {
    wait();
  } catch (const std::exception& e) {
    fatal_one(std::string("communication failed in a Handle's destructor: ") + e.what(),
              MESHLM_HERE);
  }
}

void Handle::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();  // a second wait() is free, and test() is true from now on
}

bool Handle::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

std::string broadcast_string(Communicator& c, std::string s, int root) {
  uint64_t len = s.size();
  c.broadcast(&len, sizeof(len), DType::u8, root).wait();
  s.resize(len);
  if (len > 0) c.broadcast(s.data(), len, DType::u8, root).wait();
  return s;
}

}  // namespace meshlm::comm
