// Ownership of the daemon's Unix socket files. A newer daemon started on
// the same path unlinks the old file and binds its own; the old daemon,
// when it stops, must then leave that file alone. gRPC 1.51 unlinks every
// socket at a listener's path when the listener closes, so this library
// also interposes unlink(): a claimed path is not unlinked while another
// process listens there (asked with SO_PEERCRED: inode numbers are reused
// at once, so the file's identity cannot tell).
#pragma once

#include <string>

namespace agentix::sandbox {

// Records `path` as this process's socket (call after the bind). False if
// there is no socket at `path`.
bool ClaimSocketPath(const std::string& path);

// Unlinks every claimed path where no other process listens.
void RemoveOwnSocketPaths();

}  // namespace agentix::sandbox
