#include "worker/channel/result_sender.h"

#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "worker/channel/channel_state.h"
#include "worker/channel/py_args.h"
#include "worker/direct/chunk_buffers.h"
#include "worker/ipc/chunking.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {
namespace {

// The end of a call-path send: a failed write is the channel's error, and
// `out` is flushed once it holds kFlushThreshold bytes.
PyObject* Sent(PyObject* self, ChannelState& st, const absl::Status& status) {
  if (!status.ok()) {
    SetError(StateOfChannel(self)->channel_error, status);
    return nullptr;
  }
  if (st.out.size() >= kFlushThreshold && !Flush(self)) return nullptr;
  Py_RETURN_NONE;
}

// Sends encoded frames given as pieces (headers, slices of the caller's
// payload, trailers). Small ones are copied into st.out like any frame; from
// kFlushThreshold on, the pieces are written where they are, with writev,
// after the queued logs and st.out, holding the channel's write side with
// the GIL released, so the payload is never copied and no other thread's
// frames interleave. GIL held on entry and exit; the caller's Py_buffer
// keeps the payload alive throughout. kUnavailable if the write failed.
absl::Status SendPieces(ChannelState& st,
                        const std::vector<std::string_view>& pieces) {
  size_t size = 0;
  for (std::string_view piece : pieces) size += piece.size();
  if (size < kFlushThreshold) {
    try {
      for (std::string_view piece : pieces) st.out.append(piece);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("out of memory");
    }
    st.uncaught = true;  // the barrier is paid when `out` is written
    return absl::OkStatus();
  }
  Writer& w = *st.writer;
  st.uncaught = true;
  AcquireCaughtUp(st);
  absl::Status status = WithoutGil([&w, &st, &pieces] {
    const std::string logs = TakeLogs(w);
    std::vector<std::string_view> all;
    all.reserve(pieces.size() + 2);
    all.push_back(logs);
    all.push_back(st.out);
    all.insert(all.end(), pieces.begin(), pieces.end());
    absl::Status written = ipc::WriteAll(w.fd, all);
    st.out.clear();
    return written;
  });
  Leave(w);
  return status;
}

// The frames of a result as pieces: kChunkBytes-sized `result_chunk` frames
// (all sharing one header) and the final `result` frame with the last
// (1..kChunkBytes) bytes, so the payload is referenced, not copied. The
// header strings are stored in `headers` and must outlive the pieces.
absl::Status ResultPieces(const std::string& call_id, int encoding,
                          std::string_view data, std::string (&headers)[3],
                          std::vector<std::string_view>& pieces) {
  constexpr size_t kChunk = ipc::kChunkBytes;
  const size_t size = data.size();
  const auto [chunks, last] = ipc::SplitWithTail(size);
  ipc::Frame frame;
  frame.call_id = call_id;
  std::string unused_tail;  // chunk frames end with their payload
  if (chunks > 0) {
    frame.type = ipc::FrameType::kResultChunk;
    absl::Status status =
        ipc::EncodeFrameAround(frame, kChunk, headers[0], unused_tail);
    if (!status.ok()) return status;
  }
  frame.type = ipc::FrameType::kResult;
  frame.encoding = encoding;
  frame.total_size = size;
  absl::Status status =
      ipc::EncodeFrameAround(frame, last, headers[1], headers[2]);
  if (!status.ok()) return status;
  pieces.reserve(2 * chunks + 3);
  for (size_t i = 0; i < chunks; ++i) {
    pieces.push_back(headers[0]);
    pieces.push_back(data.substr(i * kChunk, kChunk));
  }
  pieces.push_back(headers[1]);
  pieces.push_back(data.substr(chunks * kChunk));
  pieces.push_back(headers[2]);
  return absl::OkStatus();
}

// The bytes [offset, offset + size) of the concatenation of `parts`, as
// views into them.
std::vector<std::string_view> SliceParts(
    const std::vector<std::string_view>& parts, size_t offset, size_t size) {
  std::vector<std::string_view> out;
  for (std::string_view part : parts) {
    if (size == 0) break;
    if (offset >= part.size()) {
      offset -= part.size();
      continue;
    }
    const std::string_view piece = part.substr(offset, size);
    out.push_back(piece);
    size -= piece.size();
    offset = 0;
  }
  return out;
}

// The header of one piece of a result cut into pieces: a result_chunk, or
// the final result frame, which carries the encoding and the total size.
void SetResultPieceHeader(ipc::Frame& frame, bool final,
                          const std::string& call_id, int encoding,
                          size_t size) {
  frame.type = final ? ipc::FrameType::kResult : ipc::FrameType::kResultChunk;
  frame.call_id = call_id;
  if (final) {
    frame.encoding = encoding;
    frame.total_size = size;
  }
}

// A large result with a payload area: each piece is copied into the ring
// and announced by a small frame written at once (so the daemon copies it
// out while the next is copied in); a piece that does not fit now (or is
// small) goes inline around the caller's buffers. The result is the
// concatenation of `parts` (a pickle written as pieces: its large values
// are never joined). Like SendPieces' large path: queued logs and st.out
// first, the write side held, the GIL released.
absl::Status SendResultViaRing(ChannelState& st, const std::string& call_id,
                               int encoding,
                               const std::vector<std::string_view>& parts,
                               size_t size) {
  Writer& w = *st.writer;
  st.uncaught = true;
  AcquireCaughtUp(st);
  absl::Status status = WithoutGil([&]() -> absl::Status {
    const std::string logs = TakeLogs(w);
    const std::string_view queued[] = {logs, st.out};
    absl::Status written = ipc::WriteAll(w.fd, queued);
    st.out.clear();
    if (!written.ok()) return written;
    constexpr size_t kChunk = ipc::kChunkBytes;
    const auto [chunks, last] = ipc::SplitWithTail(size);
    std::string head, tail;
    for (size_t i = 0; i <= chunks; ++i) {
      const bool final = i == chunks;
      const size_t piece_size = final ? last : kChunk;
      std::vector<std::string_view> piece =
          SliceParts(parts, i * kChunk, piece_size);
      ipc::Frame frame;
      SetResultPieceHeader(frame, final, call_id, encoding, size);
      std::optional<uint64_t> pos;
      if (piece_size >= ipc::kRingMinPieceBytes) {
        pos = st.payloads->Put(piece);
      }
      if (pos) {
        frame.in_ring = true;
        frame.ring_pos = *pos;
        frame.ring_size = piece_size;
        head.clear();
        written = ipc::AppendFrame(frame, head);
        if (written.ok()) written = ipc::WriteAll(w.fd, head);
      } else {
        written = ipc::EncodeFrameAround(frame, piece_size, head, tail);
        piece.insert(piece.begin(), head);
        piece.push_back(tail);
        if (written.ok()) written = ipc::WriteAll(w.fd, piece);
      }
      if (!written.ok()) return written;
    }
    return absl::OkStatus();
  });
  Leave(w);
  return status;
}

// Buffers of the parts of a result, released when done.
class ResultParts {
 public:
  ResultParts() = default;
  ResultParts(const ResultParts&) = delete;
  ResultParts& operator=(const ResultParts&) = delete;
  ~ResultParts() {
    for (Py_buffer& view : views_) PyBuffer_Release(&view);
  }
  // `data`: one buffer, or a list of buffers. False with a Python error set.
  bool Take(PyObject* data) {
    if (!PyList_Check(data)) return Add(data);
    views_.reserve(static_cast<size_t>(PyList_GET_SIZE(data)));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(data); ++i) {
      if (!Add(PyList_GET_ITEM(data, i))) return false;
    }
    return true;
  }
  const std::vector<std::string_view>& parts() const { return parts_; }
  size_t size() const { return size_; }

 private:
  bool Add(PyObject* object) {
    Py_buffer view;
    if (PyObject_GetBuffer(object, &view, PyBUF_CONTIG_RO) != 0) return false;
    views_.push_back(view);
    parts_.emplace_back(static_cast<const char*>(view.buf),
                        static_cast<size_t>(view.len));
    size_ += static_cast<size_t>(view.len);
    return true;
  }
  std::vector<Py_buffer> views_;
  std::vector<std::string_view> parts_;
  size_t size_ = 0;
};

// Whether a direct session runs `call_id`, asked when its reply is ready.
// First the side-channel barrier's fd half, as AcquireCaughtUp does for the
// link: lines written to fds 1/2 before the call returned (os.write, C
// output, a child) that are still in the capture pipes are queued now, so
// Reply counts them (Writer::untagged_records) and holds the reply for
// their seqs. One epoll_wait(0) when the pipes are empty: a call that wrote
// nothing asks nothing. If CatchUp let go of the GIL, another thread may be
// writing `out` and the call may have left its session: both are waited
// for and asked again.
bool DirectOwnsCaughtUp(ChannelState& st, const std::string& call_id) {
  if (st.direct == nullptr || !st.direct->Owns(call_id)) return false;
  if (!st.capture->CatchUp()) return true;
  WaitIdle(*st.writer);
  return st.direct->Owns(call_id);
}

// A direct call's output goes to its session (docs/DIRECT-CALLS.md), which
// writes it on the host's connection; the link never sees it. Called after
// DirectOwnsCaughtUp said a direct session runs the call, the GIL held
// since (so no collapse or cancel came between: no second lookup). False
// if no direct session runs it after all.
bool SendDirect(ChannelState& st, std::vector<ipc::Frame> frames) {
  if (st.direct == nullptr) return false;
  // A barrier_ask goes into `out`, written after the records queued before.
  const size_t queued = st.out.size();
  const bool ok = st.direct->Reply(
      std::move(frames),
      st.writer->untagged_records.load(std::memory_order_acquire), st.out);
  if (st.out.size() != queued) st.uncaught = true;
  return ok;
}

bool SendDirect(ChannelState& st, ipc::Frame frame) {
  std::vector<ipc::Frame> frames;
  frames.push_back(std::move(frame));
  return SendDirect(st, std::move(frames));
}

// A direct call's result as the frames the relayed path writes: whole
// kChunkBytes result_chunk frames, then the result frame with the rest,
// each copied once from the caller's buffers. Cut here, not joined into one
// frame that the session cuts again (CallTable::TakeWorkerOutput): that was
// a second copy of the payload and twice its size in fresh memory on
// whichever pool thread replied (stop 40: 8,192 page faults a 16 MiB echo
// once the 16- and 64-caller phases had spread the replies over threads).
// The chunks' buffers come from `buffers`, which gets them back once the
// host acked them, so their pages are reused whichever thread replies.
// kResourceExhausted when out of memory.
absl::Status DirectResultFrames(const std::string& call_id, int encoding,
                                const std::vector<std::string_view>& parts,
                                size_t size, ChunkBuffers& buffers,
                                std::vector<ipc::Frame>& frames) {
  const auto [chunks, last] = ipc::SplitWithTail(size);
  try {
    frames.resize(chunks + 1);
    for (size_t i = 0; i <= chunks; ++i) {
      ipc::Frame& frame = frames[i];
      const bool final = i == chunks;
      SetResultPieceHeader(frame, final, call_id, encoding, size);
      const size_t piece_size = final ? last : ipc::kChunkBytes;
      if (final) {
        frame.data.reserve(piece_size);  // the session keeps it as is
      } else {
        frame.data = buffers.Take(piece_size);
      }
      for (std::string_view piece :
           SliceParts(parts, i * ipc::kChunkBytes, piece_size)) {
        frame.data.append(piece);
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory");
  }
  return absl::OkStatus();
}

}  // namespace


PyObject* ChannelSendResult(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("send_result", nargs, 3)) return nullptr;
  std::string call_id;
  long long encoding = 0;
  if (!ToUtf8(args[0], "call_id", "surrogateescape", call_id) ||
      !ToInt(args[1], "encoding", encoding)) {
    return nullptr;
  }
  ChannelState& st = Channel(self);
  absl::Status status;
  {
    ResultParts result;
    // The list is not changed while we hold the GIL; its items' buffers stay
    // exported (hence unchanged) until `result` ends.
    if (!result.Take(args[2])) return nullptr;
    if (DirectOwnsCaughtUp(st, call_id)) {
      std::vector<ipc::Frame> frames;
      if (!DirectResultFrames(call_id, static_cast<int>(encoding),
                              result.parts(), result.size(),
                              st.direct->chunk_buffers(), frames)
               .ok()) {
        return PyErr_NoMemory();
      }
      // False only if the call ended meanwhile (not possible under the
      // GIL): nobody wants it then.
      (void)SendDirect(st, std::move(frames));
      Py_RETURN_NONE;
    }
    if (st.payloads != nullptr && result.size() >= kFlushThreshold) {
      status = SendResultViaRing(st, call_id, static_cast<int>(encoding),
                                 result.parts(), result.size());
    } else {
      std::string joined;
      std::string_view data;
      if (result.parts().size() == 1) {
        data = result.parts()[0];
      } else {
        joined.reserve(result.size());
        for (std::string_view part : result.parts()) joined.append(part);
        data = joined;
      }
      std::string headers[3];
      std::vector<std::string_view> pieces;
      status = ResultPieces(call_id, static_cast<int>(encoding), data, headers,
                            pieces);
      if (status.ok()) status = SendPieces(st, pieces);
    }
  }
  return Sent(self, st, status);
}

PyObject* ChannelSendItem(PyObject* self, PyObject* const* args,
                          Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("send_item", nargs, 4)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kStreamItem;
  long long index = 0;
  long long encoding = 0;
  if (!ToUtf8(args[0], "call_id", "surrogateescape", frame.call_id) ||
      !ToInt(args[1], "index", index) ||
      !ToInt(args[2], "encoding", encoding)) {
    return nullptr;
  }
  if (index < 0) {
    PyErr_SetString(PyExc_ValueError, "index must not be negative");
    return nullptr;
  }
  frame.index = static_cast<uint64_t>(index);
  frame.encoding = static_cast<int>(encoding);
  Py_buffer view;
  if (PyObject_GetBuffer(args[3], &view, PyBUF_CONTIG_RO) != 0) return nullptr;
  const char* data = static_cast<const char*>(view.buf);
  const size_t size = static_cast<size_t>(view.len);
  if (size > ipc::kMaxFrameBytes) {
    // Refused before copying; AppendFrame catches the last few bytes of
    // frame overhead below.
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_ValueError,
                 "stream item of %zu bytes exceeds the %u-byte frame limit",
                 size, ipc::kMaxFrameBytes);
    return nullptr;
  }
  ChannelState& st = Channel(self);
  if (DirectOwnsCaughtUp(st, frame.call_id)) {
    frame.data.assign(data, size);
    PyBuffer_Release(&view);
    SendDirect(st, std::move(frame));
    Py_RETURN_NONE;
  }
  std::string head, tail;
  absl::Status status = ipc::EncodeFrameAround(frame, size, head, tail);
  if (!status.ok()) {
    // Nothing was queued. Only the frame limit fails here, so the driver
    // can fail the call without declaring the channel dead.
    PyBuffer_Release(&view);
    SetError(PyExc_ValueError, status);
    return nullptr;
  }
  status = SendPieces(st, {head, std::string_view(data, size), tail});
  PyBuffer_Release(&view);
  return Sent(self, st, status);
}

PyObject* ChannelSendError(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  if (!Enter(self)) return nullptr;
  if (nargs != 6 && nargs != 9) {
    PyErr_Format(PyExc_TypeError,
                 "send_error() takes 6 or 9 arguments (%zd given)", nargs);
    return nullptr;
  }
  ipc::Frame frame;
  frame.type = ipc::FrameType::kError;
  long long code = 0;
  if (!ToUtf8(args[0], "call_id", "surrogateescape", frame.call_id) ||
      !ToInt(args[1], "code", code) ||
      !ToUtf8(args[2], "type", "backslashreplace", frame.error.type) ||
      !ToUtf8(args[3], "message", "backslashreplace", frame.error.message) ||
      !ToUtf8(args[4], "traceback", "backslashreplace",
              frame.error.traceback)) {
    return nullptr;
  }
  const int cancelled = PyObject_IsTrue(args[5]);
  if (cancelled < 0) return nullptr;
  frame.error.code = static_cast<int>(code);
  frame.error.cancelled = cancelled != 0;
  if (nargs == 9) {
    if (!ToUtf8(args[6], "type_module", "backslashreplace",
                frame.error.type_module) ||
        !ToUtf8(args[7], "type_qualname", "backslashreplace",
                frame.error.type_qualname)) {
      return nullptr;
    }
    if (args[8] != Py_None) {
      Py_buffer view;
      if (PyObject_GetBuffer(args[8], &view, PyBUF_CONTIG_RO) != 0) {
        return nullptr;
      }
      // An over-large state is dropped, not refused: the error still goes.
      if (static_cast<size_t>(view.len) <= ipc::kMaxExceptionStateBytes) {
        frame.error.state.assign(static_cast<const char*>(view.buf),
                                 static_cast<size_t>(view.len));
      }
      PyBuffer_Release(&view);
    }
  }
  ChannelState& st = Channel(self);
  if (DirectOwnsCaughtUp(st, frame.call_id)) {
    SendDirect(st, std::move(frame));
    Py_RETURN_NONE;
  }
  Channel(self).uncaught = true;  // the barrier is paid when it is written
  if (!Queue(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

}  // namespace agentix::worker
