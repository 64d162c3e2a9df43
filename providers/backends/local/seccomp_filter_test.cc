#include "providers/backends/local/seccomp_filter.h"

#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include <catch2/catch.hpp>
#include "testing/status_matchers.h"

namespace agentix::providers::local {
namespace {

TEST_CASE("the x86_64 program checks the arch first, denies the table and ends allowing") {
  REQUIRE_OK_AND_ASSIGN(auto program, DenyFilter("x86_64"));
  REQUIRE(program.size() < 4096);  // BPF_MAXINSNS
  // Load arch; jump over the kill when it is AUDIT_ARCH_X86_64.
  CHECK(program[0].code == 0x20);
  CHECK(program[0].k == 4);
  CHECK(program[1].code == 0x15);
  CHECK(program[1].jt == 1);
  CHECK(program[1].jf == 0);
  CHECK(program[1].k == 0xC000003Eu);
  CHECK(program[2].code == 0x06);
  CHECK(program[2].k == 0x80000000u);
  // x32 syscalls (bit 30) are killed.
  CHECK(program[4].code == 0x35);
  CHECK(program[4].k == 0x40000000u);
  CHECK(program.back().code == 0x06);
  CHECK(program.back().k == 0x7FFF0000u);
  std::set<uint32_t> denied;
  for (const sock_filter& insn : program) {
    if (insn.code == 0x15 && insn.jt == 0 && insn.jf == 1) denied.insert(insn.k);
  }
  // mount umount2 pivot_root keyctl ptrace init_module finit_module
  // kexec_load bpf perf_event_open userfaultfd open_by_handle_at setns
  for (uint32_t nr : {165u, 166u, 155u, 250u, 101u, 175u, 313u, 246u, 321u, 298u, 323u, 304u, 308u}) {
    CHECK(denied.count(nr) == 1);
  }
  // Ordinary syscalls are not in it: read, write, openat, clone is
  // checked by flags only.
  for (uint32_t nr : {0u, 1u, 257u}) CHECK(denied.count(nr) == 0);
  // clone3 -> ENOSYS (38).
  bool clone3_enosys = false;
  for (size_t i = 0; i + 1 < program.size(); ++i) {
    if (program[i].code == 0x15 && program[i].k == 435 && program[i + 1].k == (0x00050000u | 38)) {
      clone3_enosys = true;
    }
  }
  CHECK(clone3_enosys);
}

// 64-bit FNV-1a of the program's bytes.
uint64_t Fnv1a(const std::vector<sock_filter>& program) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(program.data());
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < program.size() * sizeof(sock_filter); ++i) {
    hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  }
  return hash;
}

TEST_CASE("the same program bytes as the Python builder (_seccomp.py)") {
  // Golden values from host/python/agentix/provider/_seccomp.py's
  // deny_filter(arch) (len and FNV-1a of its bytes): the two builders must
  // not drift while the Python LocalProvider still has its own.
  REQUIRE_OK_AND_ASSIGN(auto x86, DenyFilter("x86_64"));
  // 4 arch/nr + 2 x32 + 52 denied x 2 + clone3 2 + unshare 5 + clone 5 + ioctl 6 + final 1.
  CHECK(x86.size() == 4 + 2 + 52 * 2 + 2 + 5 + 5 + 6 + 1);
  CHECK(x86.size() * sizeof(sock_filter) == 1032);
  CHECK(Fnv1a(x86) == 0x58ea1f651fb38b07ull);
  REQUIRE_OK_AND_ASSIGN(auto arm, DenyFilter("aarch64"));
  CHECK(arm.size() * sizeof(sock_filter) == 936);
  CHECK(Fnv1a(arm) == 0xcdfb3f385943cb09ull);
}

TEST_CASE("aarch64 has its own table and no x32 check; unknown arches are refused") {
  REQUIRE_OK_AND_ASSIGN(auto arm, DenyFilter("aarch64"));
  REQUIRE_OK_AND_ASSIGN(auto x86, DenyFilter("x86_64"));
  CHECK(arm[1].k == 0xC00000B7u);
  CHECK(arm[4].code != 0x35);
  CHECK(arm.size() != x86.size());
  auto mips = DenyFilter("mips");
  REQUIRE_FALSE(mips.ok());
  CHECK(mips.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(mips.status().message().find("no seccomp syscall table") != absl::string_view::npos);
}

TEST_CASE("FilterFd holds the program at offset 0") {
  REQUIRE_OK_AND_ASSIGN(auto fd, FilterFd());
  REQUIRE_OK_AND_ASSIGN(auto program, DenyFilter(SeccompMachine()));
  struct stat st;
  REQUIRE(fstat(fd.get(), &st) == 0);
  CHECK(static_cast<size_t>(st.st_size) == program.size() * sizeof(sock_filter));
  CHECK(lseek(fd.get(), 0, SEEK_CUR) == 0);
}

}  // namespace
}  // namespace agentix::providers::local
