#include "providers/backends/engine/log_demux.h"

#include <algorithm>

namespace agentix::providers::engine {

bool LogDemuxer::Feed(absl::string_view data, const PayloadFn& out) {
  while (!data.empty()) {
    if (raw_) return out(1, data);
    if (remaining_ > 0) {
      size_t take = std::min<size_t>(remaining_, data.size());
      remaining_ -= static_cast<uint32_t>(take);
      absl::string_view piece = data.substr(0, take);
      data.remove_prefix(take);
      if (!out(stream_, piece)) return false;
      continue;
    }
    size_t take = std::min<size_t>(8 - header_len_, data.size());
    std::copy(data.begin(), data.begin() + take, header_ + header_len_);
    header_len_ += static_cast<int>(take);
    data.remove_prefix(take);
    if (header_len_ < 8) return true;
    header_len_ = 0;
    if (header_[0] > 2 || header_[1] != 0 || header_[2] != 0 || header_[3] != 0) {
      // Not framed: hand over what was taken for a header, then the rest raw.
      raw_ = true;
      if (!out(1, absl::string_view(reinterpret_cast<const char*>(header_), 8))) return false;
      continue;
    }
    stream_ = header_[0];
    remaining_ = (uint32_t{header_[4]} << 24) | (uint32_t{header_[5]} << 16) |
                 (uint32_t{header_[6]} << 8) | uint32_t{header_[7]};
  }
  return true;
}

}  // namespace agentix::providers::engine
