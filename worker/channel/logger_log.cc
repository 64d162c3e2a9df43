#include "worker/channel/logger_log.h"

#include <climits>
#include <cstring>
#include <initializer_list>

#include "worker/channel/py_args.h"

namespace agentix::worker {
namespace {

// Logger's methods the C _log does itself while they are the stdlib's (the
// first kMethods names), then the names it reads.
enum Name {
  kFindCaller,
  kMakeRecord,
  kHandle,
  kFilter,
  kCallHandlers,
  kMethods,
  kSrcfile = kMethods,
  kRecordFactory,
  kCurrentFrame,
  kIsInternalFrame,
  kOs,
  kPath,
  kNormcase,
  kLoggerName,
  kDisabled,
  kFilters,
  kHandlers,
  kLevelno,
  kLevel,  // also _log's first parameter
  kPropagate,
  kParent,
  kMsg,
  kArgs,
  kExcInfo,
  kExtra,
  kStackInfo,
  kStacklevel,
  kImportlib,
  kBootstrap,
  kUnknownFile,
  kUnknownFunction,
  kLogName,
  kIsEnabledFor,
  kCache,
  kSelf,
  // The level methods (kLevelMethods of them, in LevelMethod's order), then
  // the levels of the first five.
  kDebugName,
  kInfoName,
  kWarningName,
  kErrorName,
  kCriticalName,
  kLogCallName,
  kDebugLevel,
  kInfoLevel,
  kWarningLevel,
  kErrorLevel,
  kCriticalLevel,
  kNames
};
constexpr const char* kNameStrings[kNames] = {"findCaller",
                                              "makeRecord",
                                              "handle",
                                              "filter",
                                              "callHandlers",
                                              "_srcfile",
                                              "_logRecordFactory",
                                              "currentframe",
                                              "_is_internal_frame",
                                              "os",
                                              "path",
                                              "normcase",
                                              "name",
                                              "disabled",
                                              "filters",
                                              "handlers",
                                              "levelno",
                                              "level",
                                              "propagate",
                                              "parent",
                                              "msg",
                                              "args",
                                              "exc_info",
                                              "extra",
                                              "stack_info",
                                              "stacklevel",
                                              "importlib",
                                              "_bootstrap",
                                              "(unknown file)",
                                              "(unknown function)",
                                              "_log",
                                              "isEnabledFor",
                                              "_cache",
                                              "self",
                                              "debug",
                                              "info",
                                              "warning",
                                              "error",
                                              "critical",
                                              "log",
                                              "DEBUG",
                                              "INFO",
                                              "WARNING",
                                              "ERROR",
                                              "CRITICAL"};

// Logger.debug ... critical (`if self.isEnabledFor(LEVEL): self._log(LEVEL,
// msg, args, **kwargs)`) and Logger.log (the level its first argument).
enum LevelMethod {
  kDebugCall,
  kInfoCall,
  kWarningCall,
  kErrorCall,
  kCriticalCall,
  kLogCall,
  kLevelMethods
};

// _log(self, level, msg, args, exc_info=None, extra=None, stack_info=False,
// stacklevel=1): its parameters in order and their names.
enum Param {
  pLevel,
  pMsg,
  pArgs,
  pExcInfo,
  pExtra,
  pStackInfo,
  pStacklevel,
  kParams
};
constexpr Name kParamNames[kParams] = {kLevel, kMsg,       kArgs,      kExcInfo,
                                       kExtra, kStackInfo, kStacklevel};

// What install_logger_log found: the stdlib's pieces the C path stands in
// for while they stay the same. GIL-guarded; kept for the process.
struct Stdlib {
  PyObject* logger_type = nullptr;
  PyObject* python_log = nullptr;
  PyObject* methods[kMethods] = {};
  PyObject* globals = nullptr;  // logging's
  PyObject* current_frame = nullptr;
  PyObject* is_internal_frame = nullptr;
  PyObject* os_module = nullptr;
  PyObject* normcase = nullptr;
  PyObject* srcfile =
      nullptr;  // logging's own file (its functions' co_filename)
  PyObject* zero = nullptr;
  PyObject* names[kNames] = {};
  PyObject* c_log = nullptr;  // the descriptor installed as Logger._log
  PyObject* is_enabled_for = nullptr;
  PyObject* level_methods[kLevelMethods] = {};  // the stdlib's
};

Stdlib* installed = nullptr;

// Set once an audit hook may exist: the stdlib's findCaller raises
// "sys._getframe" (its currentframe), which a hook sees and may refuse; the
// C path has no such frame to show it, so it declines from then on.
// GIL-guarded.
bool audit_hooks = false;

// An audit hook of our own (added at install, before any user code): it
// notes each hook added after it, by sys.addaudithook or
// PySys_AddAuditHook, both announced as "sys.addaudithook".
int NoteAuditHooks(const char* event, PyObject* /*args*/, void* /*data*/) {
  if (std::strcmp(event, "sys.addaudithook") == 0) audit_hooks = true;
  return 0;
}

// fn(self, *args, **kwargs) for a vectorcall's arguments: the stdlib's
// method the C one stands in for, called as given.
PyObject* CallWithSelf(PyObject* fn, PyObject* self, PyObject* const* args,
                       Py_ssize_t nargs, PyObject* kwnames) {
  const Py_ssize_t total =
      nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  PyObject* small[12];
  PyObject** argv = total < 12 ? small : PyMem_New(PyObject*, total + 1);
  if (argv == nullptr) return PyErr_NoMemory();
  argv[0] = self;
  if (total > 0) std::memcpy(argv + 1, args, total * sizeof(PyObject*));
  PyObject* result = PyObject_Vectorcall(fn, argv, nargs + 1, kwnames);
  if (argv != small) PyMem_Free(argv);
  return result;
}

// 1 if `self` has one of `names` in its instance dict (overriding the
// class's method), 0 if not, -1 error.
int InInstance(PyObject* self, std::initializer_list<PyObject*> names) {
  PyObject** dict = _PyObject_GetDictPtr(self);
  if (dict == nullptr || *dict == nullptr) return 0;
  for (PyObject* name : names) {
    if (PyDict_GetItemWithError(*dict, name) != nullptr) return 1;
    if (PyErr_Occurred()) return -1;
  }
  return 0;
}

// module.name for a plain module (its dict: no __getattr__ to consult when
// the name is there), borrowed; nullptr when absent (no error set) or not a
// plain module.
PyObject* ModuleGlobal(PyObject* module, PyObject* name) {
  if (module == nullptr || !PyModule_CheckExact(module)) return nullptr;
  PyObject* value = PyDict_GetItemWithError(PyModule_GetDict(module), name);
  if (value == nullptr) PyErr_Clear();
  return value;
}

// _log's parameters from a vectorcall (borrowed; nullptr: the default).
// False for anything Python would reject or bind differently (too many,
// unknown or repeated names, a required one missing): the stdlib's _log
// says what is wrong.
bool Bind(const Stdlib& s, PyObject* const* args, Py_ssize_t nargs,
          PyObject* kwnames, PyObject* (&out)[kParams]) {
  if (nargs > kParams) return false;
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int slot = -1;
    for (int p = 0; p < kParams && slot < 0; ++p) {
      PyObject* name = s.names[kParamNames[p]];
      if (key == name || PyUnicode_Compare(key, name) == 0) slot = p;
    }
    if (PyErr_Occurred()) PyErr_Clear();
    if (slot < 0 || out[slot] != nullptr) return false;
    out[slot] = args[nargs + k];
  }
  return out[pLevel] != nullptr && out[pMsg] != nullptr &&
         out[pArgs] != nullptr;
}

bool NoneOrFalse(PyObject* value) {
  return value == nullptr || value == Py_None || value == Py_False;
}

enum Verdict { kError = -1, kDecline = 0, kUse = 1 };

// Whether the C path does this call: the logger's class and instance use
// the stdlib's methods, the arguments are the common ones, and what
// findCaller and makeRecord read from logging is as installed.
// `find_caller`: logging._srcfile is set (as the stdlib's `if _srcfile`).
Verdict Check(const Stdlib& s, PyObject* self, PyObject* const (&a)[kParams],
              long& stacklevel, bool& find_caller) {
  if (!NoneOrFalse(a[pExcInfo]) || !NoneOrFalse(a[pStackInfo])) return kDecline;
  stacklevel = 1;
  if (a[pStacklevel] != nullptr) {
    if (!PyLong_CheckExact(a[pStacklevel])) return kDecline;
    int overflow = 0;
    stacklevel = PyLong_AsLongAndOverflow(a[pStacklevel], &overflow);
    if (overflow > 0)
      stacklevel = LONG_MAX;  // past any stack: the outermost frame
    if (overflow < 0 || stacklevel < 1) return kDecline;
  }
  PyTypeObject* type = Py_TYPE(self);
  // A class with its own __getattribute__ / __getattr__ may answer
  // self.findCaller etc. with something else.
  if (type->tp_getattro != PyObject_GenericGetAttr) return kDecline;
  for (int m = 0; m < kMethods; ++m) {
    if (_PyType_Lookup(type, s.names[m]) != s.methods[m]) return kDecline;
  }
  const int found = InInstance(
      self, {s.names[kFindCaller], s.names[kMakeRecord], s.names[kHandle],
             s.names[kFilter], s.names[kCallHandlers]});
  if (found != 0) return found < 0 ? kError : kDecline;
  PyObject* srcfile = PyDict_GetItemWithError(s.globals, s.names[kSrcfile]);
  if (srcfile == nullptr) return PyErr_Occurred() ? kError : kDecline;
  find_caller = srcfile != Py_None;
  if (find_caller) {
    // Only logging's own file, as a str: its frames (and the _log and
    // findCaller frames the C path does not have) are the ones skipped.
    if (!PyUnicode_CheckExact(srcfile)) return kDecline;
    if (PyUnicode_GET_LENGTH(srcfile) == 0) {
      find_caller = false;
    } else if (PyUnicode_Compare(srcfile, s.srcfile) != 0) {
      return kDecline;
    }
  }
  if (find_caller) {
    if (audit_hooks) return kDecline;
    if (PyDict_GetItemWithError(s.globals, s.names[kCurrentFrame]) !=
            s.current_frame ||
        PyDict_GetItemWithError(s.globals, s.names[kIsInternalFrame]) !=
            s.is_internal_frame ||
        PyDict_GetItemWithError(s.globals, s.names[kOs]) != s.os_module) {
      return PyErr_Occurred() ? kError : kDecline;
    }
    if (ModuleGlobal(ModuleGlobal(s.os_module, s.names[kPath]),
                     s.names[kNormcase]) != s.normcase) {
      return kDecline;
    }
  }
  if (a[pExtra] == nullptr || a[pExtra] == Py_None) {
    if (PyDict_GetItemWithError(s.globals, s.names[kRecordFactory]) ==
        nullptr) {
      return PyErr_Occurred() ? kError : kDecline;
    }
  }
  return kUse;
}

// _is_internal_frame(frame): logging's own file, or importlib's bootstrap.
Verdict Internal(const Stdlib& s, PyObject* filename, bool& internal) {
  if (!PyUnicode_CheckExact(filename)) return kDecline;
  if (PyUnicode_Compare(filename, s.srcfile) == 0) {
    internal = true;
    return kUse;
  }
  const int importlib = PyUnicode_Contains(filename, s.names[kImportlib]);
  if (importlib < 0) return kError;
  const int bootstrap =
      importlib ? PyUnicode_Contains(filename, s.names[kBootstrap]) : 0;
  if (bootstrap < 0) return kError;
  internal = bootstrap == 1;
  return kUse;
}

// findCaller(False, stacklevel) for a _log called from the current Python
// frame: (filename, lineno, function name) as new references. The stdlib
// starts at findCaller's own frame and skips _log's (both logging's): the
// first frame it examines is _log's caller, the current frame here.
Verdict FindCaller(const Stdlib& s, long stacklevel, PyObject*& filename,
                   PyObject*& lineno, PyObject*& function) {
  PyFrameObject* frame = PyEval_GetFrame();
  if (frame == nullptr) return kDecline;  // called from C with no frame
  Py_INCREF(frame);
  PyCodeObject* code = nullptr;
  Verdict verdict = kUse;
  while (true) {
    Py_XDECREF(code);
    code = PyFrame_GetCode(frame);
    bool internal = false;
    verdict = Internal(s, code->co_filename, internal);
    if (verdict != kUse) break;
    if (!internal && --stacklevel == 0) break;
    PyFrameObject* back = PyFrame_GetBack(frame);
    if (back == nullptr) break;  // the outermost frame: the stdlib stops there
    Py_DECREF(frame);
    frame = back;
  }
  if (verdict == kUse) {
    const int line = PyFrame_GetLineNumber(frame);
    lineno = line < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(line);
    if (lineno == nullptr) verdict = kError;
    filename = Py_NewRef(code->co_filename);
    function = Py_NewRef(code->co_name);
  }
  Py_DECREF(code);
  Py_DECREF(frame);
  return verdict;
}

// self.makeRecord(self.name, level, fn, lno, msg, args, exc_info, func,
// extra, sinfo=None): the factory called directly when there are no extras.
PyObject* MakeRecord(const Stdlib& s, PyObject* self,
                     PyObject* const (&a)[kParams], PyObject* filename,
                     PyObject* lineno, PyObject* function) {
  PyObject* name = PyObject_GetAttr(self, s.names[kLoggerName]);
  if (name == nullptr) return nullptr;
  PyObject* exc_info = a[pExcInfo] != nullptr ? a[pExcInfo] : Py_None;
  PyObject* record = nullptr;
  if (a[pExtra] == nullptr || a[pExtra] == Py_None) {
    PyObject* factory =
        PyDict_GetItemWithError(s.globals, s.names[kRecordFactory]);
    if (factory != nullptr) {
      Py_INCREF(factory);
      PyObject* argv[9] = {name,     a[pLevel], filename, lineno, a[pMsg],
                           a[pArgs], exc_info,  function, Py_None};
      record = PyObject_Vectorcall(factory, argv, 9, nullptr);
      Py_DECREF(factory);
    } else if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_NameError,
                      "name '_logRecordFactory' is not defined");
    }
  } else {
    PyObject* argv[11] = {self,     name,      a[pLevel], filename,
                          lineno,   a[pMsg],   a[pArgs],  exc_info,
                          function, a[pExtra], Py_None};
    record = PyObject_Vectorcall(s.methods[kMakeRecord], argv, 11, nullptr);
  }
  Py_DECREF(name);
  return record;
}

// 1 if `filters` is an empty list: Filterer.filter would return True
// without a Python frame.
bool NoFilters(PyObject* filters) {
  return PyList_CheckExact(filters) && PyList_GET_SIZE(filters) == 0;
}

// Whether `self.disabled` is true: 1, 0, or -1 with an error set (read by
// both handle and isEnabledFor).
int Disabled(const Stdlib& s, PyObject* self) {
  PyObject* disabled = PyObject_GetAttr(self, s.names[kDisabled]);
  if (disabled == nullptr) return -1;
  const int off = PyObject_IsTrue(disabled);
  Py_DECREF(disabled);
  return off;
}

// self.handle(record): `if (not self.disabled) and self.filter(record):
// self.callHandlers(record)`, callHandlers' walk done here.
int Handle(const Stdlib& s, PyObject* self, PyObject* record) {
  const int off = Disabled(s, self);
  if (off != 0) return off < 0 ? -1 : 0;
  PyObject* filters = PyObject_GetAttr(self, s.names[kFilters]);
  if (filters == nullptr) return -1;
  const bool none = NoFilters(filters);
  Py_DECREF(filters);
  if (!none) {
    PyObject* argv[2] = {self, record};
    PyObject* kept = PyObject_Vectorcall(s.methods[kFilter], argv, 2, nullptr);
    if (kept == nullptr) return -1;
    const int truth = PyObject_IsTrue(kept);
    Py_DECREF(kept);
    if (truth <= 0) return truth;
  }
  // callHandlers: each logger's handlers in turn, up the parents while
  // they propagate.
  long found = 0;
  PyObject* logger = Py_NewRef(self);
  while (true) {
    const int present = PyObject_IsTrue(logger);
    if (present <= 0) {
      Py_DECREF(logger);
      if (present < 0) return -1;
      break;
    }
    PyObject* handlers = PyObject_GetAttr(logger, s.names[kHandlers]);
    PyObject* iter = handlers != nullptr ? PyObject_GetIter(handlers) : nullptr;
    Py_XDECREF(handlers);
    if (iter == nullptr) {
      Py_DECREF(logger);
      return -1;
    }
    PyObject* handler;
    while ((handler = PyIter_Next(iter)) != nullptr) {
      ++found;
      PyObject* levelno = PyObject_GetAttr(record, s.names[kLevelno]);
      PyObject* level = levelno != nullptr
                            ? PyObject_GetAttr(handler, s.names[kLevel])
                            : nullptr;
      int meets = level != nullptr
                      ? PyObject_RichCompareBool(levelno, level, Py_GE)
                      : -1;
      Py_XDECREF(levelno);
      Py_XDECREF(level);
      if (meets > 0) {
        PyObject* argv[3] = {nullptr, handler, record};
        PyObject* handled = PyObject_VectorcallMethod(
            s.names[kHandle], argv + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
            nullptr);
        if (handled == nullptr) meets = -1;
        Py_XDECREF(handled);
      }
      Py_DECREF(handler);
      if (meets < 0) break;
    }
    Py_DECREF(iter);
    if (PyErr_Occurred()) {
      Py_DECREF(logger);
      return -1;
    }
    PyObject* propagate = PyObject_GetAttr(logger, s.names[kPropagate]);
    const int up = propagate != nullptr ? PyObject_IsTrue(propagate) : -1;
    Py_XDECREF(propagate);
    if (up <= 0) {
      Py_DECREF(logger);
      if (up < 0) return -1;
      break;
    }
    PyObject* parent = PyObject_GetAttr(logger, s.names[kParent]);
    Py_DECREF(logger);
    if (parent == nullptr) return -1;
    logger = parent;
  }
  if (found == 0) {
    // No handler anywhere: the stdlib's callHandlers (lastResort, or its
    // one-off "No handlers could be found" line) walks the same empty tree.
    PyObject* argv[2] = {self, record};
    PyObject* done =
        PyObject_Vectorcall(s.methods[kCallHandlers], argv, 2, nullptr);
    if (done == nullptr) return -1;
    Py_DECREF(done);
  }
  return 0;
}

PyObject* LoggerLog(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                    PyObject* kwnames) {
  const Stdlib& s = *installed;  // the descriptor exists only once installed
  PyObject* a[kParams] = {};
  long stacklevel = 1;
  bool find_caller = false;
  if (!Bind(s, args, nargs, kwnames, a)) {
    return CallWithSelf(s.python_log, self, args, nargs, kwnames);
  }
  const Verdict usable = Check(s, self, a, stacklevel, find_caller);
  if (usable == kError) return nullptr;
  PyObject* filename = nullptr;
  PyObject* lineno = nullptr;
  PyObject* function = nullptr;
  Verdict found = usable;
  if (usable == kUse) {
    if (find_caller) {
      found = FindCaller(s, stacklevel, filename, lineno, function);
    } else {
      filename = Py_NewRef(s.names[kUnknownFile]);
      lineno = Py_NewRef(s.zero);
      function = Py_NewRef(s.names[kUnknownFunction]);
    }
  }
  if (found == kError) return nullptr;
  if (found == kDecline)
    return CallWithSelf(s.python_log, self, args, nargs, kwnames);
  PyObject* record = MakeRecord(s, self, a, filename, lineno, function);
  Py_DECREF(filename);
  Py_DECREF(lineno);
  Py_DECREF(function);
  if (record == nullptr) return nullptr;
  const int handled = Handle(s, self, record);
  Py_DECREF(record);
  if (handled < 0) return nullptr;
  Py_RETURN_NONE;
}

// Whether a level method does this call in C: the arguments bind as the
// Python method's would (no keyword naming one of its parameters), the
// level is an int, and isEnabledFor and _log are the stdlib's and ours.
// `level` borrowed.
Verdict CheckLevelCall(const Stdlib& s, LevelMethod m, PyObject* self,
                       PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames, PyObject*& level) {
  const Py_ssize_t fixed = m == kLogCall ? 2 : 1;
  if (nargs < fixed) return kDecline;
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    for (Name taken : {kSelf, kMsg, kLevel}) {
      if (taken == kLevel && m != kLogCall) continue;
      if (key == s.names[taken] ||
          PyUnicode_Compare(key, s.names[taken]) == 0) {
        return kDecline;
      }
    }
  }
  if (m == kLogCall) {
    level = args[0];
    if (!PyLong_CheckExact(level)) return kDecline;
  } else {
    level = PyDict_GetItemWithError(s.globals, s.names[kDebugLevel + m]);
    if (level == nullptr) return PyErr_Occurred() ? kError : kDecline;
  }
  PyTypeObject* type = Py_TYPE(self);
  if (type->tp_getattro != PyObject_GenericGetAttr ||
      _PyType_Lookup(type, s.names[kIsEnabledFor]) != s.is_enabled_for ||
      _PyType_Lookup(type, s.names[kLogName]) != s.c_log) {
    return kDecline;
  }
  const int found =
      InInstance(self, {s.names[kIsEnabledFor], s.names[kLogName]});
  if (found != 0) return found < 0 ? kError : kDecline;
  return kUse;
}

// isEnabledFor(level): `self.disabled`, then the logger's `_cache`; a level
// not cached yet goes to the stdlib's isEnabledFor (it fills the cache).
int IsEnabledFor(const Stdlib& s, PyObject* self, PyObject* level) {
  const int off = Disabled(s, self);
  if (off != 0) return off < 0 ? -1 : 0;
  PyObject* cache = PyObject_GetAttr(self, s.names[kCache]);
  if (cache == nullptr) return -1;
  PyObject* enabled = nullptr;
  if (PyDict_CheckExact(cache)) {
    enabled = Py_XNewRef(PyDict_GetItemWithError(cache, level));
  }
  Py_DECREF(cache);
  if (enabled == nullptr) {
    if (PyErr_Occurred()) return -1;
    PyObject* argv[2] = {self, level};
    enabled = PyObject_Vectorcall(s.is_enabled_for, argv, 2, nullptr);
    if (enabled == nullptr) return -1;
  }
  const int truth = PyObject_IsTrue(enabled);
  Py_DECREF(enabled);
  return truth;
}

template <LevelMethod M>
PyObject* AtLevel(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                  PyObject* kwnames) {
  const Stdlib& s = *installed;
  PyObject* level = nullptr;
  const Verdict usable =
      CheckLevelCall(s, M, self, args, nargs, kwnames, level);
  if (usable == kError) return nullptr;
  if (usable == kDecline)
    return CallWithSelf(s.level_methods[M], self, args, nargs, kwnames);
  Py_INCREF(level);  // a global: held while user code runs
  const int enabled = IsEnabledFor(s, self, level);
  if (enabled <= 0) {
    Py_DECREF(level);
    if (enabled < 0) return nullptr;
    Py_RETURN_NONE;
  }
  if (PyEval_GetFrame() == nullptr) {
    // Called with no Python frame (a thread started on the method itself,
    // an atexit callback): the stdlib's caller is then its own level
    // method's frame, the outermost, which only that method has.
    Py_DECREF(level);
    return CallWithSelf(s.level_methods[M], self, args, nargs, kwnames);
  }
  // self._log(level, msg, args, **kwargs)
  const Py_ssize_t fixed = M == kLogCall ? 2 : 1;
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject* rest = PyTuple_New(nargs - fixed);
  if (rest == nullptr) {
    Py_DECREF(level);
    return nullptr;
  }
  for (Py_ssize_t i = fixed; i < nargs; ++i) {
    PyTuple_SET_ITEM(rest, i - fixed, Py_NewRef(args[i]));
  }
  PyObject* small[12];
  PyObject** argv = 3 + nkw <= 12 ? small : PyMem_New(PyObject*, 3 + nkw);
  PyObject* result = nullptr;
  if (argv == nullptr) {
    PyErr_NoMemory();
  } else {
    argv[0] = level;
    argv[1] = args[fixed - 1];
    argv[2] = rest;
    if (nkw > 0) std::memcpy(argv + 3, args + nargs, nkw * sizeof(PyObject*));
    result = LoggerLog(self, argv, 3, kwnames);
    if (argv != small) PyMem_Free(argv);
  }
  Py_DECREF(rest);
  Py_DECREF(level);
  return result;
}

PyMethodDef kLevelDefs[kLevelMethods] = {
    {"debug", FastKeywords<AtLevel<kDebugCall>>(),
     METH_FASTCALL | METH_KEYWORDS,
     "debug($self, msg, *args, **kwargs)\n--\n\n"
     "The stdlib's Logger.debug in C (agentix worker)."},
    {"info", FastKeywords<AtLevel<kInfoCall>>(), METH_FASTCALL | METH_KEYWORDS,
     "info($self, msg, *args, **kwargs)\n--\n\n"
     "The stdlib's Logger.info in C (agentix worker)."},
    {"warning", FastKeywords<AtLevel<kWarningCall>>(),
     METH_FASTCALL | METH_KEYWORDS,
     "warning($self, msg, *args, **kwargs)\n--\n\n"
     "The stdlib's Logger.warning in C (agentix worker)."},
    {"error", FastKeywords<AtLevel<kErrorCall>>(),
     METH_FASTCALL | METH_KEYWORDS,
     "error($self, msg, *args, **kwargs)\n--\n\n"
     "The stdlib's Logger.error in C (agentix worker)."},
    {"critical", FastKeywords<AtLevel<kCriticalCall>>(),
     METH_FASTCALL | METH_KEYWORDS,
     "critical($self, msg, *args, **kwargs)\n--\n\n"
     "The stdlib's Logger.critical in C (agentix worker)."},
    {"log", FastKeywords<AtLevel<kLogCall>>(), METH_FASTCALL | METH_KEYWORDS,
     "log($self, level, msg, *args, **kwargs)\n--\n\n"
     "The stdlib's Logger.log in C (agentix worker)."},
};

PyMethodDef kLogDef = {
    "_log", FastKeywords<LoggerLog>(), METH_FASTCALL | METH_KEYWORDS,
    "_log($self, level, msg, args, exc_info=None, extra=None, "
    "stack_info=False, stacklevel=1)\n--\n\n"
    "The stdlib's Logger._log in C (agentix worker): the same record, found "
    "caller and handlers; anything unusual runs the stdlib's _log."};

// A Python function defined in logging's own file (co_filename `srcfile`).
bool LoggingFunction(PyObject* function, PyObject* srcfile) {
  if (function == nullptr || !PyFunction_Check(function)) return false;
  auto* code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(function));
  return PyUnicode_Compare(code->co_filename, srcfile) == 0;
}

// {name: the stdlib's method} for each method the C ones replace.
PyObject* Originals(const Stdlib& s) {
  PyObject* originals = PyDict_New();
  if (originals == nullptr) return nullptr;
  bool ok = PyDict_SetItem(originals, s.names[kLogName], s.python_log) == 0;
  for (int m = 0; m < kLevelMethods && ok; ++m) {
    ok = PyDict_SetItem(originals, s.names[kDebugName + m],
                        s.level_methods[m]) == 0;
  }
  if (!ok) Py_CLEAR(originals);
  return originals;
}

// Puts the stdlib's methods back on Logger (a failed install).
void Restore(const Stdlib& s) {
  PyObject_SetAttr(s.logger_type, s.names[kLogName], s.python_log);
  for (int m = 0; m < kLevelMethods; ++m) {
    PyObject_SetAttr(s.logger_type, s.names[kDebugName + m],
                     s.level_methods[m]);
  }
}

}  // namespace

PyObject* InstallLoggerLog(PyObject* /*module*/, PyObject* const* args,
                           Py_ssize_t nargs) {
  if (!CheckArgs("install_logger_log", nargs, 1)) return nullptr;
  if (installed != nullptr) return Originals(*installed);
  PyObject* logging = args[0];
  if (!PyModule_Check(logging)) {
    PyErr_SetString(PyExc_TypeError, "install_logger_log(logging)");
    return nullptr;
  }
  auto* s = new Stdlib;
  if (!InternAll(kNameStrings, kNames, s->names)) return nullptr;  // boot OOM
  s->logger_type = PyObject_GetAttrString(logging, "Logger");
  if (s->logger_type == nullptr) return nullptr;
  if (!PyType_Check(s->logger_type)) {
    PyErr_SetString(PyExc_TypeError, "logging.Logger is not a class");
    return nullptr;
  }
  auto* type = reinterpret_cast<PyTypeObject*>(s->logger_type);
  s->python_log = Py_XNewRef(_PyType_Lookup(type, s->names[kLogName]));
  if (s->python_log == nullptr || !PyFunction_Check(s->python_log)) {
    PyErr_SetString(PyExc_TypeError, "logging.Logger._log is not a function");
    return nullptr;
  }
  s->srcfile = Py_NewRef(
      reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(s->python_log))
          ->co_filename);
  for (int m = 0; m < kMethods; ++m) {
    s->methods[m] = Py_XNewRef(_PyType_Lookup(type, s->names[m]));
    if (!LoggingFunction(s->methods[m], s->srcfile)) {
      PyErr_Format(PyExc_TypeError, "logging.Logger.%U is not logging's",
                   s->names[m]);
      return nullptr;
    }
  }
  s->globals = Py_NewRef(PyModule_GetDict(logging));
  s->current_frame =
      Py_XNewRef(PyDict_GetItemWithError(s->globals, s->names[kCurrentFrame]));
  s->is_internal_frame = Py_XNewRef(
      PyDict_GetItemWithError(s->globals, s->names[kIsInternalFrame]));
  s->os_module = Py_XNewRef(PyDict_GetItemWithError(s->globals, s->names[kOs]));
  PyObject* path = s->os_module != nullptr
                       ? PyObject_GetAttr(s->os_module, s->names[kPath])
                       : nullptr;
  s->normcase =
      path != nullptr ? PyObject_GetAttr(path, s->names[kNormcase]) : nullptr;
  Py_XDECREF(path);
  // The C path takes a file name as its own normcase, as posixpath's does
  // (os.fspath of a str is the str).
  PyObject* same = s->normcase != nullptr
                       ? PyObject_CallOneArg(s->normcase, s->srcfile)
                       : nullptr;
  Py_XDECREF(same);
  if (s->current_frame == nullptr || s->is_internal_frame == nullptr ||
      same != s->srcfile) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError,
                      "logging's currentframe, _is_internal_frame or "
                      "os.path.normcase are not the stdlib's");
    }
    return nullptr;
  }
  s->is_enabled_for = Py_XNewRef(_PyType_Lookup(type, s->names[kIsEnabledFor]));
  if (!LoggingFunction(s->is_enabled_for, s->srcfile)) {
    PyErr_SetString(PyExc_TypeError,
                    "logging.Logger.isEnabledFor is not logging's");
    return nullptr;
  }
  for (int m = 0; m < kLevelMethods; ++m) {
    s->level_methods[m] =
        Py_XNewRef(_PyType_Lookup(type, s->names[kDebugName + m]));
    if (!LoggingFunction(s->level_methods[m], s->srcfile)) {
      PyErr_Format(PyExc_TypeError, "logging.Logger.%U is not logging's",
                   s->names[kDebugName + m]);
      return nullptr;
    }
  }
  s->zero = PyLong_FromLong(0);
  s->c_log = PyDescr_NewMethod(type, &kLogDef);
  if (s->zero == nullptr || s->c_log == nullptr) return nullptr;
  PyObject* levels[kLevelMethods] = {};
  for (int m = 0; m < kLevelMethods; ++m) {
    levels[m] = PyDescr_NewMethod(type, &kLevelDefs[m]);
    if (levels[m] == nullptr) {
      for (PyObject* made : levels) Py_XDECREF(made);
      return nullptr;
    }
  }
  // A hook that is there already and refuses ours: hooks exist.
  if (PySys_AddAuditHook(NoteAuditHooks, nullptr) < 0) {
    PyErr_Clear();
    audit_hooks = true;
  }
  // Installed before the attributes (the descriptors' calls read it); _log
  // first, as the level methods call it.
  installed = s;
  int set = PyObject_SetAttr(s->logger_type, s->names[kLogName], s->c_log);
  for (int m = 0; m < kLevelMethods && set == 0; ++m) {
    set = PyObject_SetAttr(s->logger_type, s->names[kDebugName + m], levels[m]);
  }
  for (PyObject* made : levels) Py_DECREF(made);
  if (set < 0) {
    // Back to the stdlib's, so that no half is left (the error stays set).
    PyObject *error_type, *error, *traceback;
    PyErr_Fetch(&error_type, &error, &traceback);
    Restore(*s);
    PyErr_Clear();
    PyErr_Restore(error_type, error, traceback);
    installed = nullptr;
    return nullptr;
  }
  // `s` is not freed on the failures above (a few references, at boot).
  return Originals(*s);
}

}  // namespace agentix::worker
