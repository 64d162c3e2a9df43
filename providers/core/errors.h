// Provider errors: an absl::Status with a machine-readable reason (and an
// optional retry delay) carried as payloads, so plain-C++ code can say why
// and the gRPC adapter can put it in "agentix-error-reason" /
// "agentix-retry-after-ms" trailing metadata.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace agentix::providers {

// Reasons used across providerd (add here, keep the list in the proto's
// comment and docs/PROVIDERS.md in step).
inline constexpr char kReasonRequestIdReused[] = "REQUEST_ID_REUSED";
inline constexpr char kReasonSandboxNotFound[] = "SANDBOX_NOT_FOUND";
inline constexpr char kReasonPoolNotFound[] = "POOL_NOT_FOUND";
inline constexpr char kReasonSandboxIdTaken[] = "SANDBOX_ID_TAKEN";
inline constexpr char kReasonPoolExists[] = "POOL_EXISTS";
inline constexpr char kReasonInvalidSpec[] = "INVALID_SPEC";
inline constexpr char kReasonNotABundle[] = "NOT_A_BUNDLE";
inline constexpr char kReasonLimitNotEnforceable[] = "LIMIT_NOT_ENFORCEABLE";
inline constexpr char kReasonInvalidSelector[] = "INVALID_LABEL_SELECTOR";
inline constexpr char kReasonTtlTooLong[] = "TTL_ABOVE_MAX_LIFETIME";
inline constexpr char kReasonPoolMismatch[] = "POOL_SPEC_MISMATCH";
inline constexpr char kReasonPoolMiss[] = "POOL_EMPTY";
inline constexpr char kReasonTerminated[] = "SANDBOX_TERMINATED";
inline constexpr char kReasonStartFailed[] = "START_FAILED";
inline constexpr char kReasonReadyTimeout[] = "READY_TIMEOUT";
inline constexpr char kReasonWatchExpired[] = "RESOURCE_VERSION_TOO_OLD";
inline constexpr char kReasonShuttingDown[] = "SHUTTING_DOWN";
inline constexpr char kReasonQuota[] = "QUOTA_EXCEEDED";
inline constexpr char kReasonUnauthenticated[] = "UNAUTHENTICATED";

// A status with `reason` attached.
absl::Status ProviderError(absl::StatusCode code, absl::string_view reason,
                           absl::string_view message);
// The same, with a retry delay.
absl::Status WithRetryAfter(absl::Status status, absl::Duration delay);

// "" when the status carries no reason.
std::string ReasonOf(const absl::Status& status);
std::optional<absl::Duration> RetryAfterOf(const absl::Status& status);

}  // namespace agentix::providers
