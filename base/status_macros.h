// Status propagation macros with the semantics of upstream Abseil's
// ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN (absent from Abseil 20220623),
// so that an Abseil upgrade turns these into a rename.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define AGX_STATUS_CONCAT_INNER_(a, b) a##b
#define AGX_STATUS_CONCAT_(a, b) AGX_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define AGX_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    ::absl::Status agx_status_ = (expr);           \
    if (!agx_status_.ok()) return agx_status_;     \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define AGX_ASSIGN_OR_RETURN(lhs, rexpr) \
  AGX_ASSIGN_OR_RETURN_IMPL_(AGX_STATUS_CONCAT_(agx_statusor_, __LINE__), lhs, rexpr)

#define AGX_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
