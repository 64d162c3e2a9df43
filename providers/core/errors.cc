#include "providers/core/errors.h"

#include <cstdint>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace agentix::providers {
namespace {
constexpr char kReasonUrl[] = "agentix.dev/reason";
constexpr char kRetryUrl[] = "agentix.dev/retry-after-ms";
}  // namespace

absl::Status ProviderError(absl::StatusCode code, absl::string_view reason,
                           absl::string_view message) {
  absl::Status status(code, message);
  if (!reason.empty()) status.SetPayload(kReasonUrl, absl::Cord(reason));
  return status;
}

absl::Status WithRetryAfter(absl::Status status, absl::Duration delay) {
  status.SetPayload(kRetryUrl,
                    absl::Cord(absl::StrCat(absl::ToInt64Milliseconds(delay))));
  return status;
}

std::string ReasonOf(const absl::Status& status) {
  auto reason = status.GetPayload(kReasonUrl);
  return reason ? std::string(*reason) : std::string();
}

std::optional<absl::Duration> RetryAfterOf(const absl::Status& status) {
  auto value = status.GetPayload(kRetryUrl);
  int64_t ms = 0;
  if (!value || !absl::SimpleAtoi(std::string(*value), &ms)) return std::nullopt;
  return absl::Milliseconds(ms);
}

}  // namespace agentix::providers
