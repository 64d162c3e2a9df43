// Sizing a std::string without writing its bytes, for a buffer that is about
// to be filled whole (issue 25: the daemon's retained copy of a large result
// piece). std::string::resize zero-fills, which for a 1 MiB piece written
// next with non-temporal stores means a memory pass and cached lines the
// streaming stores must then evict (stop 29 measured 1.5x the daemon's CPU).
// C++23's resize_and_overwrite is the standard form; C++17 has none.
#pragma once

#include <cstddef>
#include <string>

namespace agentix::base {

// Makes `s` exactly `n` bytes long. Bytes below the old size keep their
// value; bytes from the old size up to `n` are unspecified (the caller
// overwrites them) with libstdc++'s C++11 ABI (ours), zero elsewhere.
// s[n] is '\0'.
void ResizeUninitialized(std::string& s, size_t n);

}  // namespace agentix::base
