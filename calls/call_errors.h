// The typed CallErrors a call table answers with (docs/RELIABILITY.md
// "Calls"): one wording for both owners of a client's calls, the daemon's
// SessionManager and the worker's DirectSession.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "wire/sandbox_event.h"
#include "worker/ipc/frame.h"

namespace agentix::calls {

using sandbox::SandboxEventPtr;

// Longest accepted call_id (and namespace request_id): every id is kept as a
// hash-map key and remembered after its call (FinishedIds), so its length
// must not be the host's choice. Python hosts send 32 hex chars.
inline constexpr size_t kMaxCallIdBytes = 256;

// A CallError event, mutable (the daemon stamps barrier seqs on some).
std::shared_ptr<runtime::v1::SandboxEvent> NewCallError(
    const std::string& call_id, std::string type, std::string message,
    absl::StatusCode code, std::string traceback = "",
    std::optional<int> returncode = std::nullopt);

SandboxEventPtr MakeCallError(const std::string& call_id, std::string type,
                              std::string message, absl::StatusCode code,
                              std::string traceback = "",
                              std::optional<int> returncode = std::nullopt);

// INVALID_ARGUMENT "BadRequest".
SandboxEventPtr BadRequest(const std::string& call_id, std::string message);

bool IdTooLong(const std::string& id);
// An over-long id is neither stored nor echoed: the error carries its length.
SandboxEventPtr IdTooLongError(const std::string& id);

// A call id in flight or retained for another client (ALREADY_EXISTS).
SandboxEventPtr CallIdInUse(const std::string& id);

// A re-sent StartCall of a call that ran and whose result is gone.
SandboxEventPtr AlreadyRanError(const std::string& id);

// A ResumeCalls id the table does not hold (evicted, acknowledged, unknown).
SandboxEventPtr NotHeldError(const std::string& id);

// A worker's `error` frame as the host's CallError: its exception state
// dropped past kMaxExceptionStateBytes, its strings cut to fit one message.
std::shared_ptr<runtime::v1::SandboxEvent> FromWorkerError(
    const std::string& call_id, const ipc::ErrorInfo& error);

}  // namespace agentix::calls
