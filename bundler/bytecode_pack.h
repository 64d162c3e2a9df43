// The stdlib's bytecode pack: one file holding the .pyc bodies of the stdlib
// modules a worker's boot and a typical first call import (asyncio and its
// closure among them), which the worker maps and imports from instead of
// finding, opening and reading each .pyc (worker/driver/bytecode_pack.py;
// format in docs/BUNDLE.md).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace agentix::bundler {

// The pack's file name, in the stdlib's __pycache__ directory (the worker
// reads the same name).
inline constexpr char kBytecodePackName[] = "agentix-stdlib.pack";

struct BytecodePackReport {
  size_t modules = 0;
  size_t bytes = 0;
};

// Writes `<stdlib_dir>/__pycache__/agentix-stdlib.pack` for the staged
// stdlib `stdlib_dir` (after its bytecode is compiled). `python` finds which
// modules the list in bytecode_pack.cc imports; a module is packed only if
// its staged .pyc is the unchecked-hash bytecode of the staged source beside
// it, so the pack never serves other code than the path finder would load.
absl::StatusOr<BytecodePackReport> WriteBytecodePack(
    const std::string& python, const std::string& stdlib_dir);

}  // namespace agentix::bundler
