// Starts the embedded CPython with an isolated PyConfig (CONVENTIONS.md §4.1):
// no environment variables, no signal handlers, no argv parsing, no cwd on
// sys.path, unbuffered stdio, UTF-8 mode, and an explicit home plus module
// search path computed by path_config.h. Every PyStatus is checked and turned
// into an absl::Status, so a broken installation is reported, not crashed on.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "worker/python/path_config.h"

namespace agentix::worker {

// "<major>.<minor>" of the libpython this binary is linked against ("3.11").
std::string LinkedPythonVersion();

// The stdlib prefix to use when --python-home is absent: found from the
// location of the loaded libpython (FindPythonHome), else the prefix Debian's
// libpython3.11 was built for ("/usr").
std::string DefaultPythonHome();

// Initialises the interpreter on the calling thread, which then holds the GIL.
// Builtin modules must have been registered (PyImport_AppendInittab) before.
// `program_name` becomes sys.argv[0]. Call at most once per process.
// Errors: kFailedPrecondition with CPython's own message (e.g. "failed to get
// the Python codec of the filesystem encoding") when initialisation fails;
// the process must not touch Python afterwards.
absl::Status InitializeInterpreter(const PythonPaths& paths,
                                   const std::string& program_name);

}  // namespace agentix::worker
