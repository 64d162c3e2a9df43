// Catch2 helpers for absl::Status / StatusOr, after SAPI's
// SAPI_ASSERT_OK_AND_ASSIGN.
#pragma once

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define AGX_TEST_CONCAT_INNER_(a, b) a##b
#define AGX_TEST_CONCAT_(a, b) AGX_TEST_CONCAT_INNER_(a, b)

#define REQUIRE_OK(expr)                               \
  do {                                                 \
    const ::absl::Status agx_s_ = ::agentix::testing::AsStatus(expr); \
    INFO(agx_s_.ToString());                           \
    REQUIRE(agx_s_.ok());                              \
  } while (false)

#define REQUIRE_OK_AND_ASSIGN(lhs, rexpr) \
  REQUIRE_OK_AND_ASSIGN_IMPL_(AGX_TEST_CONCAT_(agx_so_, __LINE__), lhs, rexpr)

#define REQUIRE_OK_AND_ASSIGN_IMPL_(so, lhs, rexpr) \
  auto so = (rexpr);                                \
  INFO(so.status().ToString());                     \
  REQUIRE(so.ok());                                 \
  lhs = std::move(so).value()

namespace agentix::testing {
inline absl::Status AsStatus(const absl::Status& s) { return s; }
template <typename T>
absl::Status AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace agentix::testing
