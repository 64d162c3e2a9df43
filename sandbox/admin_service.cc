#include "sandbox/admin_service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/grpc_status.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::ActivateRequest;
using runtime::v1::ActivateResponse;
using runtime::v1::GetStatusRequest;
using runtime::v1::SandboxAdminStatus;

// A POSIX-portable environment name: letters, digits and '_', not starting
// with a digit. The token variable is refused: the worker must never hold
// the sandbox's token.
absl::Status CheckEnvName(const std::string& name) {
  const bool valid =
      !name.empty() && !(name[0] >= '0' && name[0] <= '9') &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
               (c >= '0' && c <= '9') || c == '_';
      });
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "env name '", name.substr(0, 64),
        "' is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"));
  }
  if (name == kTokenEnvVar || name == kSandboxIdEnvVar) {
    return absl::InvalidArgumentError(
        absl::StrCat("env name ", name, " is reserved"));
  }
  return absl::OkStatus();
}

absl::Status CheckNoNul(absl::string_view what, absl::string_view value) {
  if (value.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " contains a NUL byte"));
  }
  return absl::OkStatus();
}

// The "K=V" entries Activate adds, or why the request is refused.
absl::StatusOr<std::vector<std::string>> WorkerEnvOf(
    const ActivateRequest& request) {
  if (request.env_size() > static_cast<int>(kMaxActivateEnvEntries)) {
    return absl::InvalidArgumentError(
        absl::StrCat("env has ", request.env_size(), " entries; at most ",
                     kMaxActivateEnvEntries));
  }
  std::vector<std::string> entries;
  size_t bytes = 0;
  for (const auto& [name, value] : request.env()) {
    AGX_RETURN_IF_ERROR(CheckEnvName(name));
    AGX_RETURN_IF_ERROR(CheckNoNul(absl::StrCat("env ", name), value));
    bytes += name.size() + value.size() + 2;
    entries.push_back(absl::StrCat(name, "=", value));
  }
  if (bytes > kMaxActivateEnvBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "env holds ", bytes, " bytes; at most ", kMaxActivateEnvBytes));
  }
  const std::string& id = request.sandbox_id();
  if (id.size() > 256 ||
      std::any_of(id.begin(), id.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
      })) {
    return absl::InvalidArgumentError(
        "sandbox_id must be at most 256 bytes without control characters");
  }
  if (!id.empty()) entries.push_back(absl::StrCat(kSandboxIdEnvVar, "=", id));
  // Keys in a stable order, so the worker's environment does not depend on
  // the map's iteration order.
  std::sort(entries.begin(), entries.end());
  return entries;
}

std::string DescribeLabels(const ActivateRequest& request) {
  std::vector<std::string> labels;
  for (const auto& [key, value] : request.labels()) {
    labels.push_back(absl::StrCat(key, "=", value));
  }
  std::sort(labels.begin(), labels.end());
  return absl::StrJoin(labels, ",");
}

}  // namespace

SandboxAdminService::SandboxAdminService(std::shared_ptr<TokenGate> gate,
                                         SessionManager* manager,
                                         const StreamActivity* activity,
                                         bool start_worker,
                                         absl::Duration apply_env_timeout)
    : gate_(std::move(gate)),
      manager_(manager),
      activity_(activity),
      start_worker_(start_worker),
      apply_env_timeout_(apply_env_timeout) {}

absl::Status SandboxAdminService::Activate(const ActivateRequest& request) {
  absl::MutexLock lock(&activate_mu_);
  if (!gate_->armable()) {
    return absl::FailedPreconditionError(
        "this daemon was not started with --admin-token-file");
  }
  AGX_RETURN_IF_ERROR(gate_->CheckCandidate(request.token()));
  if (gate_->armed()) {
    if (gate_->IsRuntimeToken(request.token())) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "the sandbox is already activated with another token");
  }
  AGX_ASSIGN_OR_RETURN(std::vector<std::string> env, WorkerEnvOf(request));
  // Everything is validated above. A worker prestarted before activation
  // gets the env now, or is replaced by one spawned with it, before the gate
  // admits a call (no runtime RPC can have run one yet).
  AGX_RETURN_IF_ERROR(manager_->ApplyWorkerEnv(env, apply_env_timeout_));
  AGX_RETURN_IF_ERROR(gate_->Arm(request.token()));
  AGX_LOG(Info, "activated: sandbox_id={} env_keys={} labels={}",
          request.sandbox_id().empty() ? "-" : request.sandbox_id(),
          request.env_size(), DescribeLabels(request));
  if (start_worker_ && manager_->Info().worker_pid == 0) {
    // The prestarted worker could not start or has died: try again now.
    const absl::Status started = manager_->StartWorker();
    if (!started.ok()) {
      // Not fatal: the first call tries again and reports the reason.
      AGX_LOG(Warning, "could not start the worker on activation: {}",
              std::string(started.message()));
    }
  }
  return absl::OkStatus();
}

SandboxAdminStatus SandboxAdminService::GetStatus() {
  const SessionInfo info = manager_->Info();
  SandboxAdminStatus status;
  status.set_activated(gate_->armed());
  const int open = activity_ != nullptr ? activity_->open() : 0;
  const uint64_t calls = info.calls_in_flight + info.calls_queued;
  status.set_calls_in_flight(static_cast<int32_t>(calls));
  status.set_open_streams(open);
  status.set_worker_running(info.worker_pid != 0);
  status.set_worker_booting(info.worker_booting);
  if (calls == 0 && open == 0) {
    absl::Time since = info.last_call_end;
    if (activity_ != nullptr) since = std::max(since, activity_->last_close());
    status.set_idle_ms(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(absl::Now() - since)));
  }
  return status;
}

void SandboxAdminService::Start(CompletionQueueThread* thread) {
  auto* service = &service_;
  UnaryCall<ActivateRequest, ActivateResponse>::AwaitNext(
      [service](auto* context, auto* request, auto* writer, auto* queue,
                void* tag) {
        service->RequestActivate(context, request, writer, queue, queue, tag);
      },
      [this](const ActivateRequest& request, ActivateResponse* /*response*/) {
        return base::ToGrpcStatus(Activate(request));
      },
      thread);
  UnaryCall<GetStatusRequest, SandboxAdminStatus>::AwaitNext(
      [service](auto* context, auto* request, auto* writer, auto* queue,
                void* tag) {
        service->RequestGetStatus(context, request, writer, queue, queue, tag);
      },
      [this](const GetStatusRequest& /*request*/, SandboxAdminStatus* response) {
        *response = GetStatus();
        return grpc::Status::OK;
      },
      thread);
}

}  // namespace agentix::sandbox
