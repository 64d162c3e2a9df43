#include "providers/backends/local/seccomp_filter.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace agentix::providers::local {
namespace {

// linux/seccomp.h return actions.
constexpr uint32_t kRetKillProcess = 0x80000000u;
constexpr uint32_t kRetErrno = 0x00050000u;
constexpr uint32_t kRetAllow = 0x7fff0000u;
// struct seccomp_data: int nr; __u32 arch; __u64 ip; __u64 args[6].
constexpr uint32_t kNrOffset = 0;
constexpr uint32_t kArchOffset = 4;
constexpr uint32_t ArgLow(int index) { return 16 + 8 * index; }  // little endian

// clone(2)'s namespace flags (CLONE_NEWTIME, 0x80, is also the exit signal's
// bits there: only unshare(2) is checked for it).
constexpr uint32_t kCloneNs = 0x00020000u | 0x02000000u | 0x04000000u |
                              0x08000000u | 0x10000000u | 0x20000000u |
                              0x40000000u;
constexpr uint32_t kUnshareNs = kCloneNs | 0x00000080u;
constexpr uint32_t kTiocsti = 0x5412, kTioclinux = 0x541c;

struct Syscall {
  const char* name;
  uint32_t number;
};

// Denied with EPERM, plus the four checked separately (last four).
constexpr Syscall kX86_64[] = {
    {"mount", 165}, {"umount2", 166}, {"pivot_root", 155}, {"chroot", 161},
    {"open_tree", 428}, {"move_mount", 429}, {"fsopen", 430},
    {"fsconfig", 431}, {"fsmount", 432}, {"fspick", 433},
    {"mount_setattr", 442}, {"setns", 308}, {"keyctl", 250},
    {"add_key", 248}, {"request_key", 249}, {"ptrace", 101},
    {"process_vm_readv", 310}, {"process_vm_writev", 311},
    {"pidfd_getfd", 438}, {"kcmp", 312}, {"init_module", 175},
    {"finit_module", 313}, {"delete_module", 176}, {"kexec_load", 246},
    {"kexec_file_load", 320}, {"bpf", 321}, {"perf_event_open", 298},
    {"userfaultfd", 323}, {"open_by_handle_at", 304},
    {"name_to_handle_at", 303}, {"io_uring_setup", 425},
    {"io_uring_enter", 426}, {"io_uring_register", 427}, {"reboot", 169},
    {"swapon", 167}, {"swapoff", 168}, {"acct", 163},
    {"settimeofday", 164}, {"clock_settime", 227}, {"clock_adjtime", 305},
    {"adjtimex", 159}, {"syslog", 103}, {"quotactl", 179},
    {"quotactl_fd", 443}, {"fanotify_init", 300}, {"lookup_dcookie", 212},
    {"vhangup", 153}, {"iopl", 172}, {"ioperm", 173}, {"uselib", 134},
    {"_sysctl", 156}, {"nfsservctl", 180},
    {"unshare", 272}, {"clone", 56}, {"clone3", 435}, {"ioctl", 16},
};
constexpr Syscall kAarch64[] = {
    {"mount", 40}, {"umount2", 39}, {"pivot_root", 41}, {"chroot", 51},
    {"open_tree", 428}, {"move_mount", 429}, {"fsopen", 430},
    {"fsconfig", 431}, {"fsmount", 432}, {"fspick", 433},
    {"mount_setattr", 442}, {"setns", 268}, {"keyctl", 219},
    {"add_key", 217}, {"request_key", 218}, {"ptrace", 117},
    {"process_vm_readv", 270}, {"process_vm_writev", 271},
    {"pidfd_getfd", 438}, {"kcmp", 272}, {"init_module", 105},
    {"finit_module", 273}, {"delete_module", 106}, {"kexec_load", 104},
    {"kexec_file_load", 294}, {"bpf", 280}, {"perf_event_open", 241},
    {"userfaultfd", 282}, {"open_by_handle_at", 265},
    {"name_to_handle_at", 264}, {"io_uring_setup", 425},
    {"io_uring_enter", 426}, {"io_uring_register", 427}, {"reboot", 142},
    {"swapon", 224}, {"swapoff", 225}, {"acct", 89}, {"settimeofday", 170},
    {"clock_settime", 112}, {"clock_adjtime", 266}, {"adjtimex", 171},
    {"syslog", 116}, {"quotactl", 60}, {"quotactl_fd", 443},
    {"fanotify_init", 262}, {"lookup_dcookie", 18}, {"vhangup", 58},
    {"unshare", 97}, {"clone", 220}, {"clone3", 435}, {"ioctl", 29},
};
constexpr int kSeparate = 4;  // unshare, clone, clone3, ioctl

sock_filter Insn(uint16_t code, uint32_t k, uint8_t jt = 0, uint8_t jf = 0) {
  return sock_filter{code, jt, jf, k};
}
sock_filter Ret(uint32_t value) { return Insn(BPF_RET | BPF_K, value); }

// `number` with any of `mask` set in argument `arg`: EPERM, else allowed.
void DenyFlags(std::vector<sock_filter>& p, uint32_t number, int arg,
               uint32_t mask) {
  p.push_back(Insn(BPF_JMP | BPF_JEQ | BPF_K, number, 0, 4));
  p.push_back(Insn(BPF_LD | BPF_W | BPF_ABS, ArgLow(arg)));
  p.push_back(Insn(BPF_JMP | BPF_JSET | BPF_K, mask, 0, 1));
  p.push_back(Ret(kRetErrno | EPERM));
  p.push_back(Ret(kRetAllow));
}

uint32_t Number(const Syscall* table, size_t n, absl::string_view name) {
  for (size_t i = 0; i < n; ++i) {
    if (name == table[i].name) return table[i].number;
  }
  return ~0u;  // not reached: every table has the four
}

}  // namespace

absl::string_view SeccompMachine() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "";
#endif
}

absl::StatusOr<std::vector<sock_filter>> DenyFilter(absl::string_view machine) {
  const Syscall* table;
  size_t size;
  uint32_t audit_arch;
  bool x32 = false;  // x32 syscalls share the arch and carry bit 30
  if (machine == "x86_64") {
    table = kX86_64, size = std::size(kX86_64), audit_arch = 0xc000003eu;
    x32 = true;
  } else if (machine == "aarch64") {
    table = kAarch64, size = std::size(kAarch64), audit_arch = 0xc00000b7u;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "no seccomp syscall table for '", machine, "' (known: aarch64, x86_64)"));
  }
  std::vector<sock_filter> p = {
      Insn(BPF_LD | BPF_W | BPF_ABS, kArchOffset),
      Insn(BPF_JMP | BPF_JEQ | BPF_K, audit_arch, 1, 0),
      Ret(kRetKillProcess),
      Insn(BPF_LD | BPF_W | BPF_ABS, kNrOffset),
  };
  if (x32) {
    p.push_back(Insn(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));
    p.push_back(Ret(kRetKillProcess));
  }
  // Sorted by number, as the Python builder, so both emit the same program.
  std::vector<Syscall> denied(table, table + size - kSeparate);
  std::stable_sort(denied.begin(), denied.end(),
                   [](const Syscall& a, const Syscall& b) {
                     return a.number < b.number;
                   });
  for (const Syscall& s : denied) {
    p.push_back(Insn(BPF_JMP | BPF_JEQ | BPF_K, s.number, 0, 1));
    p.push_back(Ret(kRetErrno | EPERM));
  }
  p.push_back(Insn(BPF_JMP | BPF_JEQ | BPF_K, Number(table, size, "clone3"), 0, 1));
  p.push_back(Ret(kRetErrno | ENOSYS));
  // Each check below loads an argument over the syscall number: it ends in a
  // return either way.
  DenyFlags(p, Number(table, size, "unshare"), 0, kUnshareNs);
  DenyFlags(p, Number(table, size, "clone"), 0, kCloneNs);
  p.push_back(Insn(BPF_JMP | BPF_JEQ | BPF_K, Number(table, size, "ioctl"), 0, 5));
  p.push_back(Insn(BPF_LD | BPF_W | BPF_ABS, ArgLow(1)));
  p.push_back(Insn(BPF_JMP | BPF_JEQ | BPF_K, kTiocsti, 1, 0));
  p.push_back(Insn(BPF_JMP | BPF_JEQ | BPF_K, kTioclinux, 0, 1));
  p.push_back(Ret(kRetErrno | EPERM));
  p.push_back(Ret(kRetAllow));
  p.push_back(Ret(kRetAllow));
  return p;
}

absl::StatusOr<base::UniqueFd> FilterFd() {
  auto program = DenyFilter(SeccompMachine());
  if (!program.ok()) return program.status();
  base::UniqueFd fd(memfd_create("agentix-seccomp", MFD_CLOEXEC));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  }
  const size_t bytes = program->size() * sizeof(sock_filter);
  const char* data = reinterpret_cast<const char*>(program->data());
  for (size_t done = 0; done < bytes;) {
    ssize_t n = ::write(fd.get(), data + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat("write seccomp memfd: ", strerror(errno)));
    }
    done += n;
  }
  if (::lseek(fd.get(), 0, SEEK_SET) != 0) {
    return absl::InternalError(absl::StrCat("lseek seccomp memfd: ", strerror(errno)));
  }
  return fd;
}

}  // namespace agentix::providers::local
