#include "worker/worker.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "worker/channel_module.h"
#include "worker/driver_source.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/python/interpreter.h"
#include "worker/python/py_error.h"

namespace agentix::worker {
namespace {

constexpr char kDriverModule[] = "_agentix_driver";

// Installs a meta-path importer that serves `_agentix_driver` and its modules
// from `files` (module name -> (filename, source, bytecode or None)), the
// files compiled into the binary, so they import each other as any package's
// modules do. The bytecode (marshalled at build time, //worker:driver_header)
// saves compiling ~2,000 lines at every start; without it (another Python's
// magic number) the source is compiled. spec.loader_state says which was
// used ("bytecode" or "source").
constexpr char kDriverBootstrap[] = R"PY(
import marshal
import sys
# importlib.machinery's ModuleSpec without importing importlib (and warnings)
# here: the driver's imports of them come after its bytecode pack is in place.
from _frozen_importlib import ModuleSpec


class _DriverImporter:
    def __init__(self, files):
        self._files = files

    def find_spec(self, fullname, path=None, target=None):
        entry = self._files.get(fullname)
        if entry is None:
            return None
        return ModuleSpec(fullname, self, origin=entry[0],
                          is_package="." not in fullname)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        spec = module.__spec__
        filename, source, bytecode = self._files[spec.name]
        if bytecode is not None:
            code = marshal.loads(bytecode)
            spec.loader_state = "bytecode"
        else:
            code = compile(source, filename, "exec")
            spec.loader_state = "source"
        exec(code, module.__dict__)


sys.meta_path.insert(0, _DriverImporter(files))
)PY";

// Tells the daemon why the worker cannot start. Best effort: with no daemon
// listening there is nobody to tell, so a failed write is only logged.
void SendBootError(int fd, const absl::Status& status) {
  AGX_LOG(Error, "worker boot failed: {}", std::string(status.message()));
  ipc::Frame frame;
  frame.type = ipc::FrameType::kBootError;
  frame.error.code = static_cast<int>(status.code());
  frame.error.type = "WorkerBootError";
  frame.error.message = std::string(status.message());
  if (auto tb = status.GetPayload(kTracebackPayloadUrl)) {
    frame.error.traceback = std::string(*tb);
  }
  std::string bytes;
  absl::Status encoded = ipc::AppendFrame(frame, bytes);
  if (encoded.ok()) encoded = ipc::WriteAll(fd, bytes);
  if (!encoded.ok()) {
    AGX_LOG(Error, "cannot send boot_error: {}",
            std::string(encoded.message()));
  }
}

// A boot failure from the pending Python exception.
absl::Status BootErrorFromPython(absl::string_view what) {
  PythonError error = FetchPythonError();
  absl::Status status(
      absl::StatusCode::kFailedPrecondition,
      absl::StrCat(what, ": ", error.type, ": ", error.message));
  if (!error.traceback.empty()) {
    status.SetPayload(kTracebackPayloadUrl, absl::Cord(error.traceback));
  }
  return status;
}

// Imports the embedded driver package (worker/driver/). Returns a new
// reference or nullptr with a Python error set.
PyObject* LoadDriver() {
  PyObject* files = PyDict_New();
  if (files == nullptr) return nullptr;
  const bool use_bytecode = PyImport_GetMagicNumber() == kDriverMagic;
  if (!use_bytecode) {
    AGX_LOG(Info, "the worker's Python has another bytecode magic number "
                  "than the build's; compiling the driver from source");
  }
  for (const DriverFile& file : kDriverFiles) {
    const std::string name = file.name;
    const std::string stem = name.substr(0, name.size() - 3);  // ".py"
    const std::string module = stem == "__init__"
                                   ? std::string(kDriverModule)
                                   : absl::StrCat(kDriverModule, ".", stem);
    const std::string filename =
        absl::StrCat("<agentix-worker driver/", name, ">");
    // Bytecode only for the Python it was compiled by (same magic number).
    PyObject* entry =
        use_bytecode
            ? Py_BuildValue("(ssy#)", filename.c_str(), file.source,
                            reinterpret_cast<const char*>(file.bytecode),
                            static_cast<Py_ssize_t>(file.bytecode_size))
            : Py_BuildValue("(ssO)", filename.c_str(), file.source, Py_None);
    if (entry == nullptr ||
        PyDict_SetItemString(files, module.c_str(), entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(files);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  PyObject* globals = PyDict_New();
  if (globals == nullptr ||
      PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) != 0 ||
      PyDict_SetItemString(globals, "files", files) != 0) {
    Py_XDECREF(globals);
    Py_DECREF(files);
    return nullptr;
  }
  Py_DECREF(files);
  PyObject* done =
      PyRun_String(kDriverBootstrap, Py_file_input, globals, globals);
  Py_DECREF(globals);
  if (done == nullptr) return nullptr;
  Py_DECREF(done);
  return PyImport_ImportModule(kDriverModule);
}

// Calls driver.main(fd, worker_id, payload_fd) and interprets its (code,
// clean) answer.
WorkerExit RunDriver(PyObject* driver, const WorkerOptions& options) {
  WorkerExit exit{kExitInternal, false};
  PyObject* result =
      PyObject_CallMethod(driver, "main", "isi", options.channel_fd,
                          options.worker_id.c_str(), options.payload_fd);
  if (result == nullptr) {
    PythonError error = FetchPythonError();
    AGX_LOG(Error, "worker driver failed: {}: {}\n{}", error.type,
            error.message, error.traceback);
    return exit;
  }
  int code = kExitInternal;
  int clean = 0;
  if (!PyArg_ParseTuple(result, "ip", &code, &clean)) {
    PythonError error = FetchPythonError();
    AGX_LOG(Error, "worker driver returned a bad exit value: {}",
            error.message);
  } else {
    exit.code = code;
    exit.finalize = clean != 0;
  }
  Py_DECREF(result);
  return exit;
}

}  // namespace

WorkerExit RunWorker(const WorkerOptions& options) {
  const int fd = options.channel_fd;
  // The channel must exist and must not leak into processes user code
  // spawns (they would keep the daemon's socket open after we exit).
  const int fd_flags = fcntl(fd, F_GETFD);
  if (fd_flags < 0) {
    AGX_LOG(Error, "frame channel fd {} is not open; was the worker started "
                   "by agentix-sandboxd?", fd);
    return {kExitBootError, false};
  }
  fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC);

  absl::Status status = RegisterChannelModule();
  if (!status.ok()) {
    SendBootError(fd, status);
    return {kExitBootError, false};
  }
  auto paths = ComputePythonPaths(options.paths, DefaultPythonHome(),
                                  LinkedPythonVersion());
  if (!paths.ok()) {
    SendBootError(fd, paths.status());
    return {kExitBootError, false};
  }
  AGX_LOG(Debug, "python home {}, executable {}, venv '{}'", paths->home,
          paths->executable, paths->venv);
  status = InitializeInterpreter(*paths, "agentix-worker");
  if (!status.ok()) {
    SendBootError(fd, absl::Status(status.code(),
                                   absl::StrCat(status.message(),
                                                " (python home ", paths->home,
                                                ")")));
    return {kExitBootError, false};
  }
  // From here on this thread holds the GIL.
  PyObject* driver = LoadDriver();
  if (driver == nullptr) {
    SendBootError(fd, BootErrorFromPython("cannot load the worker driver"));
    return {kExitBootError, false};
  }
  WorkerExit exit = RunDriver(driver, options);
  Py_DECREF(driver);
  return exit;
}

void FinalizeWorker(int budget_ms, int exit_code) {
  std::thread watchdog([budget_ms, exit_code] {
    pthread_setname_np(pthread_self(), "agx-finalize-wd");
    std::this_thread::sleep_for(std::chrono::milliseconds(budget_ms));
    AGX_LOG(Warning, "interpreter finalisation exceeded {} ms; exiting",
            budget_ms);
    _exit(exit_code);
  });
  watchdog.detach();
  if (Py_FinalizeEx() != 0) {
    AGX_LOG(Warning, "errors while finalising the interpreter");
  }
}

}  // namespace agentix::worker
