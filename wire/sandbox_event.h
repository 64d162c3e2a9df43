// SandboxEventPtr: an event of a host's call, shared between the record that
// retains it until the host acks and the bytes queued to write it (no copy).
#pragma once

#include <memory>

#include "agentix/runtime/v1/runtime.pb.h"

namespace agentix::sandbox {

using SandboxEventPtr = std::shared_ptr<const runtime::v1::SandboxEvent>;

}  // namespace agentix::sandbox
