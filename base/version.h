// The release all binaries report (`--version`, Health.version); kept in step
// with host/python/pyproject.toml and agentix.__version__ (a test checks).
#pragma once

namespace agentix::base {

inline constexpr char kAgentixVersion[] = "0.3.0";

}  // namespace agentix::base
