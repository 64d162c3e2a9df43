// The docker and podman backends: one Backend over the Docker Engine API
// (floor version 1.41, which docker.io 20.10 and podman 4.3's compat service
// both speak) on the engine's Unix socket. Two instances, "docker" and
// "podman", differ only in the socket they talk to. See PROVIDER-SERVICE.md
// §8.7 and docs/PROVIDERS.md ("Docker and podman backends").
#pragma once

#include <memory>

#include "providers/backend.h"
#include "providers/backends/engine/container_spec.h"

namespace agentix::providers::engine {

std::unique_ptr<Backend> NewEngineBackend(EngineOptions options);

}  // namespace agentix::providers::engine
