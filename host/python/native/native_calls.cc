// agentix.runtime.client._native_calls: the host's Calls stream (and its
// Namespace streams) over grpc++ (calls_reactor.h) as a CPython extension;
// stream.py's NativeCallsStream and namespaces.py's NativeNamespaceStream
// drive it. This file is the Python edge only: argument parsing, buffers,
// the GIL, and turning C++ failures into Python exceptions.
//
// The GIL is released around every call into gRPC and every large copy;
// completions (handled on the polling thread) never touch Python. No C++
// exception crosses into Python: every entry point that can throw catches
// and converts.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sys/eventfd.h>

#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <grpc/slice.h>
#include <grpcpp/grpcpp.h>

#include "base/fresh_pages.h"
#include "base/mutex_tuning.h"
#include "base/payload_copy.h"
#include "host/python/native/call_results_wire.h"
#include "host/python/native/call_start_wire.h"
#include "host/python/native/calls_reactor.h"
#include "host/python/native/cxx_errors.h"
#include "host/python/native/namespace_wire.h"
#include "host/python/native/log_replay.h"
#include "host/python/native/side_records.h"

namespace {

using agentix::host::CallsReactor;
using agentix::host::SetErrorFromCxx;

// The method a transport opens unless told otherwise.
constexpr char kCallsMethod[] = "/agentix.runtime.v1.RuntimeService/Calls";

// From this size on, copies run without the GIL.
constexpr size_t kReleaseGilBytes = 64 << 10;

// ---------------------------------------------------------------- Channel

struct ChannelObject {
  PyObject_HEAD
  std::shared_ptr<grpc::Channel>* channel;
};

bool ReadOptionalBytes(PyObject* obj, std::string* out, const char* what) {
  if (obj == Py_None) return true;
  char* data;
  Py_ssize_t size;
  if (PyBytes_AsStringAndSize(obj, &data, &size) < 0) {
    PyErr_Format(PyExc_TypeError, "%s must be bytes or None", what);
    return false;
  }
  out->assign(data, static_cast<size_t>(size));
  return true;
}

int Channel_init(ChannelObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kwlist[] = {"target", "tls", "options", nullptr};
  const char* target;
  PyObject* tls = Py_None;
  PyObject* options = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|OO", const_cast<char**>(kwlist), &target, &tls, &options)) {
    return -1;
  }
  try {
    grpc::ChannelArguments channel_args;
    if (options != Py_None) {
      PyObject* seq = PySequence_Fast(options, "options must be a sequence of (name, value) pairs");
      if (seq == nullptr) return -1;
      Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
        const char* name;
        PyObject* value;
        if (!PyArg_ParseTuple(item, "sO", &name, &value)) {
          Py_DECREF(seq);
          return -1;
        }
        if (PyLong_Check(value)) {
          long v = PyLong_AsLong(value);
          if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
          }
          channel_args.SetInt(name, static_cast<int>(v));
        } else if (PyUnicode_Check(value)) {
          const char* v = PyUnicode_AsUTF8(value);
          if (v == nullptr) {
            Py_DECREF(seq);
            return -1;
          }
          channel_args.SetString(name, v);
        } else {
          Py_DECREF(seq);
          PyErr_Format(PyExc_TypeError, "channel option %s: value must be int or str", name);
          return -1;
        }
      }
      Py_DECREF(seq);
    }
    const bool use_tls = tls != Py_None;
    grpc::SslCredentialsOptions ssl;
    if (use_tls) {
      PyObject *root, *chain, *key;
      if (!PyArg_ParseTuple(tls, "OOO", &root, &chain, &key)) return -1;
      if (!ReadOptionalBytes(root, &ssl.pem_root_certs, "root certificates") ||
          !ReadOptionalBytes(chain, &ssl.pem_cert_chain, "certificate chain") ||
          !ReadOptionalBytes(key, &ssl.pem_private_key, "private key")) {
        return -1;
      }
    }
    std::string target_copy(target);
    std::shared_ptr<grpc::Channel> channel;
    Py_BEGIN_ALLOW_THREADS  // credentials and channels take gRPC's locks
    try {
      auto credentials = use_tls ? grpc::SslCredentials(ssl) : grpc::InsecureChannelCredentials();
      if (credentials) channel = grpc::CreateCustomChannel(target_copy, credentials, channel_args);
      // Start connecting now: the client creates this channel next to its
      // grpc.aio one, and the first call should not wait for a second
      // connection set up only when its stream starts.
      if (channel) channel->GetState(/*try_to_connect=*/true);
    } catch (...) {
      channel = nullptr;
    }
    Py_END_ALLOW_THREADS
    if (!channel) {
      PyErr_SetString(PyExc_RuntimeError, "could not create the gRPC channel (credentials or target refused)");
      return -1;
    }
    delete self->channel;
    self->channel = new std::shared_ptr<grpc::Channel>(std::move(channel));
    return 0;
  } catch (...) {
    SetErrorFromCxx("native channel");
  }
  return -1;
}

void Channel_dealloc(ChannelObject* self) {
  std::shared_ptr<grpc::Channel>* channel = self->channel;
  self->channel = nullptr;
  if (channel != nullptr) {
    Py_BEGIN_ALLOW_THREADS
    delete channel;  // the last reference may shut the channel down
    Py_END_ALLOW_THREADS
  }
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyTypeObject ChannelType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------- CallsTransport

struct TransportObject {
  PyObject_HEAD
  CallsReactor* reactor;
};

PyObject* ClosedError() {
  PyErr_SetString(PyExc_ValueError, "CallsTransport is closed");
  return nullptr;
}

int Transport_init(TransportObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kwlist[] = {"channel", "metadata", "method", "coalesce", nullptr};
  PyObject* channel_obj;
  PyObject* metadata = Py_None;
  const char* method = kCallsMethod;
  PyObject* coalesce = Py_None;  // None: on for the Calls method only
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|O$sO", const_cast<char**>(kwlist), &ChannelType, &channel_obj,
                                   &metadata, &method, &coalesce)) {
    return -1;
  }
  if (method[0] != '/' || std::strchr(method + 1, '/') == nullptr) {
    PyErr_Format(PyExc_ValueError, "method must be a full path like %s, got %s", kCallsMethod, method);
    return -1;
  }
  bool join = std::strcmp(method, kCallsMethod) == 0;
  if (coalesce != Py_None) {
    int truth = PyObject_IsTrue(coalesce);
    if (truth < 0) return -1;
    join = truth != 0;
  }
  if (self->reactor != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "CallsTransport is already initialized");
    return -1;
  }
  auto* channel = reinterpret_cast<ChannelObject*>(channel_obj)->channel;
  if (channel == nullptr) {
    PyErr_SetString(PyExc_ValueError, "channel is not initialized");
    return -1;
  }
  try {
    CallsReactor::Metadata pairs;
    if (metadata != Py_None) {
      PyObject* seq = PySequence_Fast(metadata, "metadata must be a sequence of (key, value) pairs");
      if (seq == nullptr) return -1;
      Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
      for (Py_ssize_t i = 0; i < n; ++i) {
        const char *key, *value;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ss", &key, &value)) {
          Py_DECREF(seq);
          return -1;
        }
        pairs.emplace_back(key, value);
      }
      Py_DECREF(seq);
    }
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) {
      PyErr_SetFromErrno(PyExc_OSError);
      return -1;
    }
    auto* reactor = new CallsReactor(efd, method, join);
    std::shared_ptr<grpc::Channel> shared = *channel;
    Py_BEGIN_ALLOW_THREADS
    reactor->Start(std::move(shared), pairs);
    Py_END_ALLOW_THREADS
    self->reactor = reactor;
    return 0;
  } catch (...) {
    SetErrorFromCxx("native stream");
  }
  return -1;
}

void Transport_dealloc(TransportObject* self) {
  CallsReactor* reactor = self->reactor;
  self->reactor = nullptr;
  if (reactor != nullptr) {
    Py_BEGIN_ALLOW_THREADS
    try {
      reactor->Detach();
    } catch (...) {
    }
    Py_END_ALLOW_THREADS
  }
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// Buffers of the pieces of one write, released when done.
class Pieces {
 public:
  ~Pieces() {
    for (Py_buffer& view : views_) PyBuffer_Release(&view);
  }
  bool Add(PyObject* obj) {
    views_.emplace_back();
    if (PyObject_GetBuffer(obj, &views_.back(), PyBUF_SIMPLE) < 0) {
      views_.pop_back();
      return false;
    }
    total_ += static_cast<size_t>(views_.back().len);
    return true;
  }
  size_t total() const { return total_; }
  void CopyTo(char* out) const {
    for (const Py_buffer& view : views_) {
      std::memcpy(out, view.buf, static_cast<size_t>(view.len));
      out += view.len;
    }
  }

 private:
  std::vector<Py_buffer> views_;
  size_t total_ = 0;
};

PyObject* Transport_write(TransportObject* self, PyObject* data) {
  if (self->reactor == nullptr) return ClosedError();
  try {
    Pieces pieces;
    if (PyList_Check(data) || PyTuple_Check(data)) {
      PyObject* seq = PySequence_Fast(data, "");
      if (seq == nullptr) return nullptr;
      Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (!pieces.Add(PySequence_Fast_GET_ITEM(seq, i))) {
          Py_DECREF(seq);
          return nullptr;
        }
      }
      Py_DECREF(seq);
    } else if (!pieces.Add(data)) {
      return nullptr;
    }
    const size_t total = pieces.total();
    grpc_slice raw = grpc_slice_malloc(total);
    char* out = reinterpret_cast<char*>(GRPC_SLICE_START_PTR(raw));
    if (total >= kReleaseGilBytes) {
      Py_BEGIN_ALLOW_THREADS
      pieces.CopyTo(out);
      Py_END_ALLOW_THREADS
    } else {
      pieces.CopyTo(out);
    }
    grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
    long long pending;
    CallsReactor* reactor = self->reactor;
    Py_BEGIN_ALLOW_THREADS
    pending = reactor->Write(std::move(slice));
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(pending);
  } catch (...) {
    SetErrorFromCxx("native write");
  }
  return nullptr;
}

PyObject* Transport_writes_done(TransportObject* self, PyObject*) {
  if (self->reactor == nullptr) return ClosedError();
  CallsReactor* reactor = self->reactor;
  Py_BEGIN_ALLOW_THREADS
  reactor->WritesDone();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* Transport_cancel(TransportObject* self, PyObject*) {
  if (self->reactor == nullptr) Py_RETURN_NONE;
  CallsReactor* reactor = self->reactor;
  Py_BEGIN_ALLOW_THREADS
  reactor->Cancel();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* Transport_close(TransportObject* self, PyObject*) {
  CallsReactor* reactor = self->reactor;
  self->reactor = nullptr;
  if (reactor != nullptr) {
    Py_BEGIN_ALLOW_THREADS
    reactor->Detach();
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

PyObject* Transport_pending(TransportObject* self, PyObject*) {
  if (self->reactor == nullptr) return ClosedError();
  return PyLong_FromLongLong(self->reactor->Pending());
}

PyObject* Transport_notify_below(TransportObject* self, PyObject* arg) {
  if (self->reactor == nullptr) return ClosedError();
  long long threshold = PyLong_AsLongLong(arg);
  if (threshold == -1 && PyErr_Occurred()) return nullptr;
  if (threshold < 0) {
    PyErr_SetString(PyExc_ValueError, "threshold must be >= 0");
    return nullptr;
  }
  self->reactor->NotifyBelow(threshold);
  Py_RETURN_NONE;
}

PyObject* Transport_fileno(TransportObject* self, PyObject*) {
  if (self->reactor == nullptr) return ClosedError();
  return PyLong_FromLong(self->reactor->fd());
}

PyObject* MessageBytes(const std::vector<grpc::Slice>& slices) {
  size_t total = 0;
  for (const grpc::Slice& s : slices) total += s.size();
  if (slices.size() == 1) {
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(slices[0].begin()),
                                     static_cast<Py_ssize_t>(total));
  }
  PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(total));
  if (bytes == nullptr) return nullptr;
  char* out = PyBytes_AS_STRING(bytes);
  auto copy = [&] {
    for (const grpc::Slice& s : slices) {
      std::memcpy(out, s.begin(), s.size());
      out += s.size();
    }
  };
  if (total >= kReleaseGilBytes) {
    Py_BEGIN_ALLOW_THREADS
    copy();
    Py_END_ALLOW_THREADS
  } else {
    copy();
  }
  return bytes;
}

// drain() -> (list[bytes], (code, details) | None, below: bool)
PyObject* Transport_drain(TransportObject* self, PyObject*) {
  if (self->reactor == nullptr) return ClosedError();
  try {
    CallsReactor::Drained drained = self->reactor->Drain();
    PyObject* messages = PyList_New(static_cast<Py_ssize_t>(drained.messages.size()));
    if (messages == nullptr) return nullptr;
    for (size_t i = 0; i < drained.messages.size(); ++i) {
      PyObject* bytes = MessageBytes(drained.messages[i]);
      if (bytes == nullptr) {
        Py_DECREF(messages);
        return nullptr;
      }
      PyList_SET_ITEM(messages, static_cast<Py_ssize_t>(i), bytes);
    }
    PyObject* status;
    if (drained.has_status) {
      status = Py_BuildValue("(is#)", drained.code, drained.message.data(),
                             static_cast<Py_ssize_t>(drained.message.size()));
      if (status == nullptr) {
        // Not UTF-8: keep the code, replace the text.
        PyErr_Clear();
        status = Py_BuildValue("(is)", drained.code, "(status message is not UTF-8)");
      }
      if (status == nullptr) {
        Py_DECREF(messages);
        return nullptr;
      }
    } else {
      status = Py_NewRef(Py_None);
    }
    return Py_BuildValue("(NNO)", messages, status, drained.below ? Py_True : Py_False);
  } catch (...) {
    SetErrorFromCxx("native drain");
  }
  return nullptr;
}

PyMethodDef kTransportMethods[] = {
    {"write", reinterpret_cast<PyCFunction>(Transport_write), METH_O,
     "write(data) -> int: queues one message (bytes-like, or a list/tuple of bytes-like pieces joined); "
     "returns the bytes not yet written, or -1 when the stream takes no more writes. Never blocks."},
    {"writes_done", reinterpret_cast<PyCFunction>(Transport_writes_done), METH_NOARGS,
     "Half-closes the stream once the queued writes are written."},
    {"cancel", reinterpret_cast<PyCFunction>(Transport_cancel), METH_NOARGS, "Cancels the call."},
    {"close", reinterpret_cast<PyCFunction>(Transport_close), METH_NOARGS,
     "Cancels the call and lets go of it; the object is unusable afterwards."},
    {"pending", reinterpret_cast<PyCFunction>(Transport_pending), METH_NOARGS,
     "Bytes queued or in flight (+1 while a half-close is in flight)."},
    {"notify_below", reinterpret_cast<PyCFunction>(Transport_notify_below), METH_O,
     "notify_below(n): the next drain() reports below=True once pending() <= n."},
    {"fileno", reinterpret_cast<PyCFunction>(Transport_fileno), METH_NOARGS,
     "The eventfd that becomes readable when drain() has something."},
    {"drain", reinterpret_cast<PyCFunction>(Transport_drain), METH_NOARGS,
     "drain() -> (messages: list[bytes], status: (code, details) | None, below: bool); resets the eventfd."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject TransportType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ------------------------------------------------------- Namespace events

// namespace_events(message) -> (opened, [(event, data), ...]) | None
PyObject* NamespaceEvents(PyObject*, PyObject* message) {
  Py_buffer view;
  if (PyObject_GetBuffer(message, &view, PyBUF_SIMPLE) < 0) return nullptr;
  PyObject* result = nullptr;
  try {
    std::optional<agentix::host::NamespaceResponseView> decoded = agentix::host::DecodeNamespaceResponse(
        std::string_view(static_cast<const char*>(view.buf), static_cast<size_t>(view.len)));
    if (!decoded) {
      result = Py_NewRef(Py_None);
    } else if (PyObject* events = PyList_New(static_cast<Py_ssize_t>(decoded->events.size()))) {
      bool ok = true;
      for (size_t i = 0; ok && i < decoded->events.size(); ++i) {
        const agentix::host::NamespaceEventView& event = decoded->events[i];
        // (Not Py_BuildValue: it turns an empty view's null pointer into None.
        // The decoder has checked the name's UTF-8.)
        PyObject* name = PyUnicode_DecodeUTF8(event.event.empty() ? "" : event.event.data(),
                                              static_cast<Py_ssize_t>(event.event.size()), "strict");
        PyObject* data = name == nullptr ? nullptr
                                         : PyBytes_FromStringAndSize(event.data.empty() ? "" : event.data.data(),
                                                                     static_cast<Py_ssize_t>(event.data.size()));
        PyObject* item = data == nullptr ? nullptr : PyTuple_Pack(2, name, data);
        Py_XDECREF(name);
        Py_XDECREF(data);
        ok = item != nullptr;
        if (ok) PyList_SET_ITEM(events, static_cast<Py_ssize_t>(i), item);
      }
      if (ok) {
        result = Py_BuildValue("(ON)", decoded->opened ? Py_True : Py_False, events);
      } else {
        Py_DECREF(events);
      }
    }
  } catch (...) {
    SetErrorFromCxx("native namespace_events");
  }
  PyBuffer_Release(&view);
  return result;
}

// ------------------------------------------------------------ Call results

// A CallResult's fields, named as runtime.proto's (wire.RawResult).
PyStructSequence_Field kCallResultFields[] = {
    {"call_id", nullptr},    {"encoding", nullptr}, {"value", nullptr},
    {"value_size", nullptr}, {"log_seq", nullptr},  {"trace_seq", nullptr},
    {nullptr, nullptr},
};
PyStructSequence_Desc kCallResultDesc = {
    "agentix.runtime.client._native_calls.CallResultFields",
    "A CallResult's fields as call_results decodes them (wire.RawResult).", kCallResultFields, 6};
PyTypeObject* call_result_type = nullptr;

// One CallResultFields of `view`, or nullptr with a Python error set.
PyObject* CallResultObject(const agentix::host::CallResultView& view) {
  PyObject* result = PyStructSequence_New(call_result_type);
  if (result == nullptr) return nullptr;
  // (Not Py_BuildValue: it turns an empty view's null pointer into None. The
  // decoder has checked the id's UTF-8.)
  PyObject* fields[] = {
      PyUnicode_DecodeUTF8(view.call_id.empty() ? "" : view.call_id.data(),
                           static_cast<Py_ssize_t>(view.call_id.size()), "strict"),
      PyLong_FromUnsignedLongLong(view.encoding),
      PyBytes_FromStringAndSize(view.value.empty() ? "" : view.value.data(), static_cast<Py_ssize_t>(view.value.size())),
      PyLong_FromUnsignedLongLong(view.value_size),
      PyLong_FromUnsignedLongLong(view.log_seq),
      PyLong_FromUnsignedLongLong(view.trace_seq),
  };
  bool ok = true;
  for (Py_ssize_t i = 0; i < 6; ++i) {
    ok = ok && fields[i] != nullptr;
    PyStructSequence_SET_ITEM(result, i, fields[i]);  // a null item is fine to deallocate
  }
  if (!ok) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

// call_results(message) -> [CallResultFields, ...] | None
PyObject* CallResults(PyObject*, PyObject* message) {
  Py_buffer view;
  if (PyObject_GetBuffer(message, &view, PyBUF_SIMPLE) < 0) return nullptr;
  PyObject* result = nullptr;
  try {
    std::optional<std::vector<agentix::host::CallResultView>> decoded = agentix::host::DecodeCallResults(
        std::string_view(static_cast<const char*>(view.buf), static_cast<size_t>(view.len)));
    if (!decoded) {
      result = Py_NewRef(Py_None);
    } else if (PyObject* results = PyList_New(static_cast<Py_ssize_t>(decoded->size()))) {
      bool ok = true;
      for (size_t i = 0; ok && i < decoded->size(); ++i) {
        PyObject* item = CallResultObject((*decoded)[i]);
        ok = item != nullptr;
        if (ok) PyList_SET_ITEM(results, static_cast<Py_ssize_t>(i), item);
      }
      if (ok) {
        result = results;
      } else {
        Py_DECREF(results);
      }
    }
  } catch (...) {
    SetErrorFromCxx("native call_results");
  }
  PyBuffer_Release(&view);
  return result;
}

// ------------------------------------------------------------ Call starts

// A str's UTF-8, or false with a Python error set (TypeError naming `what`).
bool Utf8View(PyObject* text, std::string_view* out, const char* what) {
  if (!PyUnicode_Check(text)) {
    PyErr_Format(PyExc_TypeError, "calls_request: %s must be a str", what);
    return false;
  }
  Py_ssize_t size;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);
  if (data == nullptr) return false;
  *out = std::string_view(data, static_cast<size_t>(size));
  return true;
}

// bytes (or a subclass) as a view, or false with a TypeError naming `what`.
bool BytesView(PyObject* bytes, std::string_view* out, const char* what) {
  if (!PyBytes_Check(bytes)) {
    PyErr_Format(PyExc_TypeError, "calls_request: %s must be bytes", what);
    return false;
  }
  *out = std::string_view(PyBytes_AS_STRING(bytes), static_cast<size_t>(PyBytes_GET_SIZE(bytes)));
  return true;
}

// calls_request(acks, call_id, callable_fields, arguments, context,
//               context_is_fields, stream_window, frame_kind) -> bytes
PyObject* CallsRequestBytes(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "calls_request takes 8 arguments");
    return nullptr;
  }
  agentix::host::StartCallParts start;
  if (!Utf8View(args[1], &start.call_id, "call_id") ||
      !BytesView(args[2], &start.callable_fields, "callable_fields") ||
      !BytesView(args[3], &start.arguments, "arguments") || !BytesView(args[4], &start.context, "context")) {
    return nullptr;
  }
  const int is_fields = PyObject_IsTrue(args[5]);
  if (is_fields < 0) return nullptr;
  start.context_is_fields = is_fields != 0;
  const unsigned long window = PyLong_AsUnsignedLong(args[6]);
  if (window == static_cast<unsigned long>(-1) && PyErr_Occurred()) return nullptr;
  if (window > UINT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "calls_request: stream_window exceeds uint32");
    return nullptr;
  }
  start.stream_window = window;
  const long kind = PyLong_AsLong(args[7]);
  if (kind == -1 && PyErr_Occurred()) return nullptr;
  if (kind < 0 || kind > 255) {
    PyErr_SetString(PyExc_ValueError, "calls_request: frame_kind must be 0..255");
    return nullptr;
  }
  PyObject* result = nullptr;
  try {
    std::vector<std::string_view> acks;
    PyObject* ack_list = args[0];
    if (ack_list != Py_None) {
      if (!PyList_Check(ack_list)) {
        PyErr_SetString(PyExc_TypeError, "calls_request: acks must be a list of str or None");
        return nullptr;
      }
      // The views point into the ids' cached UTF-8; nothing below runs Python code.
      const Py_ssize_t count = PyList_GET_SIZE(ack_list);
      acks.resize(static_cast<size_t>(count));
      for (Py_ssize_t i = 0; i < count; ++i) {
        if (!Utf8View(PyList_GET_ITEM(ack_list, i), &acks[static_cast<size_t>(i)], "an ack id")) return nullptr;
      }
    }
    const uint8_t frame_kind = static_cast<uint8_t>(kind);
    const size_t size = agentix::host::CallsRequestSize(acks, start, frame_kind);
    if (size > static_cast<size_t>(PY_SSIZE_T_MAX)) {
      PyErr_SetString(PyExc_OverflowError, "calls_request: message too large");
      return nullptr;
    }
    result = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
    if (result != nullptr) agentix::host::EncodeCallsRequest(acks, start, frame_kind, PyBytes_AS_STRING(result));
  } catch (...) {
    Py_CLEAR(result);
    SetErrorFromCxx("native calls_request");
  }
  return result;
}

// copy_payload(target, offset, source): target[offset:offset + len(source)]
// = source, with base::CopyPayload (non-temporal stores for large pieces)
// and without the GIL for those.
PyObject* CopyPayloadInto(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "copy_payload(target, offset, source) takes 3 arguments");
    return nullptr;
  }
  const Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
  if (offset == -1 && PyErr_Occurred()) return nullptr;
  Py_buffer out;
  if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) return nullptr;
  Py_buffer in;
  if (PyObject_GetBuffer(args[2], &in, PyBUF_SIMPLE) < 0) {
    PyBuffer_Release(&out);
    return nullptr;
  }
  PyObject* result = nullptr;
  if (offset < 0 || offset > out.len || in.len > out.len - offset) {
    PyErr_Format(PyExc_ValueError, "copy_payload: %zd bytes at offset %zd of a %zd-byte target", in.len, offset,
                 out.len);
  } else {
    char* to = static_cast<char*>(out.buf) + offset;
    const size_t size = static_cast<size_t>(in.len);
    if (size >= agentix::base::kPayloadCopyStreamBytes) {
      Py_BEGIN_ALLOW_THREADS agentix::base::CopyPayload(to, in.buf, size);
      Py_END_ALLOW_THREADS
    } else {
      std::memcpy(to, in.buf, size);
    }
    result = Py_NewRef(Py_None);
  }
  PyBuffer_Release(&in);
  PyBuffer_Release(&out);
  return result;
}

// prefault_for_write(target) -> (huge_bytes, small_bytes): base::PrefaultForWrite
// over a writable buffer about to be written in full (a large value being
// decoded), without the GIL.
PyObject* PrefaultForWriteOf(PyObject*, PyObject* target) {
  Py_buffer view;
  if (PyObject_GetBuffer(target, &view, PyBUF_WRITABLE) < 0) return nullptr;
  agentix::base::PrefaultResult done;
  Py_BEGIN_ALLOW_THREADS done = agentix::base::PrefaultForWrite(view.buf, static_cast<size_t>(view.len));
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  return Py_BuildValue("(nn)", static_cast<Py_ssize_t>(done.huge_bytes), static_cast<Py_ssize_t>(done.small_bytes));
}

// new_buffer(size) -> bytearray: see its docstring. Fresh memory filled at
// once costs about half of a fault a page on these VMs (docs/DECISIONS.md
// "stop-59"), and nothing is zero-filled: the frame reader writes every byte.
PyObject* NewBuffer(PyObject*, PyObject* arg) {
  const Py_ssize_t size = PyLong_AsSsize_t(arg);
  if (size == -1 && PyErr_Occurred()) return nullptr;
  if (size < 0) {
    PyErr_SetString(PyExc_ValueError, "new_buffer: the size is negative");
    return nullptr;
  }
  PyObject* buffer = PyByteArray_FromStringAndSize(nullptr, size);
  if (buffer == nullptr) return nullptr;
  char* const data = PyByteArray_AS_STRING(buffer);
  Py_BEGIN_ALLOW_THREADS(void) agentix::base::PopulateFreshForWrite(data, static_cast<size_t>(size));
  Py_END_ALLOW_THREADS return buffer;
}

// populate_fresh(target) -> bool: base::PopulateFreshForWrite over a writable
// buffer about to be written in full (the payload ring's pages past the
// furthest any message reached), without the GIL.
PyObject* PopulateFresh(PyObject*, PyObject* target) {
  Py_buffer view;
  if (PyObject_GetBuffer(target, &view, PyBUF_WRITABLE) < 0) return nullptr;
  bool filled = false;
  Py_BEGIN_ALLOW_THREADS filled = agentix::base::PopulateFreshForWrite(view.buf, static_cast<size_t>(view.len));
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  return PyBool_FromLong(filled);
}

PyMethodDef kModuleMethods[] = {
    {"populate_fresh", PopulateFresh, METH_O,
     "populate_fresh(target) -> bool: faults in the whole pages inside a writable buffer about to be "
     "written in full, in one system call and a read a page instead of a fault a page, unless its middle "
     "page is resident already (recycled memory); whether it filled them (base::PopulateFreshForWrite)."},
    {"new_buffer", NewBuffer, METH_O,
     "new_buffer(size) -> bytearray of `size` bytes whose contents are undefined, for a buffer about to be "
     "written in full (a large frame's payload read from a socket): not zero-filled, and when its memory is "
     "fresh its whole pages are faulted in at once instead of one fault a page "
     "(base::PopulateFreshForWrite)."},
    {"prefault_for_write", PrefaultForWriteOf, METH_O,
     "prefault_for_write(target) -> (huge_bytes, small_bytes): faults in the whole 2 MiB pages inside a "
     "writable buffer of 4 MiB or more that is about to be written in full (a large value being decoded), "
     "in huge or small pages by whichever has been cheaper here (base/fresh_pages.h); the bytes done each "
     "way, (0, 0) if none."},
    {"copy_payload", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(CopyPayloadInto)), METH_FASTCALL,
     "copy_payload(target, offset, source) -> None: target[offset:offset + len(source)] = source for "
     "contiguous buffers (a writable target), with non-temporal stores for pieces of 256 KiB or more "
     "(payload ring and decode copies, base/payload_copy.h); ValueError if it does not fit."},
    {"call_results", CallResults, METH_O,
     "call_results(message) -> [CallResultFields, ...] | None: the CallResults of a serialized "
     "CallsResponse that holds nothing else, or None when only protobuf should judge the bytes (another "
     "event kind, malformed, or a form this decoder does not read; see call_results_wire.h)."},
    {"calls_request", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(CallsRequestBytes)), METH_FASTCALL,
     "calls_request(acks, call_id, callable_fields, arguments, context, context_is_fields, stream_window, "
     "frame_kind) -> bytes: a serialized CallsRequest of an AckResult per id in `acks` (a list of str, or "
     "None) and then one StartCall (callable_fields: its encoded callable and encoding; arguments: all of "
     "them; context: the pickled carrier, or with context_is_fields its encoded plain fields), the bytes "
     "wire.start_call_event and wire.ack_events make; with a frame_kind other than 0 behind the frame "
     "wire's header of that kind (see call_start_wire.h)."},
    {"namespace_events", NamespaceEvents, METH_O,
     "namespace_events(message) -> (opened, [(event, data), ...]) | None: the parts of a serialized "
     "NamespaceResponse the host acts on, or None when only protobuf should judge the bytes (malformed, "
     "or a form this decoder does not read; see namespace_wire.h)."},
    {"log_records", agentix::host::LogRecords, METH_O,
     "log_records(message) -> (instance_id, [LogRecordFields, ...]) | None: a serialized LogsResponse's "
     "records, attributes named as LogRecord's fields, or None when only protobuf should judge the bytes "
     "(malformed, or a form this decoder does not read; see side_wire.h)."},
    {"trace_events", agentix::host::TraceEvents, METH_O,
     "trace_events(message) -> (instance_id, [TraceEventFields, ...]) | None: a serialized TracesResponse's "
     "events (attributes and events as tuples, attributes as (key, value) pairs; no OpenTelemetry ids), or None as log_records."},
    {"span_item", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(agentix::host::SpanItem)),
     METH_FASTCALL,
     "span_item(event, span_type, max_id_chars, max_name_chars, max_key_chars, max_attributes) -> Span | None: "
     "the span traces.trace_item makes of a plain SPAN_START / SPAN_END TraceEventFields (no span events, no "
     "error, within the limits), made in one call; None for any other event (then trace_item's path)."},
    {"iso_from_unix_nanos", agentix::host::IsoFromUnixNanos, METH_O,
     "iso_from_unix_nanos(nanos) -> str | None: an int64 of nanoseconds since the epoch as agentix.trace's "
     "ISO-8601 UTC stamp (YYYY-MM-DDTHH:MM:SS.ffffffZ, truncated to microseconds); None for 0 or less."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT};

}  // namespace

PyMODINIT_FUNC PyInit__native_calls() {
  // This process's gRPC (grpcio's too: both use Debian's Abseil) locks an
  // absl::Mutex on every hop of a call; see mutex_tuning.h.
  agentix::base::DisableMutexDeadlockDetection();
  ChannelType.tp_name = "agentix.runtime.client._native_calls.Channel";
  ChannelType.tp_basicsize = sizeof(ChannelObject);
  ChannelType.tp_flags = Py_TPFLAGS_DEFAULT;
  ChannelType.tp_doc = "Channel(target, tls=None, options=None): a grpc++ channel. "
                       "tls: (root_pem | None, cert_chain_pem | None, key_pem | None).";
  ChannelType.tp_new = PyType_GenericNew;
  ChannelType.tp_init = reinterpret_cast<initproc>(Channel_init);
  ChannelType.tp_dealloc = reinterpret_cast<destructor>(Channel_dealloc);

  TransportType.tp_name = "agentix.runtime.client._native_calls.CallsTransport";
  TransportType.tp_basicsize = sizeof(TransportObject);
  TransportType.tp_flags = Py_TPFLAGS_DEFAULT;
  TransportType.tp_doc =
      "CallsTransport(channel, metadata=None, *, method='/agentix.runtime.v1.RuntimeService/Calls', "
      "coalesce=None): one open bidirectional stream of `method` (bytes in, bytes out). coalesce: join "
      "writes queued behind one in flight into one message (default: only for Calls, whose messages "
      "concatenate); otherwise every write is one message.";
  TransportType.tp_new = PyType_GenericNew;
  TransportType.tp_init = reinterpret_cast<initproc>(Transport_init);
  TransportType.tp_dealloc = reinterpret_cast<destructor>(Transport_dealloc);
  TransportType.tp_methods = kTransportMethods;

  kModule.m_name = "agentix.runtime.client._native_calls";
  kModule.m_doc = "The host's Calls and Namespace streams over grpc++ (stream.NativeCallsStream, "
                  "namespaces.NativeNamespaceStream), and decoders of Calls responses of results and of the Namespace, Logs and Traces responses.";
  kModule.m_size = -1;
  kModule.m_methods = kModuleMethods;

  if (PyType_Ready(&ChannelType) < 0 || PyType_Ready(&TransportType) < 0) return nullptr;
  call_result_type = PyStructSequence_NewType(&kCallResultDesc);
  if (call_result_type == nullptr) return nullptr;
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr) return nullptr;
  if (PyModule_AddObjectRef(module, "Channel", reinterpret_cast<PyObject*>(&ChannelType)) < 0 ||
      PyModule_AddObjectRef(module, "CallsTransport", reinterpret_cast<PyObject*>(&TransportType)) < 0 ||
      PyModule_AddObjectRef(module, "CallResultFields", reinterpret_cast<PyObject*>(call_result_type)) < 0 ||
      !agentix::host::AddSideRecordTypes(module) ||
      !agentix::host::AddLogReplayType(module)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
