#include "worker/channel/durable_line.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <string_view>

#include "worker/channel/log_record.h"
#include "worker/channel/mapped_log.h"
#include "worker/channel/py_args.h"

namespace agentix::worker {
namespace {

enum LineKey {
  kName,
  kMsg,
  kArgs,
  kExcInfo,
  kExcText,
  kStackInfo,
  kCreated,
  kMsecs,
  kContext,
  kMessage,
  kAsctime,
  kLineKeys
};
constexpr const char* kLineKeyNames[kLineKeys] = {
    "name",    "msg",   "args",            "exc_info", "exc_text", "stack_info",
    "created", "msecs", "agentix_context", "message",  "asctime"};

PyObject** LineKeys() {
  static PyObject* keys[kLineKeys] = {};  // interned; GIL-guarded
  // The last entry, not the first: a failure part-way leaves the table to
  // be completed by the next call.
  if (keys[kLineKeys - 1] == nullptr &&
      !InternAll(kLineKeyNames, kLineKeys, keys)) {
    return nullptr;
  }
  return keys;
}

// Formatter.formatTime's default ("%Y-%m-%d %H:%M:%S" of time.localtime,
// then ",%03d" of msecs), the date and time part formatted once per second
// as _DurableFormatter does. False if the time has no local form.
bool AppendAsctime(long long second, long msecs, std::string& out) {
  static long long cached_second = -1;  // GIL-guarded
  static char cached[64];
  if (second != cached_second) {
    const time_t t = static_cast<time_t>(second);
    struct tm local;
    if (localtime_r(&t, &local) == nullptr ||
        strftime(cached, sizeof cached, "%Y-%m-%d %H:%M:%S", &local) == 0) {
      return false;
    }
    cached_second = second;
  }
  // ",%03ld" for 0 <= msecs < 1000 (the caller checks), without printf's
  // format parsing (~2% of the calling thread's samples).
  const char millis[4] = {',', static_cast<char>('0' + msecs / 100),
                          static_cast<char>('0' + msecs / 10 % 10),
                          static_cast<char>('0' + msecs % 10)};
  out.append(cached).append(millis, sizeof millis);
  return true;
}

// record.asctime as a str: the one made for the previous record when the
// text is the same (a millisecond's records share it; a str is immutable),
// else decoded as before. New reference, or nullptr with an error set.
PyObject* Asctime(const std::string& text) {
  static std::string last_text;       // GIL-guarded
  static PyObject* last = nullptr;
  if (last == nullptr || text != last_text) {
    PyObject* made = PyUnicode_DecodeUTF8(
        text.data(), static_cast<Py_ssize_t>(text.size()), "surrogateescape");
    if (made == nullptr) return nullptr;
    Py_XSETREF(last, made);
    last_text = text;
  }
  return Py_NewRef(last);
}

// Appends str `text` as strict UTF-8 (as str.encode("utf-8")); false with
// the error cleared if it has lone surrogates.
bool AppendUtf8(PyObject* text, std::string& out) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);
  if (data == nullptr) {
    PyErr_Clear();
    return false;
  }
  out.append(data, static_cast<size_t>(size));
  return true;
}

bool IsEmptyText(PyObject* value) {
  return value == nullptr || value == Py_None ||
         (PyUnicode_CheckExact(value) && PyUnicode_GET_LENGTH(value) == 0);
}

// The record's values, held while user code (str() of the message) runs.
struct Held {
  PyObject* values[kLineKeys] = {};
  ~Held() {
    for (PyObject* value : values) Py_XDECREF(value);
  }
};

PyObject* Declined() { return PyLong_FromLong(-1); }

constexpr const char kMappedLogName[] = "agentix.MappedLog";

// The MappedLog in a map_log capsule, or nullptr with TypeError set.
MappedLog* MappedLogOf(PyObject* capsule) {
  return static_cast<MappedLog*>(PyCapsule_GetPointer(capsule, kMappedLogName));
}

void DeleteMappedLog(PyObject* capsule) {
  // Unmaps only: a log not closed ends as a crash leaves it.
  delete static_cast<MappedLog*>(
      PyCapsule_GetPointer(capsule, kMappedLogName));
}

PyObject* RaiseOsError(const absl::Status& status) {
  PyErr_SetString(PyExc_OSError, std::string(status.message()).c_str());
  return nullptr;
}

// Writes all of `line`, retrying a partial write (a regular file takes it
// all unless full) and EINTR. 0 or an errno.
int WriteLine(int fd, const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

PyObject* WriteLogLine(PyObject* /*module*/, PyObject* const* args,
                       Py_ssize_t nargs) {
  if (!CheckArgs("write_log_line", nargs, 4)) return nullptr;
  PyObject* const record = args[0];
  long long fd = -1;
  long long room = 0;
  MappedLog* mapped = nullptr;
  if (PyCapsule_CheckExact(args[1])) {
    mapped = MappedLogOf(args[1]);
    if (mapped == nullptr) return nullptr;
  } else if (!ToInt(args[1], "fd", fd)) {
    return nullptr;
  }
  if (!ToInt(args[3], "room", room)) return nullptr;
  if (!PyUnicode_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "write_log_line: context must be str");
    return nullptr;
  }
  PyObject** keys = LineKeys();
  if (keys == nullptr) return nullptr;
  const int plain = IsPlainLogRecord(record);
  if (plain <= 0) return plain < 0 ? nullptr : Declined();
  PyObject* dict = PyObject_GenericGetDict(record, nullptr);
  if (dict == nullptr) return nullptr;
  Held held;
  for (int i = 0; i < kLineKeys; ++i) {
    held.values[i] = PyDict_GetItemWithError(dict, keys[i]);
    if (held.values[i] == nullptr && PyErr_Occurred()) {
      Py_DECREF(dict);
      return nullptr;
    }
    Py_XINCREF(held.values[i]);
  }
  PyObject** v = held.values;
  // The default format's fast case in _DurableFormatter.format: no
  // exception, exception text or stack; the values as logging made them.
  PyObject* msecs = v[kMsecs];
  const bool usual =
      v[kName] != nullptr && PyUnicode_CheckExact(v[kName]) &&
      v[kMsg] != nullptr && v[kArgs] != nullptr && v[kExcInfo] == Py_None &&
      IsEmptyText(v[kExcText]) && IsEmptyText(v[kStackInfo]) &&
      v[kCreated] != nullptr && PyFloat_CheckExact(v[kCreated]) &&
      PyFloat_AS_DOUBLE(v[kCreated]) >= 0 &&
      PyFloat_AS_DOUBLE(v[kCreated]) < 1e15 && msecs != nullptr &&
      (PyFloat_CheckExact(msecs) || PyLong_CheckExact(msecs)) &&
      (v[kContext] == nullptr || PyUnicode_CheckExact(v[kContext]));
  if (!usual) {
    Py_DECREF(dict);
    return Declined();
  }
  // "%03d" % msecs: int() of it; 0..999 for what logging makes.
  const double ms = PyFloat_CheckExact(msecs) ? PyFloat_AS_DOUBLE(msecs)
                                              : PyLong_AsDouble(msecs);
  if (!(ms >= 0 && ms < 1000)) {
    PyErr_Clear();
    Py_DECREF(dict);
    return Declined();
  }
  if (v[kContext] == nullptr) {
    // Made without the worker's record factory: emit() gives it ours.
    if (PyDict_SetItem(dict, keys[kContext], args[2]) < 0) {
      Py_DECREF(dict);
      return nullptr;
    }
    v[kContext] = Py_NewRef(args[2]);
  }
  // Last before writing, after every reason to decline: str() of the
  // message and its arguments are user code the general path would run
  // again.
  PyObject* message = PlainMessage(v[kMsg], v[kArgs]);
  if (message == nullptr) {
    PyErr_Clear();  // the general path reports it
    Py_DECREF(dict);
    return Declined();
  }
  std::string line;
  const double created = PyFloat_AS_DOUBLE(v[kCreated]);
  bool ok = PyUnicode_CheckExact(message) &&
            AppendAsctime(static_cast<long long>(created),
                          static_cast<long>(ms), line);
  PyObject* asctime = nullptr;
  if (ok) {
    asctime = Asctime(line);
    ok = asctime != nullptr &&
         PyDict_SetItem(dict, keys[kMessage], message) == 0 &&
         PyDict_SetItem(dict, keys[kAsctime], asctime) == 0;
    if (!ok) {
      Py_XDECREF(asctime);
      Py_DECREF(message);
      Py_DECREF(dict);
      return nullptr;
    }
    line.append(" [");
    ok = AppendUtf8(v[kContext], line);
    line.append("] [");
    ok = ok && AppendUtf8(v[kName], line);
    line.append("] ");
    ok = ok && AppendUtf8(message, line);
    line.push_back('\n');
  }
  Py_XDECREF(asctime);
  Py_DECREF(message);
  Py_DECREF(dict);
  if (!ok || (room >= 0 && line.size() >= static_cast<unsigned long long>(room))) {
    return Declined();
  }
  if (mapped != nullptr) {
    // A copy into the page cache: no system call, the GIL kept.
    const absl::Status appended = mapped->Append(line);
    if (!appended.ok()) return RaiseOsError(appended);
    return PyLong_FromSize_t(line.size());
  }
  int error = 0;
  Py_BEGIN_ALLOW_THREADS
  error = WriteLine(static_cast<int>(fd), line);
  Py_END_ALLOW_THREADS
  if (error != 0) {
    errno = error;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return PyLong_FromSize_t(line.size());
}

PyObject* MapLog(PyObject* /*module*/, PyObject* const* args,
                 Py_ssize_t nargs) {
  if (!CheckArgs("map_log", nargs, 1)) return nullptr;
  long long fd = 0;
  if (!ToInt(args[0], "fd", fd)) return nullptr;
  absl::StatusOr<std::unique_ptr<MappedLog>> log =
      MappedLog::Open(static_cast<int>(fd));
  if (!log.ok()) return RaiseOsError(log.status());
  PyObject* capsule =
      PyCapsule_New(log->get(), kMappedLogName, DeleteMappedLog);
  if (capsule != nullptr) log->release();
  return capsule;
}

PyObject* AppendLog(PyObject* /*module*/, PyObject* const* args,
                    Py_ssize_t nargs) {
  if (!CheckArgs("append_log", nargs, 2)) return nullptr;
  MappedLog* log = MappedLogOf(args[0]);
  if (log == nullptr) return nullptr;
  Py_buffer data;
  if (PyObject_GetBuffer(args[1], &data, PyBUF_SIMPLE) < 0) return nullptr;
  const absl::Status appended = log->Append(std::string_view(
      static_cast<const char*>(data.buf), static_cast<size_t>(data.len)));
  PyBuffer_Release(&data);
  if (!appended.ok()) return RaiseOsError(appended);
  Py_RETURN_NONE;
}

PyObject* CloseLog(PyObject* /*module*/, PyObject* const* args,
                   Py_ssize_t nargs) {
  if (!CheckArgs("close_log", nargs, 1)) return nullptr;
  MappedLog* log = MappedLogOf(args[0]);
  if (log == nullptr) return nullptr;
  const absl::Status closed = log->Close();
  if (!closed.ok()) return RaiseOsError(closed);
  Py_RETURN_NONE;
}

PyObject* MappedLogLength(PyObject* /*module*/, PyObject* const* args,
                          Py_ssize_t nargs) {
  if (!CheckArgs("mapped_log_length", nargs, 1)) return nullptr;
  MappedLog* log = MappedLogOf(args[0]);
  if (log == nullptr) return nullptr;
  return PyLong_FromSize_t(log->Length());
}

}  // namespace agentix::worker
