#include "agentix/frame_transport.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "wire/frame_codec.h"

namespace agentix::client_internal {
namespace {

namespace pb = ::agentix::runtime::v1;
using ::agentix::sandbox::FrameKind;

// The read buffer starts at this size (a noop's response is ~100 bytes; a
// 1 MiB ResultChunk grows it for that frame).
constexpr size_t kReadBytes = 64 << 10;
// Buffers grown past this for one large frame are given back afterwards.
constexpr size_t kKeepBytes = 256 << 10;

class FrameTransport final : public CallsTransport {
 public:
  FrameTransport(int fd, const StreamMetadata& metadata, absl::Duration spin,
                 CallsCpuAnswer on_calls_cpu)
      : fd_(fd), spin_(spin), on_calls_cpu_(std::move(on_calls_cpu)), window_(spin),
        in_(kReadBytes) {
    const sandbox::FrameMetadata pairs(metadata.begin(), metadata.end());
    const std::string hello =
        sandbox::EncodeFrame(FrameKind::kHello, sandbox::EncodeHello(pairs));
    SendAll(hello.data(), hello.size());  // a failure shows on the next Read
  }
  ~FrameTransport() override { ::close(fd_); }

  bool Write(const pb::CallsRequest& request) override {
    const size_t size = request.ByteSizeLong();
    out_.resize(sandbox::kFrameHeaderBytes + size);
    sandbox::EncodeFrameHeader(FrameKind::kMessage, static_cast<uint32_t>(size), out_.data());
    request.SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(out_.data() + sandbox::kFrameHeaderBytes));
    const bool sent = SendAll(out_.data(), out_.size());
    if (out_.capacity() > kKeepBytes) std::string().swap(out_);
    return sent;
  }

  bool WritesDone() override {
    char header[sandbox::kFrameHeaderBytes];
    sandbox::EncodeFrameHeader(FrameKind::kHalfClose, 0, header);
    return SendAll(header, sizeof(header));
  }

  bool Read(pb::CallsResponse* response) override {
    for (;;) {
      const absl::string_view buffered(in_.data() + start_, end_ - start_);
      absl::StatusOr<sandbox::FrameView> frame = sandbox::ParseFrame(buffered);
      if (!frame.ok()) {
        return End(absl::InternalError(absl::StrCat(
            "malformed frame from agentix-sandboxd: ", frame.status().message())));
      }
      if (frame->frame_bytes == 0) {
        if (!Fill(buffered)) return false;
        continue;
      }
      start_ += frame->frame_bytes;
      switch (frame->kind) {
        case FrameKind::kMessage:
          if (!response->ParseFromArray(frame->payload.data(),
                                        static_cast<int>(frame->payload.size()))) {
            return End(absl::InternalError(
                "agentix-sandboxd sent a MESSAGE frame that is not a CallsResponse"));
          }
          Compact();
          return true;
        case FrameKind::kStatus: {
          absl::StatusOr<sandbox::FrameStatus> status = sandbox::DecodeStatus(frame->payload);
          if (!status.ok()) {
            return End(absl::InternalError(absl::StrCat(
                "malformed STATUS frame from agentix-sandboxd: ", status.status().message())));
          }
          const absl::StatusCode code = status->code <= 16
                                            ? static_cast<absl::StatusCode>(status->code)
                                            : absl::StatusCode::kUnknown;
          return End(absl::Status(code, status->details));
        }
        case FrameKind::kHello: {
          // The daemon's answer to agentix-calls-cpu-follow (asked only
          // with a callback); a daemon never sends one unasked.
          absl::StatusOr<sandbox::FrameMetadata> told = sandbox::DecodeHello(frame->payload);
          if (!told.ok() || !on_calls_cpu_) {
            return End(absl::InternalError("agentix-sandboxd sent an unasked or bad HELLO"));
          }
          const std::string* value = sandbox::FindMetadata(*told, sandbox::kFrameCallsCpuKey);
          if (value != nullptr) on_calls_cpu_(*value);
          Compact();
          continue;
        }
        default:
          return End(absl::InternalError(absl::StrCat(
              "agentix-sandboxd sent a frame of kind ", static_cast<int>(frame->kind),
              ", which only a host sends")));
      }
    }
  }

  void Cancel() override {
    cancelled_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // wakes a blocked recv() or send()
  }

  absl::Status Finish() override {
    absl::MutexLock lock(&mu_);
    if (!ended_.has_value()) {
      ended_ = cancelled_ ? absl::CancelledError("the Calls stream was cancelled")
                          : absl::UnavailableError("the frame wire stream was not ended");
    }
    ::shutdown(fd_, SHUT_RDWR);
    return *ended_;
  }

  const char* wire() const override { return "frames"; }

 private:
  // Records how the stream ended (the first reason wins); false, for Read.
  bool End(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (!ended_.has_value()) {
      ended_ = cancelled_ ? absl::CancelledError("the Calls stream was cancelled")
                          : std::move(status);
    }
    return false;
  }

  // Reads more bytes after `buffered` (an incomplete frame); false (with the
  // stream ended) on EOF or an error.
  bool Fill(absl::string_view buffered) {
    size_t need = kReadBytes;
    if (buffered.size() >= sandbox::kFrameHeaderBytes) {
      uint32_t payload;
      std::memcpy(&payload, buffered.data(), sizeof(payload));  // little-endian host
      need = std::max(need, sandbox::kFrameHeaderBytes + payload);
    }
    if (start_ > 0 && start_ + need > in_.size()) {
      std::memmove(in_.data(), in_.data() + start_, end_ - start_);
      end_ -= start_;
      start_ = 0;
    }
    if (need > in_.size()) in_.resize(need);
    if (spin_ > absl::ZeroDuration()) Spin();
    for (;;) {
      const ssize_t n = ::recv(fd_, in_.data() + end_, in_.size() - end_, 0);
      if (n > 0) {
        end_ += static_cast<size_t>(n);
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) {
        return End(absl::UnavailableError(
            "agentix-sandboxd closed the frame wire connection without a status"));
      }
      return End(absl::UnavailableError(
          absl::StrCat("reading the frame wire: ", std::strerror(errno))));
    }
  }

  // Polls the socket without sleeping for up to the current window, then
  // waits for it (the recv that follows then returns at once); the window
  // adapts as the daemon's spinning threads' (sandbox/frame_wire_server.h):
  // the whole wait counts, a short one doubles it (up to spin_), a long one
  // halves it, so a client that calls rarely soon stops spinning.
  void Spin() {
    const absl::Time since = absl::Now();
    pollfd p{fd_, POLLIN, 0};
    if (window_ >= absl::Microseconds(1)) {
      const absl::Time until = since + window_;
      do {
        if (::poll(&p, 1, 0) != 0) return;  // readable, closed or an error
      } while (absl::Now() < until);
    }
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    window_ = absl::Now() - since <= spin_
                  ? std::min(spin_, std::max(window_ * 2, absl::Microseconds(1)))
                  : window_ / 2;
  }

  // After a frame was consumed: start over at the front when nothing is
  // left, and give back a buffer one large frame grew.
  void Compact() {
    if (start_ != end_) return;
    start_ = end_ = 0;
    if (in_.size() > kKeepBytes) {
      in_.resize(kReadBytes);
      in_.shrink_to_fit();
    }
  }

  bool SendAll(const char* data, size_t size) {
    while (size > 0) {
      const ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;  // the read side reports why (STATUS, EOF or Cancel)
      }
      data += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  const int fd_;
  const absl::Duration spin_;
  const CallsCpuAnswer on_calls_cpu_;
  absl::Duration window_;  // the reader's current spin window
  std::atomic<bool> cancelled_{false};
  // The reader's buffer: bytes [start_, end_) are received, not consumed.
  std::vector<char> in_;
  size_t start_ = 0;
  size_t end_ = 0;
  std::string out_;  // the writer's frame buffer, reused
  absl::Mutex mu_;
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::string CallsSocketPath(absl::string_view target) {
  if (!absl::ConsumePrefix(&target, "unix:")) return "";
  // unix:///abs/path and unix:/abs/path are absolute; unix:rel is relative.
  if (absl::StartsWith(target, "//")) target.remove_prefix(2);
  if (target.empty()) return "";
  return absl::StrCat(target, ".calls");
}

absl::StatusOr<std::unique_ptr<CallsTransport>> ConnectFrameTransport(
    const std::string& path, const StreamMetadata& metadata, CallsCpuAnswer on_calls_cpu) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame wire path ", path, " is too long for a Unix socket"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  absl::StatusOr<absl::Duration> spin = CallsSpinFromEnv();
  if (!spin.ok()) return spin.status();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to the frame wire at ", path, ": ", std::strerror(error)));
  }
  return NewFrameTransport(fd, metadata, *spin, std::move(on_calls_cpu));
}

absl::StatusOr<absl::Duration> CallsSpinFromEnv() {
  const char* env = std::getenv("AGENTIX_CALLS_SPIN_US");
  if (env == nullptr || *env == '\0') return absl::ZeroDuration();
  int64_t us = 0;
  if (!absl::SimpleAtoi(env, &us) || us < 0 || us > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AGENTIX_CALLS_SPIN_US=", env, " is not a number of microseconds from 0 to 1000000"));
  }
  return absl::Microseconds(us);
}

absl::StatusOr<bool> CallsDirectFromEnv() {
  const char* env = std::getenv("AGENTIX_CALLS_DIRECT");
  const std::string mode =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(env == nullptr ? "" : env));
  if (mode.empty() || mode == "auto") return true;
  if (mode == "off") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "AGENTIX_CALLS_DIRECT=", env, " is not one of auto, off"));
}

std::unique_ptr<CallsTransport> NewFrameTransport(int fd, const StreamMetadata& metadata,
                                                  absl::Duration spin,
                                                  CallsCpuAnswer on_calls_cpu) {
  return std::make_unique<FrameTransport>(fd, metadata, spin, std::move(on_calls_cpu));
}

}  // namespace agentix::client_internal
