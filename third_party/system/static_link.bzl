"""Debian's static archives for the binaries whose start-up is on a sandbox's cold path.

A cold create waits for agentix-sandboxd's exec and then agentix-worker's. Linked against
Debian's shared Abseil, Protobuf and gRPC each loads ~70 objects and the dynamic loader
spends most of its ~10 ms resolving their symbols (`LD_DEBUG=statistics`). These archives
are the same Debian packages' `.a` files (libabsl-dev, libprotobuf-dev, libgrpc++-dev,
libgrpc-dev, libssl-dev, zlib1g-dev, libc-ares-dev, libre2-dev).

`static_linkopts(libs)` goes in a cc_binary's own `linkopts`, which Bazel places after the
binary's objects and before its deps' `-l` options: the group resolves every symbol from
the archives, and `--as-needed` then drops the shared copies the deps still name, so a
binary never loads a library twice (//sandbox:static_link_test reads the binaries'
DT_NEEDED). libc, libm and libgcc_s stay shared; so does everything else that links these
libraries (tests, providerd, and the host's extension module, which needs PIC objects).
See docs/DECISIONS.md, "fifth pass". The three cold-path binaries also take libstdc++
from its archive (`STATIC_LIBSTDCXX`) and fmt is header-only everywhere
(//third_party/system:fmt), so they load libc, libm and libgcc_s alone
(docs/DECISIONS.md, stop 52).
"""

# libstdc++ from gcc's archive for agentix-sandboxd, agentix-worker and agentix-launch:
# libstdc++.so was the loader's largest object and most of its symbol lookups at their
# exec (an exec of `--version` 0.70x the time for the daemon, 0.75x for the worker).
# The toolchain's own later `-lstdc++` is then not needed and --as-needed
# (static_linkopts) drops it. None of them exports the C++ runtime (the worker exports
# only libpython's API: python_exports.lds), so an extension module that needs
# libstdc++.so loads its own. The unwinder stays shared (no -static-libgcc): glibc's
# pthread_exit, which CPython calls for a daemon thread after finalisation, unwinds
# with the libgcc_s.so it loads, and a thread whose frames belong to a static copy of
# the unwinder then aborts (a worker's exit did, 2 of 6 runs of worker_lifecycle_test).
STATIC_LIBSTDCXX = ["-l:libstdc++.a"]

# The dynamic closure of //third_party/system:grpc_reflection and :absl_flags
# (`ldd agentix-sandboxd`), in link order (users before the libraries they use).
GRPC_STATIC = [
    "grpc++_reflection",
    "grpc++",
    "grpc",
    "upb",
    "address_sorting",
    "re2",
    "cares",
    "ssl",
    "crypto",
    "z",
    "gpr",
]

PROTOBUF_STATIC = ["protobuf"]

ABSL_STATIC = ["absl_" + name for name in [
    "flags_parse",
    "flags_usage",
    "flags_usage_internal",
    "flags_internal",
    "flags_marshalling",
    "flags_reflection",
    "flags_config",
    "flags_program_name",
    "flags_private_handle_accessor",
    "flags_commandlineflag",
    "flags_commandlineflag_internal",
    "status",
    "statusor",
    "cord",
    "cord_internal",
    "cordz_info",
    "cordz_handle",
    "cordz_functions",
    "exponential_biased",
    "str_format_internal",
    "strings",
    "strings_internal",
    "strerror",
    "synchronization",
    "graphcycles_internal",
    "time",
    "time_zone",
    "int128",
    "random_internal_pool_urbg",
    "random_seed_sequences",
    "random_internal_seed_material",
    "random_seed_gen_exception",
    "random_internal_randen",
    "random_internal_randen_hwaes",
    "random_internal_randen_hwaes_impl",
    "random_internal_randen_slow",
    "random_internal_platform",
    "hash",
    "city",
    "low_level_hash",
    "raw_hash_set",
    "bad_variant_access",
    "bad_optional_access",
    "stacktrace",
    "symbolize",
    "debugging_internal",
    "demangle_internal",
    "malloc_internal",
    "base",
    "spinlock_wait",
    "raw_logging_internal",
    "throw_delegate",
]]

def static_linkopts(libs):
    """Linkopts that take `libs` (names without lib/.a) from their static archives."""
    return (
        ["-Wl,--as-needed", "-Wl,--start-group"] +
        ["-l:lib%s.a" % lib for lib in libs] +
        ["-Wl,--end-group"]
    )

# Debian's static libpython in an executable (agentix-worker), as Debian's own
# /usr/bin/python3.11 links it: the non-PIC libpython3.11.a in a non-PIE binary, or the
# -pic.a archive in a PIE one. The binary exports libpython's API (python_exports.lds:
# the names the shared library exports), so extension modules loaded at run time bind
# to it. --as-needed (static_linkopts, before this) drops the shared libpython that
# //third_party/system:python_embed still names. libexpat and libz: pyexpat and zlib are
# built into Debian's libpython (its Makefile's LOCALMODLIBS); the non-PIE binary takes
# them from their archives too (two objects fewer for the loader at every worker exec:
# docs/DECISIONS.md, stop 37; they export nothing, so a module that needs the shared ones
# loads its own), the PIE one from the shared libraries as before.
PYTHON_CONFIG_DIR = "/usr/lib/python3.11/config-3.11-x86_64-linux-gnu"
PYTHON_EXPORTS = "//third_party/system:python_exports"

def python_static_linkopts(pie):
    """Linkopts that link libpython3.11 statically into a cc_binary (see above)."""
    archive = "libpython3.11-pic.a" if pie else "libpython3.11.a"
    return ([] if pie else ["-no-pie"]) + [
        "-Wl,--dynamic-list=$(location %s)" % PYTHON_EXPORTS,
        "%s/%s" % (PYTHON_CONFIG_DIR, archive),
    ] + (["-lexpat", "-lz"] if pie else ["-l:libexpat.a", "-l:libz.a"])
