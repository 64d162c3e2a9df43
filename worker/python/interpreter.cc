#include "worker/python/interpreter.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "worker/python/py_error.h"

namespace agentix::worker {
namespace {

// The prefix Debian's libpython3.11 was configured with.
constexpr char kBuildPrefix[] = "/usr";

absl::Status FromPyStatus(const PyStatus& status, absl::string_view step) {
  if (!PyStatus_Exception(status)) return absl::OkStatus();
  if (PyStatus_IsExit(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Python initialisation (", step, ") exited with code ",
        status.exitcode));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "Python initialisation failed (", step, ")",
      status.func != nullptr ? absl::StrCat(" in ", status.func) : "", ": ",
      status.err_msg != nullptr ? status.err_msg : "unknown error"));
}

// Owns a PyConfig so that PyConfig_Clear runs on every path.
class ConfigGuard {
 public:
  ConfigGuard() { PyConfig_InitIsolatedConfig(&config_); }
  ConfigGuard(const ConfigGuard&) = delete;
  ConfigGuard& operator=(const ConfigGuard&) = delete;
  ~ConfigGuard() { PyConfig_Clear(&config_); }
  PyConfig* get() { return &config_; }

 private:
  PyConfig config_;
};

absl::Status SetString(PyConfig* config, wchar_t** field,
                       const std::string& value, absl::string_view name) {
  return FromPyStatus(PyConfig_SetBytesString(config, field, value.c_str()),
                      absl::StrCat("setting ", name));
}

absl::Status AppendPath(PyConfig* config, const std::string& path) {
  // PyWideStringList_Append needs a wide string; decode as CPython would.
  wchar_t* wide = Py_DecodeLocale(path.c_str(), nullptr);
  if (wide == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot decode path '", path, "'"));
  }
  PyStatus status = PyWideStringList_Append(&config->module_search_paths, wide);
  PyMem_RawFree(wide);
  return FromPyStatus(status, "appending to module_search_paths");
}

// Gives the frozen stdlib modules the __file__ they have under
// /usr/bin/python3: sets sys._stdlib_dir (frozen modules imported from now
// on get it from FrozenImporter), and fixes up those imported during
// initialisation the way FrozenImporter would have (its own
// _resolve_filename; _frozen_importlib itself has none there either).
constexpr char kFixUpFrozen[] = R"PY(
import sys
from _frozen_importlib import FrozenImporter

sys._stdlib_dir = stdlib
for name, module in list(sys.modules.items()):
    spec = getattr(module, "__spec__", None)
    if (name == "_frozen_importlib" or spec is None
            or spec.loader is not FrozenImporter
            or hasattr(module, "__file__")):
        continue
    state = spec.loader_state
    origname = getattr(state, "origname", None)
    if not origname or getattr(state, "filename", None):
        continue
    ispkg = spec.submodule_search_locations is not None
    filename, pkgdir = FrozenImporter._resolve_filename(origname, name, ispkg)
    state.filename = filename
    module.__file__ = filename
    if ispkg and pkgdir and pkgdir not in spec.submodule_search_locations:
        spec.submodule_search_locations.insert(0, pkgdir)
)PY";

absl::Status FixUpFrozenModules(const std::string& stdlib_dir) {
  PyObject* globals = PyDict_New();
  PyObject* dir = PyUnicode_DecodeFSDefault(stdlib_dir.c_str());
  if (globals == nullptr || dir == nullptr ||
      PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) !=
          0 ||
      PyDict_SetItemString(globals, "stdlib", dir) != 0) {
    Py_XDECREF(globals);
    Py_XDECREF(dir);
    PyErr_Clear();
    return absl::InternalError("cannot set up the frozen modules' fix-up");
  }
  Py_DECREF(dir);
  PyObject* done = PyRun_String(kFixUpFrozen, Py_file_input, globals, globals);
  Py_DECREF(globals);
  if (done == nullptr) {
    PythonError error = FetchPythonError();
    return absl::FailedPreconditionError(absl::StrCat(
        "fixing up the frozen stdlib modules: ", error.type, ": ",
        error.message));
  }
  Py_DECREF(done);
  return absl::OkStatus();
}

}  // namespace

std::string LinkedPythonVersion() {
  return absl::StrCat(PY_MAJOR_VERSION, ".", PY_MINOR_VERSION);
}

std::string DefaultPythonHome() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&Py_InitializeFromConfig), &info) != 0 &&
      info.dli_fname != nullptr) {
    return FindPythonHome(info.dli_fname, LinkedPythonVersion(), kBuildPrefix);
  }
  return kBuildPrefix;
}

absl::Status InitializeInterpreter(const PythonPaths& paths,
                                   const std::string& program_name) {
  // Pre-initialisation fixes the text encodings before anything decodes a
  // path. UTF-8 mode makes the worker independent of the (often "C") locale
  // the daemon passes down.
  PyPreConfig preconfig;
  PyPreConfig_InitIsolatedConfig(&preconfig);
  preconfig.utf8_mode = 1;
  absl::Status status =
      FromPyStatus(Py_PreInitialize(&preconfig), "pre-initialisation");
  if (!status.ok()) return status;

  ConfigGuard guard;
  PyConfig* config = guard.get();
  config->install_signal_handlers = 0;  // C++ and the daemon own signals
  config->parse_argv = 0;
  config->safe_path = 1;       // never put the cwd or a script dir first
  config->buffered_stdio = 0;  // user output reaches fd 1/2 promptly
  config->pathconfig_warnings = 0;
  config->user_site_directory = 0;
  // site.py adds the venv's site-packages (and, for
  // include-system-site-packages venvs, Debian's dist-packages) after our
  // explicit entries, and runs .pth files.
  config->site_import = 1;
  // The stdlib modules deep-frozen into libpython (os, site, codecs, io,
  // abc, stat, posixpath, ...) are used as /usr/bin/python3 uses them: no
  // file read or unmarshal, ~4 ms of CPU off every worker start on the
  // loaded VM (~15% of the interpreter's own start; issue 25, cold start).
  // With an explicit home and search path, 3.11's getpath leaves
  // sys._stdlib_dir unset, so they would have no __file__:
  // FixUpFrozenModules sets it once the interpreter is up.
  config->use_frozen_modules = 1;

  status = SetString(config, &config->home, paths.home, "home");
  if (!status.ok()) return status;
  status = SetString(config, &config->executable, paths.executable,
                     "executable");
  if (!status.ok()) return status;
  status = SetString(config, &config->program_name, paths.executable,
                     "program_name");
  if (!status.ok()) return status;
  config->module_search_paths_set = 1;
  for (const std::string& path : paths.module_search_paths) {
    status = AppendPath(config, path);
    if (!status.ok()) return status;
  }
  const std::string argv0 = program_name.empty() ? "agentix-worker"
                                                 : program_name;
  char* argv[] = {const_cast<char*>(argv0.c_str())};
  status = FromPyStatus(PyConfig_SetBytesArgv(config, 1, argv), "argv");
  if (!status.ok()) return status;
  status = FromPyStatus(Py_InitializeFromConfig(config),
                        "Py_InitializeFromConfig");
  if (!status.ok()) return status;
  return FixUpFrozenModules(
      absl::StrCat(paths.home, "/lib/python", LinkedPythonVersion()));
}

}  // namespace agentix::worker
