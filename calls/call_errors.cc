#include "calls/call_errors.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "wire/wire_limits.h"

namespace agentix::calls {

using runtime::v1::SandboxEvent;

std::shared_ptr<SandboxEvent> NewCallError(const std::string& call_id,
                                           std::string type,
                                           std::string message,
                                           absl::StatusCode code,
                                           std::string traceback,
                                           std::optional<int> returncode) {
  auto event = std::make_shared<SandboxEvent>();
  auto* error = event->mutable_error();
  error->set_call_id(call_id);
  auto* e = error->mutable_error();
  e->set_cancelled(type == "Cancelled");
  e->set_type(std::move(type));
  e->set_message(std::move(message));
  e->set_traceback(std::move(traceback));
  e->set_code(static_cast<int>(code));
  if (returncode.has_value()) e->set_returncode(*returncode);
  return event;
}

SandboxEventPtr MakeCallError(const std::string& call_id, std::string type,
                              std::string message, absl::StatusCode code,
                              std::string traceback,
                              std::optional<int> returncode) {
  return NewCallError(call_id, std::move(type), std::move(message), code,
                      std::move(traceback), returncode);
}

SandboxEventPtr BadRequest(const std::string& call_id, std::string message) {
  return MakeCallError(call_id, "BadRequest", std::move(message),
                       absl::StatusCode::kInvalidArgument);
}

bool IdTooLong(const std::string& id) { return id.size() > kMaxCallIdBytes; }

SandboxEventPtr IdTooLongError(const std::string& id) {
  return BadRequest("", absl::StrCat("call_id of ", id.size(),
                                     " bytes exceeds the limit of ",
                                     kMaxCallIdBytes, " bytes"));
}

SandboxEventPtr CallIdInUse(const std::string& id) {
  return MakeCallError(
      id, "CallIdInUse",
      "another client (agentix-client-id) has a call with this call_id "
      "running or retained; call ids are daemon-wide: use unique ones (e.g. "
      "a UUID) and a client id of your own",
      absl::StatusCode::kAlreadyExists);
}

SandboxEventPtr AlreadyRanError(const std::string& id) {
  return MakeCallError(id, "ResultUnavailable",
                       "this call already ran and its result is no "
                       "longer held by the runtime (acknowledged or "
                       "evicted); retry as a new call",
                       absl::StatusCode::kNotFound);
}

SandboxEventPtr NotHeldError(const std::string& id) {
  return MakeCallError(id, "ResultUnavailable",
                       "result is no longer held by the runtime (evicted or "
                       "unknown call_id); retry as a new call",
                       absl::StatusCode::kNotFound);
}

std::shared_ptr<SandboxEvent> FromWorkerError(const std::string& call_id,
                                              const ipc::ErrorInfo& error) {
  auto event = NewCallError(call_id, error.type, error.message,
                            static_cast<absl::StatusCode>(error.code),
                            error.traceback, error.returncode);
  auto* e = event->mutable_error()->mutable_error();
  e->set_type_module(error.type_module);
  e->set_type_qualname(error.type_qualname);
  // The worker bounds the state; a worker that does not is not forwarded.
  if (error.state.size() <= ipc::kMaxExceptionStateBytes) {
    e->set_state(error.state);
  }
  // The event must fit one 4 MiB message (wire_limits.h): a huge message
  // or traceback is cut, with a note, to a quarter of that each.
  if (e->ByteSizeLong() > sandbox::kMaxWireItemBytes / 2) {
    constexpr size_t kName = 64u << 10;
    sandbox::TruncateForWire(*e->mutable_message(),
                             sandbox::kMaxWireItemBytes / 4);
    sandbox::TruncateForWire(*e->mutable_traceback(),
                             sandbox::kMaxWireItemBytes / 4);
    sandbox::TruncateForWire(*e->mutable_type(), kName);
    sandbox::TruncateForWire(*e->mutable_type_module(), kName);
    sandbox::TruncateForWire(*e->mutable_type_qualname(), kName);
  }
  return event;
}

}  // namespace agentix::calls
