#include "worker/channel_module.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <exception>
#include <string>

#include "base/log.h"
#include "base/unique_fd.h"
#include "worker/channel/channel_state.h"
#include "worker/channel/diagnostics.h"
#include "worker/channel/durable_line.h"
#include "worker/channel/frame_intake.h"
#include "worker/channel/log_handles.h"
#include "worker/channel/logger_log.h"
#include "worker/channel/py_args.h"
#include "worker/channel/record_factory.h"
#include "worker/channel/result_sender.h"
#include "worker/channel/side_channels.h"
#include "worker/channel/span_handlers.h"
#include "worker/channel/stdio_channel.h"
#include "worker/channel/writer.h"
#include "worker/ipc/frame.h"
#include "worker/python/msgpack_convert.h"

// The module table: which C++ entry point answers which Python name. The
// entry points live with their concept under worker/channel/.

namespace agentix::worker {
namespace {

ModuleState* StateOfModule(PyObject* module) {
  return static_cast<ModuleState*>(PyModule_GetState(module));
}

PyMethodDef kChannelMethods[] = {
    {"read_frames", Guarded<ChannelReadFrames>, METH_NOARGS,
     "Decoded frames available now; None at end of stream."},
    {"intake_lead", Guarded<ChannelIntakeLead>, METH_O,
     "Leader/follower intake: wait for the baton (unless holding) and a "
     "readable channel; 0 readable, 1 leave, 2 stopped."},
    {"intake_pass", Guarded<ChannelIntakePass>, METH_NOARGS,
     "Hand the baton to a waiting follower; False if none waits."},
    {"intake_defer", Guarded<ChannelIntakeDefer>, METH_NOARGS,
     "Offer the baton to the waiting follower, taken if not reclaimed "
     "within 1 ms; False if none waits."},
    {"intake_reclaim", Guarded<ChannelIntakeReclaim>, METH_NOARGS,
     "Withdraw the offer: True if the caller still holds the baton."},
    {"intake_to_pool", Guarded<ChannelIntakeToPool>, METH_NOARGS,
     "Pool threads read the channel from now on (the caller starts one)."},
    {"intake_to_loop", Guarded<ChannelIntakeToLoop>, METH_NOARGS,
     "The event loop reads the channel from now on; followers leave."},
    {"intake_stop", Guarded<ChannelIntakeStop>, METH_NOARGS,
     "Stop every intake leader and follower, now and later."},
    {"send_ready", Fast<ChannelSendReady>(), METH_FASTCALL,
     "send_ready(pid, detail)"},
    {"send_env_set", Fast<ChannelSendEnvSet>(), METH_FASTCALL,
     "send_env_set(detail): answers set_env ('' = applied)"},
    {"send_result", Fast<ChannelSendResult>(), METH_FASTCALL,
     "send_result(call_id, encoding, data)"},
    {"send_item", Fast<ChannelSendItem>(), METH_FASTCALL,
     "send_item(call_id, index, encoding, data)"},
    {"send_error", Fast<ChannelSendError>(), METH_FASTCALL,
     "send_error(call_id, code, type, message, traceback, cancelled"
     "[, type_module, type_qualname, state])"},
    {"send_log", FastKeywords<ChannelSendLog>(),
     METH_FASTCALL | METH_KEYWORDS,
     "send_log(**fields): one `log` frame; keyword arguments only, each "
     "optional, named as agentix.runtime.v1.LogRecord's fields (less seq and "
     "worker_id)"},
    {"send_log_record", Fast<ChannelSendLogRecord>(), METH_FASTCALL,
     "send_log_record(record, context, call_id, standard_keys, unforwarded):"
     " the log bridge's common case: True if the plain LogRecord was queued "
     "as send_log would, False (nothing sent) if it needs the general path"},
    {"send_trace", FastKeywords<ChannelSendTrace>(),
     METH_FASTCALL | METH_KEYWORDS,
     "send_trace(**fields): one `trace` frame, queued with the log frames; "
     "keyword arguments only, each optional, named as "
     "agentix.runtime.v1.TraceEvent's fields (less seq, worker_id, trace_id, "
     "span_id and parent_span_id); attributes and error_data are "
     "{str: scalar} dicts, events a list of dicts"},
    {"send_span", Fast<ChannelSendSpan>(), METH_FASTCALL,
     "send_span(kind, span, call_id, span_type): the trace forwarder's "
     "common span events: True if queued as send_trace would, False "
     "(nothing sent) if the span needs the general path"},
    {"send_ns_event", Fast<ChannelSendNamespaceEvent>(), METH_FASTCALL,
     "send_ns_event(namespace, event, data, request_id, error_type, "
     "error_message, status_code): a plugin-namespace event for the hosts."},
    {"send_stdio", Fast<ChannelSendStdio>(), METH_FASTCALL,
     "send_stdio(origin, text, call_id): one captured line"},
    {"start_capture", Fast<ChannelStartCapture>(), METH_FASTCALL,
     "start_capture(worker_id, context)"},
    {"stop_capture", Guarded<ChannelStopCapture>, METH_O,
     "stop_capture(timeout_ms)"},
    {"set_durable", Guarded<ChannelSetDurable>, METH_O,
     "set_durable(enabled): queue captured lines for wait_stdio_lines()"},
    {"wait_stdio_lines", Guarded<ChannelWaitStdioLines>, METH_NOARGS,
     "Captured lines for the durable log; None once capture ended."},
    {"flush", Guarded<ChannelFlush>, METH_NOARGS, "Write all queued frames."},
    {"pending_bytes", ChannelPendingBytes, METH_NOARGS,
     "Bytes queued but not yet written."},
    {"fileno", ChannelFileno, METH_NOARGS,
     "The fd to poll for frames (the link and direct connections)."},
    {"finish_direct", Fast<ChannelFinishDirect>(),
     METH_FASTCALL,
     "finish_direct(code, message): STATUS on every direct connection."},
    {"wait_cpu", ChannelWaitCpu, METH_NOARGS,
     "The CPU the daemon placed its call path on (--calls_cpu), or -1."},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot kChannelSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(ChannelNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(ChannelDealloc)},
    {Py_tp_methods, kChannelMethods},
    {Py_tp_doc, const_cast<char*>("The worker's end of the frame channel.")},
    {0, nullptr},
};

PyType_Spec kChannelSpec = {
    "_agentix_worker.Channel",
    sizeof(ChannelObject),
    0,
    Py_TPFLAGS_DEFAULT,
    kChannelSlots,
};

// ---- module functions -------------------------------------------------------

PyObject* MsgpackLoads(PyObject* /*module*/, PyObject* arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_CONTIG_RO) != 0) return nullptr;
  PyObject* value = MsgpackToPython(static_cast<const char*>(view.buf),
                                    static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return value;
}

PyObject* MsgpackDumps(PyObject* /*module*/, PyObject* arg) {
  std::string out;
  if (!PythonToMsgpack(arg, out)) return nullptr;
  return BytesOf(out);
}

PyObject* Log(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (!CheckArgs("log", nargs, 2)) return nullptr;
  long long level = 0;
  std::string message;
  if (!ToInt(args[0], "severity", level) ||
      !ToUtf8(args[1], "message", "backslashreplace", message)) {
    return nullptr;
  }
  if (level < 0) level = 0;
  if (level > 3) level = 3;
  const auto severity = static_cast<base::LogSeverity>(level);
  if (severity >= base::MinLogSeverity()) {
    try {
      DiagLine(severity, message);
    } catch (const std::exception&) {
      // Logging must never fail a call.
    }
  }
  Py_RETURN_NONE;
}

// The fd of the worker's original stderr (the daemon reads it; crash reports
// belong there), or 2 before capture started.
PyObject* DiagnosticFdOf(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromLong(DiagnosticFd());
}

PyObject* SetThreadName(PyObject* /*module*/, PyObject* arg) {
  std::string name;
  if (!ToUtf8(arg, "name", "backslashreplace", name)) return nullptr;
  // The kernel keeps 15 bytes; longer names are cut, not refused.
  if (name.size() > 15) name.resize(15);
  pthread_setname_np(pthread_self(), name.c_str());
  Py_RETURN_NONE;
}

// A read-only file mapped for the rest of the process's life, as a read-only
// memoryview (the bundle's bytecode pack, driver/bytecode_pack.py); None if
// the file does not exist or is empty. Never unmapped: views of it may live
// as long as the interpreter, and the pages are the page cache's.
PyObject* MapFile(PyObject* /*module*/, PyObject* arg) {
  std::string path;
  if (!ToUtf8(arg, "path", "surrogateescape", path)) return nullptr;
  // Closed on the way out, after any error has read errno (the mapping stays).
  const base::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) Py_RETURN_NONE;
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
  }
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) {
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
  }
  if (!S_ISREG(st.st_mode)) {
    return PyErr_Format(PyExc_OSError, "%s is not a regular file", path.c_str());
  }
  if (st.st_size == 0) Py_RETURN_NONE;
  void* data = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                    MAP_PRIVATE, fd.get(), 0);
  if (data == MAP_FAILED) {
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
  }
  PyObject* view = PyMemoryView_FromMemory(static_cast<char*>(data),
                                           static_cast<Py_ssize_t>(st.st_size),
                                           PyBUF_READ);
  if (view == nullptr) munmap(data, static_cast<size_t>(st.st_size));
  return view;
}

PyMethodDef kModuleMethods[] = {
    {"msgpack_loads", Guarded<MsgpackLoads>, METH_O,
     "Decode one msgpack value."},
    {"msgpack_dumps", Guarded<MsgpackDumps>, METH_O,
     "Encode a value as msgpack."},
    {"log", Fast<Log>(), METH_FASTCALL,
     "log(severity, message): 0 debug, 1 info, 2 warning, 3 error."},
    {"diagnostic_fd", DiagnosticFdOf, METH_NOARGS,
     "The fd of the worker's original stderr (the daemon's diagnostics)."},
    {"write_log_line", Fast<WriteLogLine>(), METH_FASTCALL,
     "write_log_line(record, sink, context, room): the durable log's default "
     "line for a plain LogRecord, written; its length, or -1 (nothing "
     "written) if the record needs the general path."},
    {"bridge_handle", Fast<BridgeHandle>(), METH_FASTCALL,
     "bridge_handle(handler, send_log_record, context, call_id, "
     "standard_keys, unforwarded): the log bridge's handle(record) in C."},
    {"span_handlers", Fast<SpanHandlers>(), METH_FASTCALL,
     "span_handlers(forwarder, call_id): the trace forwarder's "
     "(on_span_start, on_span_end) in C."},
    {"durable_handle", Fast<DurableHandle>(), METH_FASTCALL,
     "durable_handle(handler): the durable log's handle(record) in C."},
    {"map_log", Fast<MapLog>(), METH_FASTCALL,
     "map_log(fd): the durable log file as a mapping to append to."},
    {"append_log", Fast<AppendLog>(), METH_FASTCALL,
     "append_log(mapping, data): data copied after the mapped file's records."},
    {"close_log", Fast<CloseLog>(), METH_FASTCALL,
     "close_log(mapping): unmaps and truncates the file to its records."},
    {"mapped_log_length", Fast<MappedLogLength>(), METH_FASTCALL,
     "mapped_log_length(mapping): the bytes of records in the file."},
    {"set_log_record_factory", Fast<SetLogRecordFactory>(), METH_FASTCALL,
     "set_log_record_factory(factory, context, logging): make_log_record's "
     "records come from factory, tagged with context as agentix_context."},
    {"make_log_record", FastKeywords<MakeLogRecord>(),
     METH_FASTCALL | METH_KEYWORDS,
     "A logging record factory: factory(*args, **kwargs) with "
     "agentix_context set; logging.LogRecord's records built in C."},
    {"install_logger_log", Fast<InstallLoggerLog>(), METH_FASTCALL,
     "install_logger_log(logging) -> the stdlib's Logger._log, replaced by "
     "one in C that falls back to it for anything unusual."},
    {"map_file", Guarded<MapFile>, METH_O,
     "map_file(path): the file mapped read-only for the process's life, as "
     "a read-only memoryview; None if it does not exist or is empty."},
    {"set_thread_name", Guarded<SetThreadName>, METH_O,
     "Sets the calling OS thread's name (as shown by ps/top)."},
    {nullptr, nullptr, 0, nullptr},
};

int AddInt(PyObject* module, const char* name, long value) {
  return PyModule_AddIntConstant(module, name, value);
}

int ExecModule(PyObject* module) {
  WatchForks();
  ModuleState* ms = StateOfModule(module);
  ms->protocol_error = PyErr_NewExceptionWithDoc(
      "_agentix_worker.ProtocolError",
      "The frame channel is desynchronised (bad or unexpected frame).",
      nullptr, nullptr);
  if (ms->protocol_error == nullptr) return -1;
  ms->channel_error = PyErr_NewExceptionWithDoc(
      "_agentix_worker.ChannelError",
      "Writing to the frame channel failed (the daemon is gone).", nullptr,
      nullptr);
  if (ms->channel_error == nullptr) return -1;
  ms->channel_type = PyType_FromModuleAndSpec(module, &kChannelSpec, nullptr);
  if (ms->channel_type == nullptr) return -1;
  if (PyModule_AddObjectRef(module, "ProtocolError", ms->protocol_error) < 0 ||
      PyModule_AddObjectRef(module, "ChannelError", ms->channel_error) < 0 ||
      PyModule_AddObjectRef(module, "Channel", ms->channel_type) < 0 ||
      AddInt(module, "CALL", kCall) < 0 ||
      AddInt(module, "ARGS", kArgs) < 0 ||
      AddInt(module, "CANCEL", kCancel) < 0 ||
      AddInt(module, "SHUTDOWN", kShutdown) < 0 ||
      AddInt(module, "STREAM_ACK", kStreamAck) < 0 ||
      AddInt(module, "NS_EVENT", kNamespaceEvent) < 0 ||
      AddInt(module, "SET_ENV", kSetEnv) < 0 ||
      AddInt(module, "CHUNK_BYTES", static_cast<long>(ipc::kChunkBytes)) < 0 ||
      AddFrameTypes(module, *ms) < 0 || AddStdioLineType(module, *ms) < 0) {
    return -1;
  }
  return 0;
}

int TraverseModule(PyObject* module, visitproc visit, void* arg) {
  ModuleState* ms = StateOfModule(module);
  if (ms == nullptr) return 0;
  Py_VISIT(ms->protocol_error);
  Py_VISIT(ms->channel_error);
  Py_VISIT(ms->channel_type);
  for (PyObject* type : ms->frame_types) Py_VISIT(type);
  Py_VISIT(ms->stdio_line_type);
  return 0;
}

int ClearModule(PyObject* module) {
  ModuleState* ms = StateOfModule(module);
  if (ms == nullptr) return 0;
  Py_CLEAR(ms->protocol_error);
  Py_CLEAR(ms->channel_error);
  Py_CLEAR(ms->channel_type);
  for (PyObject*& type : ms->frame_types) Py_CLEAR(type);
  Py_CLEAR(ms->stdio_line_type);
  return 0;
}

void FreeModule(void* module) { ClearModule(static_cast<PyObject*>(module)); }

PyModuleDef_Slot kModuleSlots[] = {
    {Py_mod_exec, reinterpret_cast<void*>(ExecModule)},
    {0, nullptr},
};

// CPython requires the definition to outlive the interpreter; it holds no
// PyObject*, only function pointers and constants.
PyModuleDef kModuleDef = {
    PyModuleDef_HEAD_INIT,
    kChannelModuleName,
    "The agentix worker's frame channel and C++ helpers.",
    sizeof(ModuleState),
    kModuleMethods,
    kModuleSlots,
    TraverseModule,
    ClearModule,
    FreeModule,
};

PyObject* InitModule() { return PyModuleDef_Init(&kModuleDef); }

}  // namespace

absl::Status RegisterChannelModule() {
  if (PyImport_AppendInittab(kChannelModuleName, &InitModule) != 0) {
    return absl::InternalError("PyImport_AppendInittab(_agentix_worker) failed");
  }
  return absl::OkStatus();
}

}  // namespace agentix::worker
