"""The seccomp filter `LocalProvider` gives bubblewrap (``--seccomp FD``).

A classic-BPF program, assembled here so the host needs no libseccomp
binding (the provider runs in whatever interpreter the user has). It lets
everything through except what a sandbox has no use for and what widens the
kernel surface it can reach:

- new namespaces: ``unshare``/``clone`` with a ``CLONE_NEW*`` flag, ``setns``;
  ``clone3`` fails with ENOSYS (its flags are in memory, out of a filter's
  reach) so libc falls back to ``clone``;
- mounts: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount
  API (``open_tree``, ``move_mount``, ``fs*``, ``mount_setattr``);
- the kernel keyring, ``ptrace`` and cross-process memory (``process_vm_*``,
  ``pidfd_getfd``, ``kcmp``), module and kexec loading, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, file handles (``*_handle_at``),
  ``io_uring``, clock and host settings (``reboot``, ``swapon``, ``acct``,
  ``settimeofday`` ...), ``syslog``, ``quotactl``, ``fanotify_init``;
- ``ioctl(TIOCSTI)``/``ioctl(TIOCLINUX)``: typing into a terminal.

Denied calls fail with EPERM (``clone3``: ENOSYS); a call from another
architecture's ABI (x32 on x86_64, or a foreign audit arch) kills the process.
docs/PROVIDERS.md lists the same.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

__all__ = ["deny_filter", "filter_fd", "supported"]

# linux/filter.h, linux/bpf_common.h
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
# linux/seccomp.h
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR, _ARCH = 0, 4


def _arg_low(index: int) -> int:
    """Offset of the low 32 bits of syscall argument `index` (little endian)."""
    return 16 + 8 * index


# Namespace flags of clone(2) (CLONE_NEWTIME, 0x80, is also the exit signal's
# bits there: only unshare(2) is checked for it).
_CLONE_NS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_UNSHARE_NS = _CLONE_NS | 0x00000080
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

# name -> syscall number, per architecture.
_X86_64 = {
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "setns": 308,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438, "kcmp": 312,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "adjtimex": 159, "syslog": 103, "quotactl": 179, "quotactl_fd": 443,
    "fanotify_init": 300, "lookup_dcookie": 212, "vhangup": 153, "iopl": 172, "ioperm": 173, "uselib": 134,
    "_sysctl": 156, "nfsservctl": 180,
    "unshare": 272, "clone": 56, "clone3": 435, "ioctl": 16,
}
_AARCH64 = {
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "setns": 268,
    "keyctl": 219, "add_key": 217, "request_key": 218,
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438, "kcmp": 272,
    "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
    "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "open_by_handle_at": 265, "name_to_handle_at": 264,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89, "settimeofday": 170, "clock_settime": 112,
    "clock_adjtime": 266, "adjtimex": 171, "syslog": 116, "quotactl": 60, "quotactl_fd": 443,
    "fanotify_init": 262, "lookup_dcookie": 18, "vhangup": 58,
    "unshare": 97, "clone": 220, "clone3": 435, "ioctl": 29,
}
# machine -> (AUDIT_ARCH_*, syscall table, first number of a foreign ABI sharing the arch or None)
_ARCHES = {
    "x86_64": (0xC000003E, _X86_64, 0x40000000),  # x32 syscalls carry __X32_SYSCALL_BIT
    "aarch64": (0xC00000B7, _AARCH64, None),
}
_CHECKED_SEPARATELY = {"unshare", "clone", "clone3", "ioctl"}


def supported(machine: str | None = None) -> bool:
    """True when a filter can be built for `machine` (default: this one)."""
    return (machine or platform.machine()) in _ARCHES


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _ret(value: int) -> bytes:
    return _insn(_RET_K, value)


def _deny_flags(number: int, arg: int, mask: int) -> list[bytes]:
    """`number` with any of `mask` set in argument `arg`: EPERM, else allowed."""
    return [
        _insn(_JEQ_K, number, 0, 4),
        _insn(_LD_W_ABS, _arg_low(arg)),
        _insn(_JSET_K, mask, 0, 1),
        _ret(_RET_ERRNO | errno.EPERM),
        _ret(_RET_ALLOW),
    ]


def deny_filter(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one) as the ``struct sock_filter``
    array bubblewrap's ``--seccomp FD`` reads. Raises ValueError for an
    architecture it has no syscall table for."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp syscall table for {machine!r} (known: {', '.join(sorted(_ARCHES))})")
    audit_arch, table, foreign_abi = _ARCHES[machine]
    program = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, audit_arch, 1, 0),
        _ret(_RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
    ]
    if foreign_abi is not None:
        program += [_insn(_JGE_K, foreign_abi, 0, 1), _ret(_RET_KILL_PROCESS)]
    for name, number in sorted(table.items(), key=lambda item: item[1]):
        if name not in _CHECKED_SEPARATELY:
            program += [_insn(_JEQ_K, number, 0, 1), _ret(_RET_ERRNO | errno.EPERM)]
    program += [_insn(_JEQ_K, table["clone3"], 0, 1), _ret(_RET_ERRNO | errno.ENOSYS)]
    # Each check below loads an argument over the syscall number: it ends in a return either way.
    program += _deny_flags(table["unshare"], 0, _UNSHARE_NS)
    program += _deny_flags(table["clone"], 0, _CLONE_NS)
    program += [
        _insn(_JEQ_K, table["ioctl"], 0, 5),
        _insn(_LD_W_ABS, _arg_low(1)),
        _insn(_JEQ_K, _TIOCSTI, 1, 0),
        _insn(_JEQ_K, _TIOCLINUX, 0, 1),
        _ret(_RET_ERRNO | errno.EPERM),
        _ret(_RET_ALLOW),
    ]
    program.append(_ret(_RET_ALLOW))
    return b"".join(program)


def filter_fd(machine: str | None = None) -> int:
    """A fresh fd, positioned at 0, holding `deny_filter` (for ``--seccomp``;
    bubblewrap reads it to the end and closes its copy). The caller closes it."""
    fd = os.memfd_create("agentix-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, deny_filter(machine))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
