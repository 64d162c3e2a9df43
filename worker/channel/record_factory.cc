#include "worker/channel/record_factory.h"

#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "worker/channel/py_args.h"

namespace agentix::worker {
namespace {

// LogRecord.__init__'s attributes, in the order it sets them, then ours.
enum RecordKey {
  kName,
  kMsg,
  kArgs,
  kLevelname,
  kLevelno,
  kPathname,
  kFilename,
  kModule,
  kExcInfo,
  kExcText,
  kStackInfo,
  kLineno,
  kFuncName,
  kCreated,
  kMsecs,
  kRelativeCreated,
  kThread,
  kThreadName,
  kProcessName,
  kProcess,
  kAgentixContext,
  kRecordKeys
};

// Names looked up per record: logging's globals and what hangs off them.
enum Name {
  kLogThreads,
  kLogMultiprocessing,
  kLogProcesses,
  kStartTime,
  kLevelToName,
  kGetLevelName,
  kThreading,
  kTime,
  kCurrentThread,
  kThreadNameAttr,
  kMultiprocessing,
  kCurrentProcess,
  kInit,
  kMainProcess,
  kActive,
  kGetIdent,
  kInitialized,
  kThreadNameField,
  kInstanceCheck,
  kNames
};

constexpr const char* kRecordKeyNames[kRecordKeys] = {
    "name",     "msg",          "args",       "levelname",       "levelno",
    "pathname", "filename",     "module",     "exc_info",        "exc_text",
    "stack_info", "lineno",     "funcName",   "created",         "msecs",
    "relativeCreated", "thread", "threadName", "processName",    "process",
    "agentix_context"};
constexpr const char* kNameStrings[kNames] = {
    "logThreads",  "logMultiprocessing", "logProcesses",   "_startTime",
    "_levelToName", "getLevelName",      "threading",      "time",
    "current_thread", "name",            "multiprocessing", "current_process",
    "__init__",    "MainProcess",       "_active",        "get_ident",
    "_initialized", "_name",            "__instancecheck__"};

// What set_log_record_factory configured. GIL-guarded; kept for the
// process (a worker configures it once at boot).
struct Factory {
  PyObject* factory = nullptr;
  PyObject* context = nullptr;
  PyObject* logging_globals = nullptr;
  // Set when `factory` is logging.LogRecord: what the C path relies on,
  // compared per record so that a later change takes the factory's path.
  PyTypeObject* record_type = nullptr;
  PyObject* init = nullptr;
  newfunc record_new = nullptr;
  PyObject* get_level_name = nullptr;
  PyObject* time_time = nullptr;
  PyObject* mapping = nullptr;  // collections.abc.Mapping
  // isinstance(x, Mapping) for x an exact int, str or float, as answered
  // under abc's cache token `token` (cleared by any ABC registration).
  PyObject* get_cache_token = nullptr;  // abc.get_cache_token
  PyObject* instance_check = nullptr;   // type(Mapping).__instancecheck__
  PyObject* token = nullptr;
  int scalar_is_mapping[3] = {-1, -1, -1};
  unsigned mapping_generation = 0;  // bumped by each reset
  // threading.current_thread().name read from threading._active while
  // these are threading's own.
  PyObject* threading = nullptr;
  PyObject* current_thread = nullptr;
  PyObject* get_ident = nullptr;
  PyObject* name_property = nullptr;  // threading.Thread.name
  PyObject* os_path = nullptr;
  // pathname -> (filename, module): os.path.basename / splitext of the same
  // code file, worked out once.
  PyObject* places = nullptr;
  PyObject* empty = nullptr;  // ()
  PyObject* keys[kRecordKeys] = {};
  PyObject* names[kNames] = {};
};

Factory* configured = nullptr;
constexpr Py_ssize_t kMaxPlaces = 1024;

// A global of the logging module (borrowed), nullptr if absent (no error
// set) or with an error set.
PyObject* Global(const Factory& f, Name name) {
  return PyDict_GetItemWithError(f.logging_globals, f.names[name]);
}

// 1 true, 0 false, -1 error (a missing global is an error: LogRecord's
// NameError).
int GlobalIsTrue(const Factory& f, Name name) {
  PyObject* value = Global(f, name);
  if (value == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_NameError, f.names[name]);
    return -1;
  }
  return PyObject_IsTrue(value);
}

// os.getpid() without a system call per record (getpid was ~1.6% of the
// calling thread): the pid changes only in a fork's child, whose atfork
// handler forgets it.
std::atomic<pid_t> cached_pid{0};

pid_t ProcessId() {
  pid_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    pid = getpid();
    cached_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

void ForgetPidInForkedChildren() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr,
                   [] { cached_pid.store(0, std::memory_order_relaxed); });
  });
}

// time.time() as CPython computes it from CLOCK_REALTIME.
double TimeNow() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t ns = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  if (ns % 1000000000 == 0) return static_cast<double>(ns / 1000000000);
  return static_cast<double>(ns) / 1e9;
}

// (filename, module) for `pathname` (exact str), borrowed from the cache.
// nullptr with an error set if os.path raised (the caller declines: the
// factory's own path handles it).
PyObject* Place(Factory& f, PyObject* pathname) {
  PyObject* place = PyDict_GetItemWithError(f.places, pathname);
  if (place != nullptr || PyErr_Occurred()) return place;
  PyObject* filename = PyObject_CallMethod(f.os_path, "basename", "O", pathname);
  if (filename == nullptr) return nullptr;
  PyObject* split = PyObject_CallMethod(f.os_path, "splitext", "O", filename);
  if (split == nullptr) {
    Py_DECREF(filename);
    return nullptr;
  }
  PyObject* module = PySequence_GetItem(split, 0);
  Py_DECREF(split);
  PyObject* made = Tuple({filename, module});
  if (made == nullptr) return nullptr;
  if (PyDict_GET_SIZE(f.places) >= kMaxPlaces) PyDict_Clear(f.places);
  const int stored = PyDict_SetItem(f.places, pathname, made);
  Py_DECREF(made);
  if (stored < 0) return nullptr;
  return PyDict_GetItemWithError(f.places, pathname);
}

// isinstance(value, collections.abc.Mapping). For an exact int, str or
// float the answer cannot change while abc's cache token stays the same
// (only an ABC registration changes what such a type is, and it bumps the
// token), so it is remembered under that token: the check's Python
// __instancecheck__ frame was ~2-3% of the calling thread.
int IsMapping(Factory& f, PyObject* value) {
  const int scalar = PyLong_CheckExact(value)      ? 0
                     : PyUnicode_CheckExact(value) ? 1
                     : PyFloat_CheckExact(value)   ? 2
                                                   : -1;
  if (scalar < 0 || f.get_cache_token == nullptr ||
      _PyType_Lookup(Py_TYPE(f.mapping), f.names[kInstanceCheck]) !=
          f.instance_check) {
    return PyObject_IsInstance(value, f.mapping);
  }
  PyObject* token = PyObject_CallNoArgs(f.get_cache_token);
  if (token == nullptr) return -1;
  const int same = f.token != nullptr
                       ? PyObject_RichCompareBool(token, f.token, Py_EQ)
                       : 0;
  if (same < 0) {
    Py_DECREF(token);
    return -1;
  }
  if (!same) {
    Py_XSETREF(f.token, token);
    for (int& known : f.scalar_is_mapping) known = -1;
    ++f.mapping_generation;
  } else {
    Py_DECREF(token);
  }
  if (f.scalar_is_mapping[scalar] >= 0) return f.scalar_is_mapping[scalar];
  // The check may run Python (and so a nested record, even a registration):
  // its answer is kept only if the cache was not reset meanwhile.
  const unsigned generation = f.mapping_generation;
  const int answer = PyObject_IsInstance(value, f.mapping);
  if (answer >= 0 && generation == f.mapping_generation) {
    f.scalar_is_mapping[scalar] = answer;
  }
  return answer;
}

// threading.current_thread().name without its two Python frames: the
// thread from threading._active by `ident` and its `_name`, while
// current_thread, get_ident and the class's `name` property are
// threading's own and the thread is initialised. nullptr with no error
// set: the caller asks current_thread() itself.
PyObject* ThreadName(const Factory& f, PyObject* threading, PyObject* ident) {
  if (threading != f.threading || f.name_property == nullptr ||
      !PyModule_CheckExact(threading)) {
    return nullptr;
  }
  PyObject* globals = PyModule_GetDict(threading);
  if (PyDict_GetItemWithError(globals, f.names[kCurrentThread]) !=
          f.current_thread ||
      PyDict_GetItemWithError(globals, f.names[kGetIdent]) != f.get_ident) {
    return nullptr;
  }
  PyObject* active = PyDict_GetItemWithError(globals, f.names[kActive]);
  if (active == nullptr || !PyDict_CheckExact(active)) return nullptr;
  PyObject* thread = PyDict_GetItemWithError(active, ident);
  if (thread == nullptr ||
      _PyType_Lookup(Py_TYPE(thread), f.names[kThreadNameAttr]) !=
          f.name_property) {
    return nullptr;
  }
  Py_INCREF(thread);
  PyObject* initialized = PyObject_GetAttr(thread, f.names[kInitialized]);
  PyObject* name = nullptr;
  if (initialized == Py_True) {
    name = PyObject_GetAttr(thread, f.names[kThreadNameField]);
  }
  Py_XDECREF(initialized);
  Py_DECREF(thread);
  if (name == nullptr) PyErr_Clear();  // the property says what is wrong
  return name;
}

// Whether `threading` (logging's global) is the module configured and its
// get_ident still _thread's.
bool OwnGetIdent(const Factory& f, PyObject* threading) {
  if (threading != f.threading || f.get_ident == nullptr ||
      !PyModule_CheckExact(threading)) {
    return false;
  }
  PyObject* get_ident = PyDict_GetItemWithError(PyModule_GetDict(threading),
                                                f.names[kGetIdent]);
  if (get_ident == nullptr) PyErr_Clear();  // the call says what is wrong
  return get_ident == f.get_ident;
}

// The values LogRecord.__init__ sets, as new references.
struct Values {
  PyObject* v[kRecordKeys] = {};
  ~Values() {
    for (PyObject* value : v) Py_XDECREF(value);
  }
};

// 1: the C path may build this record; 0: the factory's path; -1 error.
int Usable(const Factory& f, PyObject* const* args, Py_ssize_t nargs,
           PyObject* kwnames) {
  if (f.record_type == nullptr || nargs != 9 ||
      (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) ||
      !PyTuple_CheckExact(args[5]) || !PyUnicode_CheckExact(args[2])) {
    return 0;
  }
  PyTypeObject* type = f.record_type;
  if (type->tp_new != f.record_new ||
      type->tp_setattro != PyObject_GenericSetAttr ||
      PyDict_GetItemWithError(type->tp_dict, f.names[kInit]) != f.init) {
    return PyErr_Occurred() ? -1 : 0;
  }
  PyObject* time_module = Global(f, kTime);
  if (time_module == nullptr) return PyErr_Occurred() ? -1 : 0;
  PyObject* time_fn = PyObject_GetAttr(time_module, f.names[kTime]);
  if (time_fn == nullptr) {
    PyErr_Clear();
    return 0;
  }
  Py_DECREF(time_fn);  // compared by identity only
  return time_fn == f.time_time;
}

// LogRecord.__init__(name, level, pathname, lineno, msg, args, exc_info,
// func, sinfo) in C, then agentix_context. nullptr with an error set if
// something raised that would have raised there too; `declined` set (no
// error) when the factory's path must make it after all.
PyObject* BuildRecord(Factory& f, PyObject* const* a, bool& declined) {
  Values values;
  PyObject** v = values.v;
  const double created = TimeNow();
  v[kName] = Py_NewRef(a[0]);
  v[kMsg] = Py_NewRef(a[4]);
  // args: a lone non-empty Mapping argument is the args.
  PyObject* args = a[5];
  if (PyTuple_GET_SIZE(args) == 1) {
    PyObject* only = PyTuple_GET_ITEM(args, 0);
    const int is_mapping = IsMapping(f, only);
    if (is_mapping < 0) return nullptr;
    if (is_mapping) {
      const int truth = PyObject_IsTrue(only);
      if (truth < 0) return nullptr;
      if (truth) args = only;
    }
  }
  v[kArgs] = Py_NewRef(args);
  // levelname: getLevelName(level); its common answer looked up here.
  PyObject* get_level_name = Global(f, kGetLevelName);
  if (get_level_name == nullptr) {
    declined = !PyErr_Occurred();
    return nullptr;
  }
  PyObject* level_to_name = Global(f, kLevelToName);
  if (level_to_name == nullptr && PyErr_Occurred()) return nullptr;
  if (get_level_name == f.get_level_name && level_to_name != nullptr &&
      PyDict_CheckExact(level_to_name) && PyLong_CheckExact(a[1])) {
    v[kLevelname] = PyDict_GetItemWithError(level_to_name, a[1]);
    if (v[kLevelname] == nullptr && PyErr_Occurred()) return nullptr;
    Py_XINCREF(v[kLevelname]);
  }
  if (v[kLevelname] == nullptr) {
    v[kLevelname] = PyObject_CallOneArg(get_level_name, a[1]);
    if (v[kLevelname] == nullptr) return nullptr;
  }
  v[kLevelno] = Py_NewRef(a[1]);
  v[kPathname] = Py_NewRef(a[2]);
  PyObject* place = Place(f, a[2]);
  if (place == nullptr || !PyTuple_CheckExact(place) ||
      PyTuple_GET_SIZE(place) != 2) {
    PyErr_Clear();
    declined = true;
    return nullptr;
  }
  v[kFilename] = Py_NewRef(PyTuple_GET_ITEM(place, 0));
  v[kModule] = Py_NewRef(PyTuple_GET_ITEM(place, 1));
  v[kExcInfo] = Py_NewRef(a[6]);
  v[kExcText] = Py_NewRef(Py_None);
  v[kStackInfo] = Py_NewRef(a[8]);
  v[kLineno] = Py_NewRef(a[3]);
  v[kFuncName] = Py_NewRef(a[7]);
  v[kCreated] = PyFloat_FromDouble(created);
  // int((ct - int(ct)) * 1000) + 0.0
  v[kMsecs] = PyFloat_FromDouble(trunc((created - trunc(created)) * 1000) + 0.0);
  PyObject* start = Global(f, kStartTime);
  if (start == nullptr || !PyFloat_CheckExact(start)) {
    if (PyErr_Occurred()) return nullptr;
    declined = true;
    return nullptr;
  }
  v[kRelativeCreated] =
      PyFloat_FromDouble((created - PyFloat_AS_DOUBLE(start)) * 1000);
  if (v[kCreated] == nullptr || v[kMsecs] == nullptr ||
      v[kRelativeCreated] == nullptr) {
    return nullptr;
  }
  const int threads = GlobalIsTrue(f, kLogThreads);
  if (threads < 0) return nullptr;
  if (threads) {
    PyObject* threading = Global(f, kThreading);
    if (threading == nullptr) {
      declined = !PyErr_Occurred();
      return nullptr;
    }
    // threading.get_ident(): the thread's ident while that is threading's
    // own (_thread.get_ident); a replaced one (gevent's, a test's) is
    // called, as the stdlib does.
    if (OwnGetIdent(f, threading)) {
      v[kThread] = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    } else {
      v[kThread] = PyObject_CallMethodNoArgs(threading, f.names[kGetIdent]);
    }
    if (v[kThread] == nullptr) return nullptr;
    v[kThreadName] = ThreadName(f, threading, v[kThread]);
    if (v[kThreadName] == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      PyObject* current =
          PyObject_CallMethodNoArgs(threading, f.names[kCurrentThread]);
      if (current == nullptr) return nullptr;
      v[kThreadName] = PyObject_GetAttr(current, f.names[kThreadNameAttr]);
      Py_DECREF(current);
      if (v[kThreadName] == nullptr) return nullptr;
    }
  } else {
    v[kThread] = Py_NewRef(Py_None);
    v[kThreadName] = Py_NewRef(Py_None);
  }
  const int multiprocessing = GlobalIsTrue(f, kLogMultiprocessing);
  if (multiprocessing < 0) return nullptr;
  if (!multiprocessing) {
    v[kProcessName] = Py_NewRef(Py_None);
  } else {
    PyObject* modules = PyImport_GetModuleDict();
    PyObject* mp = PyDict_GetItemWithError(modules, f.names[kMultiprocessing]);
    if (mp == nullptr && PyErr_Occurred()) return nullptr;
    if (mp != nullptr && mp != Py_None) {
      // mp.current_process().name; an Exception leaves 'MainProcess'.
      PyObject* process =
          PyObject_CallMethodNoArgs(mp, f.names[kCurrentProcess]);
      if (process != nullptr) {
        v[kProcessName] = PyObject_GetAttr(process, f.names[kThreadNameAttr]);
        Py_DECREF(process);
      }
      if (v[kProcessName] == nullptr) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
        PyErr_Clear();
      }
    }
    if (v[kProcessName] == nullptr) {
      v[kProcessName] = Py_NewRef(f.names[kMainProcess]);
    }
  }
  const int processes = GlobalIsTrue(f, kLogProcesses);
  if (processes < 0) return nullptr;
  v[kProcess] = processes ? PyLong_FromLong(ProcessId()) : Py_NewRef(Py_None);
  if (v[kProcess] == nullptr) return nullptr;
  v[kAgentixContext] = Py_NewRef(f.context);

  PyObject* record = f.record_type->tp_new(f.record_type, f.empty, nullptr);
  if (record == nullptr) return nullptr;
  PyObject* dict = PyObject_GenericGetDict(record, nullptr);
  if (dict == nullptr) {
    Py_DECREF(record);
    return nullptr;
  }
  for (int i = 0; i < kRecordKeys; ++i) {
    if (PyDict_SetItem(dict, f.keys[i], v[i]) < 0) {
      Py_DECREF(dict);
      Py_DECREF(record);
      return nullptr;
    }
  }
  Py_DECREF(dict);
  return record;
}

}  // namespace

PyObject* SetLogRecordFactory(PyObject* /*module*/, PyObject* const* args,
                              Py_ssize_t nargs) {
  if (!CheckArgs("set_log_record_factory", nargs, 3)) return nullptr;
  PyObject* factory = args[0];
  PyObject* context = args[1];
  PyObject* logging = args[2];
  if (!PyCallable_Check(factory) || !PyUnicode_Check(context) ||
      !PyModule_Check(logging)) {
    PyErr_SetString(PyExc_TypeError,
                    "set_log_record_factory(factory, context: str, logging)");
    return nullptr;
  }
  ForgetPidInForkedChildren();
  auto* f = new Factory;
  bool ok = InternAll(kRecordKeyNames, kRecordKeys, f->keys) &&
            InternAll(kNameStrings, kNames, f->names);
  f->factory = Py_NewRef(factory);
  f->context = Py_NewRef(context);
  f->logging_globals = Py_XNewRef(PyModule_GetDict(logging));
  f->places = PyDict_New();
  f->empty = PyTuple_New(0);
  ok = ok && f->logging_globals != nullptr && f->places != nullptr &&
       f->empty != nullptr;
  PyObject* record_class = ok ? PyObject_GetAttrString(logging, "LogRecord")
                              : nullptr;
  ok = ok && record_class != nullptr;
  if (ok && record_class == factory && PyType_Check(factory)) {
    // The stdlib's record: the C path applies while these stay the same.
    auto* type = reinterpret_cast<PyTypeObject*>(factory);
    PyObject* time_module = Global(*f, kTime);
    PyObject* os_module = PyDict_GetItemString(f->logging_globals, "os");
    PyObject* collections_abc = PyImport_ImportModule("collections.abc");
    f->init = Py_XNewRef(PyDict_GetItemWithError(type->tp_dict, f->names[kInit]));
    f->get_level_name = Py_XNewRef(Global(*f, kGetLevelName));
    f->time_time = time_module != nullptr
                       ? PyObject_GetAttr(time_module, f->names[kTime])
                       : nullptr;
    f->os_path = os_module != nullptr ? PyObject_GetAttrString(os_module, "path")
                                      : nullptr;
    f->mapping = collections_abc != nullptr
                     ? PyObject_GetAttrString(collections_abc, "Mapping")
                     : nullptr;
    Py_XDECREF(collections_abc);
    PyObject* abc = PyImport_ImportModule("abc");
    f->get_cache_token = abc != nullptr
                             ? PyObject_GetAttrString(abc, "get_cache_token")
                             : nullptr;
    Py_XDECREF(abc);
    if (f->mapping != nullptr) {
      f->instance_check = Py_XNewRef(
          _PyType_Lookup(Py_TYPE(f->mapping), f->names[kInstanceCheck]));
    }
    // threading's own pieces, for ThreadName.
    f->threading = Py_XNewRef(Global(*f, kThreading));
    if (f->threading != nullptr) {
      f->current_thread =
          PyObject_GetAttr(f->threading, f->names[kCurrentThread]);
      f->get_ident = PyObject_GetAttr(f->threading, f->names[kGetIdent]);
      PyObject* thread_class = PyObject_GetAttrString(f->threading, "Thread");
      if (thread_class != nullptr && PyType_Check(thread_class)) {
        f->name_property = Py_XNewRef(_PyType_Lookup(
            reinterpret_cast<PyTypeObject*>(thread_class),
            f->names[kThreadNameAttr]));
      }
      Py_XDECREF(thread_class);
      if (f->current_thread == nullptr || f->get_ident == nullptr) {
        Py_CLEAR(f->name_property);  // ThreadName then never applies
      }
    }
    if (f->init != nullptr && f->get_level_name != nullptr &&
        f->time_time != nullptr && f->os_path != nullptr &&
        f->mapping != nullptr) {
      f->record_type = reinterpret_cast<PyTypeObject*>(Py_NewRef(factory));
      f->record_new = type->tp_new;
    }
    PyErr_Clear();  // anything missing: the factory's path only
  }
  Py_XDECREF(record_class);
  if (!ok) {
    // Not freed: interned names and references stay owned by `f`; a
    // failure here is out of memory at boot.
    return nullptr;
  }
  configured = f;  // a previous configuration stays referenced (one per boot)
  Py_RETURN_NONE;
}

PyObject* MakeLogRecord(PyObject* /*module*/, PyObject* const* args,
                        Py_ssize_t nargs, PyObject* kwnames) {
  Factory* f = configured;
  if (f == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "make_log_record: set_log_record_factory was not called");
    return nullptr;
  }
  const int usable = Usable(*f, args, nargs, kwnames);
  if (usable < 0) return nullptr;
  if (usable) {
    bool declined = false;
    PyObject* record = BuildRecord(*f, args, declined);
    if (record != nullptr || !declined) return record;
  }
  PyObject* record = PyObject_Vectorcall(f->factory, args, nargs, kwnames);
  if (record == nullptr) return nullptr;
  if (PyObject_SetAttr(record, f->keys[kAgentixContext], f->context) < 0) {
    Py_DECREF(record);
    return nullptr;
  }
  return record;
}

}  // namespace agentix::worker
