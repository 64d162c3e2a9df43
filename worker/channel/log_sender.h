// The log queue's consumer: a thread that writes queued log, trace and
// namespace frames as soon as the channel is free, so records from any
// thread reach the daemon promptly, batched by whatever accumulated. Its
// producers: Python senders (QueueLogsFromPython) and the capture drainers
// (QueueLogs).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "worker/channel/writer.h"

namespace agentix::worker {

// Encoded log frames waiting for the sender beyond this make producers wait
// (Python senders with the GIL released, drainers before their next read):
// a daemon that stops reading must not make the worker grow without bound.
inline constexpr size_t kMaxQueuedLogBytes = 16u * 1024 * 1024;
// A batch this large goes out without the sender's linger.
inline constexpr size_t kLingerBytes = 64 * 1024;

// Appends encoded log frames to the queue and wakes the sender. Waits while
// the queue is over kMaxQueuedLogBytes; must be called without the GIL.
// False if they were dropped: a log write failed or the sender has stopped.
bool QueueLogs(Writer& w, std::string& frames);

// The same with the GIL held, starting the sender if needed: the common case
// only appends under the leaf lock; a full queue is waited on with the GIL
// released. Records from a forked child are dropped (false).
bool QueueLogsFromPython(const std::shared_ptr<Writer>& writer,
                         std::string& frames);

// Starts the sender thread unless it runs (or was stopped: then records
// are dropped). Writer::mu held (and the GIL).
void EnsureSenderLocked(const std::shared_ptr<Writer>& writer);

// Stops the sender after it wrote what is queued, waiting at most
// `timeout_ms` (it may be stuck writing to a daemon that stopped reading;
// then it is abandoned, which is safe: it owns its Writer). No GIL.
void StopSender(const std::shared_ptr<Writer>& writer, int timeout_ms);

}  // namespace agentix::worker
