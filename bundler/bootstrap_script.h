// The bundle's entry point, /nix/runtime/bootstrap.sh: a POSIX sh script
// (run by the bundle's own busybox, so the task image needs no shell) that
// execs agentix-sandboxd with the bundle's worker, venv and stdlib.
//
// Environment contract (for providers):
//   AGENTIX_LISTEN      listen address(es), space-separated, e.g.
//                       unix:///run/agentix/agentix.sock; when unset:
//   AGENTIX_BIND_HOST   TCP host (default 0.0.0.0)
//   AGENTIX_BIND_PORT   TCP port (default 8000)
//   AGENTIX_PYTHON_PATH extra import roots, ':'-separated (optional)
//   AGENTIX_LOG_LEVEL   daemon log level (default info)
//   AGENTIX_LOG_DIR     sandbox log files (the worker's; default /tmp/agentix)
//   AGENTIX_EARLY_WORKER 1 or 0 (default: the bundle's --early_worker): with
//                       1, agentix-launch starts the worker before the
//                       daemon's exec and the daemon adopts it.
//   AGENTIX_WIRE        grpc (default) or socketio: agentix-sio-gateway serves
//                       the original wire on AGENTIX_BIND_HOST/PORT and the
//                       daemon listens on a private Unix socket for it (plus
//                       AGENTIX_LISTEN if set). docs/GATEWAY.md.
// Extra arguments to bootstrap.sh are passed to agentix-sandboxd.
#pragma once

#include <string>

namespace agentix::bundler {

// The script for a bundle rooted at `runtime_root` (/nix/runtime);
// `default_wire` ("grpc" or "socketio") is AGENTIX_WIRE's default,
// `early_worker` AGENTIX_EARLY_WORKER's.
std::string BootstrapScript(const std::string& runtime_root,
                            const std::string& default_wire = "grpc",
                            bool early_worker = false);

// The PATH the bundle's processes get in front of the task image's.
std::string RuntimePath(const std::string& runtime_root);

}  // namespace agentix::bundler
