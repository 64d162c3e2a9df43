#include "base/string_resize.h"

namespace agentix::base {
namespace {

#if defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI
// libstdc++ sets a length (and the terminator) with the private
// _M_set_length. An explicit template instantiation may name a private
// member ([temp.explicit]/12); the friend function hands out its address.
using SetLength = void (std::string::*)(std::string::size_type);
SetLength StringSetLength();
template <SetLength kMember>
struct ExposeSetLength {
  friend SetLength StringSetLength() { return kMember; }
};
template struct ExposeSetLength<&std::string::_M_set_length>;
#endif

}  // namespace

void ResizeUninitialized(std::string& s, size_t n) {
#if defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI
  if (n <= s.size()) {
    s.resize(n);
    return;
  }
  s.reserve(n);  // keeps the first size() bytes, writes none past them
  (s.*StringSetLength())(n);
#else
  s.resize(n);
#endif
}

}  // namespace agentix::base
