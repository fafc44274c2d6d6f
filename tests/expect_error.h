// expect_error(f, parts): runs `f`, expects a meshlm::Error whose message
// contains every one of `parts`, and returns the message (for more checks).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

inline std::string expect_error(const std::function<void()>& f,
                                const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const meshlm::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no meshlm::Error thrown";
  return "";
}
