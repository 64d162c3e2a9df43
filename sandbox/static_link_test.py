"""agentix-sandboxd, agentix-worker and agentix-launch load no shared Abseil, Protobuf,
gRPC or libstdc++.

A cold sandbox waits for these binaries' exec; with Debian's shared libraries each
loaded ~70 objects (third_party/system/static_link.bzl), and libstdc++.so was still the
loader's largest one. This reads the binaries' DT_NEEDED entries (the libraries the
dynamic loader opens at exec) and starts each with --version, so a dependency that
brings a shared copy back fails here. The daemon links non-PIE (no relative relocations
at exec) unless built with --define=agentix_sandboxd_link=pie (argv[4] says which).
argv: daemon, worker, libpython mode, daemon link, launcher.
"""

import subprocess
import sys
import unittest
from pathlib import Path

# Shared objects the binaries may still name: glibc's libc and libm, gcc's unwinder
# libgcc_s (glibc loads it for pthread_exit anyway, and a second, static unwinder
# aborts that: static_link.bzl, STATIC_LIBSTDCXX), the sanitizer runtimes of
# --config=asan/ubsan and, for a worker with a shared or PIC libpython, libpython's own
# dependencies. Not libstdc++ or libfmt: libstdc++ comes from its archive and fmt is
# header-only. The worker links libpython statically, non-PIE, with expat and zlib in
# the binary too, unless built with --define=agentix_libpython=shared|static_pie
# (worker/BUILD.bazel; argv[3] says which).
ALLOWED = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "libasan.so.8",
           "libubsan.so.1"}
LIBPYTHON_NEEDS = {"libz.so.1", "libexpat.so.1"}
STATIC = ("libabsl_", "libgrpc", "libgpr", "libprotobuf", "libupb", "libre2", "libcares",
          "libssl", "libcrypto", "libaddress_sorting")


def elf_type(binary: Path) -> str:
    """The ELF header's type, as `readelf -h` prints it: EXEC (non-PIE) or DYN (a PIE)."""
    out = subprocess.run(["readelf", "-h", str(binary)], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    return next(line.split(":", 1)[1].split()[0]
                for line in out.splitlines() if line.strip().startswith("Type:"))


def needed(binary: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF file, as `readelf -d` prints them."""
    out = subprocess.run(["readelf", "-d", str(binary)], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    return [line.split("[", 1)[1].split("]", 1)[0]
            for line in out.splitlines() if "(NEEDED)" in line]


class StaticLinkTest(unittest.TestCase):
    def check(self, binary: Path, allowed: set[str]) -> None:
        self.check_needed(binary, allowed)
        run = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("agentix", (run.stdout + run.stderr).lower())

    def check_needed(self, binary: Path, allowed: set[str]) -> None:
        libs = needed(binary)
        self.assertTrue(libs, f"{binary} names no shared library at all (not dynamic?)")
        self.assertEqual([lib for lib in libs if lib.startswith(STATIC)], [],
                         f"{binary.name} loads shared copies of statically linked libraries")
        self.assertEqual(sorted(set(libs) - allowed), [], f"{binary.name}: unexpected shared objects")
        self.assertIn("libgcc_s.so.1", libs,
                      f"{binary.name}: the unwinder must stay shared (a static one aborts pthread_exit)")

    def test_daemon(self) -> None:
        daemon = Path(sys.argv[1])
        self.check(daemon, ALLOWED)
        link = sys.argv[4]
        self.assertIn(link, ("no-pie", "pie"))
        self.assertEqual(elf_type(daemon), "EXEC" if link == "no-pie" else "DYN")

    def test_launcher(self) -> None:
        launcher = Path(sys.argv[5])
        self.check_needed(launcher, ALLOWED)
        # It has no --version; without arguments it starts, prints its usage and exits 2.
        run = subprocess.run([str(launcher)], capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("usage: agentix-launch", run.stderr)

    def test_worker(self) -> None:
        libpython = sys.argv[3]
        self.assertIn(libpython, ("static", "static_pie", "shared"))
        worker = Path(sys.argv[2])
        allowed = {"static": ALLOWED, "static_pie": ALLOWED | LIBPYTHON_NEEDS,
                   "shared": ALLOWED | LIBPYTHON_NEEDS | {"libpython3.11.so.1.0"}}[libpython]
        self.check(worker, allowed)
        if libpython != "shared":
            # Extension modules bind to the binary's libpython: it exports the C API.
            out = subprocess.run(["nm", "-D", "--defined-only", str(worker)], check=True,
                                 capture_output=True, text=True, timeout=30).stdout
            exported = {line.split()[-1] for line in out.splitlines()}
            for name in ("PyLong_FromLong", "PyExc_TypeError", "_Py_NoneStruct",
                         "PyModule_Create2", "PyType_Ready"):
                self.assertIn(name, exported)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
