// Results of a pure function kept for the calling thread. `meshlm plan`
// weighs hundreds of layouts, and for each the memory of every rank of every
// candidate pipeline split: it asks for the same rank's tables (tensor names
// formatted per tensor) and pages thousands of times over. A KeptValues
// holds the results made for one scope (the model, and what else the
// function reads besides the key), each under its key (a rank's shard); a
// new scope, or more than `cap` keys, starts it afresh, so a process that
// plans one model keeps at most `cap` results.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <utility>

namespace meshlm {

template <class Scope, class Key, class Value>
class KeptValues {
 public:
  explicit KeptValues(size_t cap) : cap_(cap) {}

  // make() of (scope, key): the kept value, or a new one made and kept.
  template <class Make>
  Value get(const Scope& scope, const Key& key, Make&& make) {
    if (!scope_ || !(*scope_ == scope)) {
      scope_ = scope;
      values_.clear();
    }
    if (auto it = values_.find(key); it != values_.end()) return it->second;
    if (values_.size() >= cap_) values_.clear();
    return values_.emplace(key, std::forward<Make>(make)()).first->second;
  }

 private:
  size_t cap_;
  std::optional<Scope> scope_;
  std::map<Key, Value> values_;
};

}  // namespace meshlm
