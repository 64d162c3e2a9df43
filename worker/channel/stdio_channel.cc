#include "worker/channel/stdio_channel.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <string>

#include "worker/channel/channel_state.h"
#include "worker/channel/durable_log.h"
#include "worker/channel/log_sender.h"
#include "worker/channel/py_args.h"

namespace agentix::worker {
namespace {

PyStructSequence_Field kStdioLineFields[] = {
    {"origin", "2 stdout, 3 stderr"},
    {"time_unix_nanos", "when the line was read"},
    {"text", "the line, without its newline"},
    {nullptr, nullptr},
};
PyStructSequence_Desc kStdioLineDesc = {
    "_agentix_worker.StdioLine", "One captured line for the durable log.",
    kStdioLineFields, 3};

}  // namespace

int AddStdioLineType(PyObject* module, ModuleState& state) {
  return AddRecordType(module, &kStdioLineDesc, &state.stdio_line_type);
}

PyObject* ChannelStartCapture(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs) {
  if (!CheckArgs("start_capture", nargs, 2)) return nullptr;
  std::string worker_id;
  std::string context;
  if (!ToUtf8(args[0], "worker_id", "backslashreplace", worker_id) ||
      !ToUtf8(args[1], "context", "backslashreplace", context)) {
    return nullptr;
  }
  StdioCapture& capture = *Channel(self).capture;
  if (capture.started()) {
    PyErr_SetString(PyExc_RuntimeError, "stdio capture already started");
    return nullptr;
  }
  const absl::Status status = capture.Start(worker_id, context);
  if (status.code() == absl::StatusCode::kInternal) {
    Py_BEGIN_ALLOW_THREADS
    capture.Stop(1000);
    Py_END_ALLOW_THREADS
    SetError(PyExc_RuntimeError, status);
    return nullptr;
  }
  if (!status.ok()) {
    SetError(PyExc_OSError, status);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* ChannelStopCapture(PyObject* self, PyObject* arg) {
  long long timeout_ms = 0;
  if (!ToInt(arg, "timeout_ms", timeout_ms)) return nullptr;
  ChannelState& st = Channel(self);
  const int ms = static_cast<int>(std::max(0LL, std::min(timeout_ms, 60000LL)));
  Py_BEGIN_ALLOW_THREADS
  const auto start = std::chrono::steady_clock::now();
  st.capture->Stop(ms);
  const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  StopSender(st.writer, std::max(100, ms - static_cast<int>(spent.count())));
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* ChannelSendStdio(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  if (!CheckArgs("send_stdio", nargs, 3)) return nullptr;
  long long origin = 0;
  std::string text;
  std::string call_id;
  if (!ToInt(args[0], "origin", origin) ||
      !ToUtf8(args[1], "text", "backslashreplace", text) ||
      !ToUtf8(args[2], "call_id", "surrogateescape", call_id)) {
    return nullptr;
  }
  if (origin != kOriginStdout && origin != kOriginStderr) {
    PyErr_SetString(PyExc_ValueError, "origin must be 2 (stdout) or 3");
    return nullptr;
  }
  ChannelState& st = Channel(self);
  // Tagged or counted as side_channels.cc's records are.
  const uint64_t direct_conn =
      st.direct != nullptr && !call_id.empty() ? st.direct->TagRecord(call_id) : 0;
  const absl::Status status = st.capture->SendLine(
      static_cast<int>(origin), direct_conn, std::move(text), call_id);
  if (!status.ok()) {
    SetError(PyExc_ValueError, status);
    return nullptr;
  }
  if (st.direct != nullptr && call_id.empty()) {
    st.writer->untagged_records.fetch_add(1, std::memory_order_release);
  }
  Py_RETURN_NONE;
}

PyObject* ChannelSetDurable(PyObject* self, PyObject* arg) {
  const int enabled = PyObject_IsTrue(arg);
  if (enabled < 0) return nullptr;
  Channel(self).durable->SetEnabled(enabled != 0);
  Py_RETURN_NONE;
}

PyObject* ChannelWaitStdioLines(PyObject* self, PyObject* /*unused*/) {
  std::shared_ptr<DurableLog> durable = Channel(self).durable;
  std::deque<StdioLine> lines;
  Py_BEGIN_ALLOW_THREADS
  lines = durable->Wait();
  Py_END_ALLOW_THREADS
  if (lines.empty()) Py_RETURN_NONE;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(lines.size()));
  if (list == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const StdioLine& line : lines) {
    PyObject* record =
        Record(StateOfChannel(self)->stdio_line_type,
               {PyLong_FromLong(line.origin),
                PyLong_FromLongLong(line.time_unix_nanos),
                PyUnicode_DecodeUTF8(line.text.data(),
                                     static_cast<Py_ssize_t>(line.text.size()),
                                     "replace")});
    if (record == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i++, record);
  }
  return list;
}

}  // namespace agentix::worker
