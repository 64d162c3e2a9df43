#include "providers/core/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace agentix::providers {
namespace {

constexpr uint32_t kMaxRecord = 64u << 20;

uint32_t Crc32(const std::string& data) {
  static const auto* table = [] {
    auto* t = new uint32_t[256];
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
bool GetVarint(const std::string& in, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < in.size(); shift += 7) {
    unsigned char b = in[(*pos)++];
    *v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}
void PutString(std::string* out, const std::string& s) {
  PutVarint(out, s.size());
  out->append(s);
}
bool GetString(const std::string& in, size_t* pos, std::string* s) {
  uint64_t n;
  if (!GetVarint(in, pos, &n) || n > in.size() - *pos) return false;
  s->assign(in, *pos, n);
  *pos += n;
  return true;
}

bool DecodePayload(const std::string& payload, JournalRecord* record) {
  if (payload.size() < 2) return false;
  record->type = static_cast<uint8_t>(payload[0]);
  record->erase = payload[1] != 0;
  size_t pos = 2;
  uint64_t count;
  if (!GetString(payload, &pos, &record->key) || !GetVarint(payload, &pos, &count)) {
    return false;
  }
  if (count > payload.size()) return false;
  record->fields.resize(count);
  for (auto& field : record->fields) {
    if (!GetString(payload, &pos, &field)) return false;
  }
  return pos == payload.size();
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write ", path, ": ", strerror(errno)));
    }
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace

std::string Journal::Encode(const JournalRecord& record) {
  std::string payload;
  payload.push_back(static_cast<char>(record.type));
  payload.push_back(record.erase ? 1 : 0);
  PutString(&payload, record.key);
  PutVarint(&payload, record.fields.size());
  for (const auto& field : record.fields) PutString(&payload, field);
  std::string frame;
  PutU32(&frame, payload.size());
  PutU32(&frame, Crc32(payload));
  frame += payload;
  return frame;
}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& dir,
                                                       bool fsync,
                                                       Loaded* loaded) {
  if (dir.empty()) return absl::InvalidArgumentError("journal: state_dir is empty");
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("mkdir ", dir, ": ", strerror(errno)));
  }
  std::string path = dir + "/journal";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("open ", path, ": ", strerror(errno)));
  }
  std::string data;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("read ", path, ": ", strerror(errno)));
    }
    if (n == 0) break;
    data.append(buf, n);
  }
  size_t pos = 0;
  while (data.size() - pos >= 8) {
    uint32_t len = GetU32(data.data() + pos);
    uint32_t crc = GetU32(data.data() + pos + 4);
    if (len > kMaxRecord || len > data.size() - pos - 8) break;
    std::string payload = data.substr(pos + 8, len);
    JournalRecord record;
    if (Crc32(payload) != crc || !DecodePayload(payload, &record)) break;
    loaded->records.push_back(std::move(record));
    pos += 8 + len;
  }
  loaded->dropped_bytes = data.size() - pos;
  if (loaded->dropped_bytes > 0 && ::ftruncate(fd, pos) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("truncate ", path, ": ", strerror(errno)));
  }
  return std::unique_ptr<Journal>(new Journal(std::move(path), fd, fsync));
}

Journal::~Journal() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

absl::Status Journal::Append(const JournalRecord& record) {
  std::string frame = Encode(record);
  absl::MutexLock lock(&mu_);
  absl::Status status = WriteAll(fd_, frame, path_);
  if (status.ok() && fsync_ && ::fdatasync(fd_) != 0) {
    return absl::InternalError(absl::StrCat("fdatasync ", path_, ": ", strerror(errno)));
  }
  return status;
}

absl::Status Journal::Rewrite(const std::vector<JournalRecord>& live) {
  std::string data;
  for (const auto& record : live) data += Encode(record);
  std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", tmp, ": ", strerror(errno)));
  absl::Status status = WriteAll(fd, data, tmp);
  if (status.ok() && ::fsync(fd) != 0) {
    status = absl::InternalError(absl::StrCat("fsync ", tmp, ": ", strerror(errno)));
  }
  ::close(fd);
  if (!status.ok()) return status;
  absl::MutexLock lock(&mu_);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, ": ", strerror(errno)));
  }
  int new_fd = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (new_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", path_, ": ", strerror(errno)));
  }
  ::close(fd_);
  fd_ = new_fd;
  return absl::OkStatus();
}

std::vector<JournalRecord> Journal::Fold(std::vector<JournalRecord> records) {
  std::map<std::pair<uint8_t, std::string>, size_t> index;
  std::vector<std::optional<JournalRecord>> slots;
  for (auto& record : records) {
    auto id = std::make_pair(record.type, record.key);
    auto it = index.find(id);
    if (record.erase) {
      if (it != index.end()) {
        slots[it->second].reset();
        index.erase(it);
      }
      continue;
    }
    if (it != index.end()) {
      slots[it->second] = std::move(record);
    } else {
      index[id] = slots.size();
      slots.push_back(std::move(record));
    }
  }
  std::vector<JournalRecord> out;
  for (auto& slot : slots) {
    if (slot) out.push_back(std::move(*slot));
  }
  return out;
}

}  // namespace agentix::providers
