"""`InProcessLocalProvider`: sandboxes on this machine with bubblewrap, run by
this Python process itself (no provider service).

This was `LocalProvider` before the provider service: `LocalProvider` is now a
client of ``agentix-providerd`` (`agentix.provider.local`), whose local backend
does what this module does. It stays as the baseline the provider benchmark
measures against and is not exported (import it from here). It shares
`LocalProviderConfig` with `LocalProvider`.

Each sandbox is one ``bwrap`` process tree with fresh user, pid, network, IPC,
UTS, cgroup and mount namespaces, all capabilities (and the bounding set)
dropped, a seccomp filter (`agentix.provider._seccomp`), a read-only root (the
host's root, a rootfs directory or an unpacked OCI image layout), the bundle's
``nix/`` read-only at ``/nix``, and size-capped tmpfs at ``/tmp``, ``/run``,
``/dev/shm`` and ``/run/agentix``: the sandbox's ``/nix/runtime/bootstrap.sh``
starts ``agentix-sandboxd`` on ``unix:///run/agentix/agentix.sock``, which the
host reaches through ``/proc/<sandbox init>/root`` (no host directory is
writable from inside). The daemon's token comes through a pipe
(``--token-file /proc/self/fd/N``), never the environment; its stdout and
stderr go through a pipe the host drains into a size-capped ``sandbox.log``.
Memory, pids and CPU limits go through cgroup v1 where the machine has it.
`delete` stops the whole tree and removes everything `create` made.
docs/PROVIDERS.md explains each choice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import platform as platform_module
import secrets
import shutil
import signal
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from pathlib import Path

from agentix.provider import _seccomp
from agentix.provider._extract import extract_nix_tree, has_bootstrap, is_verified_bundle, read_manifest_member
from agentix.provider._oci import unpack_oci_layout
from agentix.provider._sizes import parse_memory
from agentix.provider.base import (
    DeployedBundle,
    Sandbox,
    SandboxConfig,
    SandboxId,
    SandboxInfo,
    SandboxProvider,
    SandboxResource,
)
from agentix.runtime import BUNDLE_NIX_ROOT, BUNDLE_RUNTIME_ENTRYPOINT, LISTEN_ENV

if TYPE_CHECKING:
    import grpc

    from agentix.provider.local import LocalProvider

__all__ = ["InProcessLocalProvider", "LocalProviderConfig", "parse_memory"]

# The name it had as agentix.provider.local, so logging configured for it still applies.
_log = logging.getLogger("agentix.provider.local")

# Inside the sandbox: the daemon's socket directory (a small tmpfs the host
# reaches through /proc/<sandbox init>/root) and socket.
SANDBOX_RUN_DIR = "/run/agentix"
SANDBOX_SOCKET = f"{SANDBOX_RUN_DIR}/agentix.sock"
_SOCKET_NAME = "agentix.sock"
_OWNER_FILE = "owner.json"
# Top-level entries of the root that the sandbox gets fresh instead of from the root.
_FRESH_TOP_LEVEL = {"dev", "proc", "sys", "tmp", "run", "nix"}
# sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107
_TAIL_BYTES = 8192
# What the daemon writes once it listens (docs/BUNDLE.md): the readiness
# wait checks the socket then rather than at its next poll.
_SERVING_LINE = b"serving agentix.runtime.v1 on "
# Until that line (a daemon logging below info never writes it), the wait
# looks at the socket this often; after it, every 5 ms.
_QUIET_POLL_SECONDS = 0.025
# Size of the tmpfs at /run/agentix: it holds a socket; a sandbox must not
# fill memory through the one directory the host looks into.
_SOCKET_DIR_BYTES = 1 << 20
_MACHINE_PLATFORM = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}.get(
    platform_module.machine(), f"linux/{platform_module.machine()}"
)
_PLATFORM_ALIASES = {
    "linux/amd64": {"linux/amd64", "linux/x86-64", "linux/x86_64", "amd64", "x86-64", "x86_64"},
    "linux/arm64": {"linux/arm64", "linux/arm64/v8", "linux/aarch64", "arm64", "aarch64"},
}
# Enters the cgroups named before "--" (their join files), then execs the rest:
# the whole sandbox tree starts inside its cgroups, with no window outside. The
# shell writes "0" (itself): into a v1 `tasks` file that moves its one thread
# without the kernel's global threadgroup lock, whose RCU grace period made every
# cgroup.procs join cost ~11 ms of a cold create (see `_Cgroups.join_files`).
_ENTER_CGROUPS = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'


def _default_runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return Path(base) / "agentix-sandboxes"
    return Path("/tmp") / f"agentix-sandboxes-{os.getuid()}"


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentix" / "local"


@dataclass
class LocalProviderConfig:
    """Settings of a `LocalProvider` (all optional).

    bwrap: the bubblewrap binary.
    runtime_dir: where per-sandbox host directories (socket, log) live; created
      mode 0700. Default ``$XDG_RUNTIME_DIR/agentix-sandboxes``, else
      ``/tmp/agentix-sandboxes-<uid>``.
    cache_dir: where bundle tarballs and OCI layouts are unpacked, once per
      digest. Default ``~/.cache/agentix/local``.
    ready_timeout: seconds for the daemon to answer a health check after start.
    stop_grace: seconds between SIGTERM and SIGKILL on `delete`.
    pids_max: default cap on processes + threads per sandbox (None: no cap).
    memory: default memory limit (bytes or ``"512m"``) when a config has none.
    require_limits: a limit that cannot be enforced here (no writable cgroup
      v1 controller) fails `create` (True) or is logged and skipped (False).
      The *default* ``pids_max`` is only logged either way.
    cgroup_root: where the cgroup v1 controllers are mounted.
    cgroup_parent: sandboxes' cgroups go to
      ``<cgroup_root>/<controller>/<this process's cgroup>/<cgroup_parent>/<id>``.
    share_net: keep the host's network namespace (default False: only a
      private loopback).
    tmp_size, run_size, shm_size: byte caps (``"1g"`` style, as `memory`)
      of the tmpfs at ``/tmp``, ``/run`` and ``/dev/shm``; a write beyond
      fails with ENOSPC. ``/run/agentix`` (the socket) is 1 MiB. tmpfs pages
      also count against the memory limit.
    log_max_bytes: cap on ``sandbox.log`` plus its one rotated predecessor
      ``sandbox.log.1`` (the daemon's and worker's stdout/stderr).
    seccomp: install the seccomp filter of `agentix.provider._seccomp`
      (default True; False only for a kernel or architecture it breaks).
    extra_bwrap_args: appended before the entry point, for what this class
      does not model.
    ttl: seconds a sandbox of `LocalProvider` outlives this process if it
      dies without deleting it (the provider service then ends it); renewed
      every ``ttl / 3`` while the provider is open. Unused in-process (there
      sandboxes die with the process).

    Which of these `LocalProvider` sends with each sandbox and which make it
    start a providerd of its own is in `agentix.provider.local`.
    """

    bwrap: str = "bwrap"
    runtime_dir: str | None = None
    cache_dir: str | None = None
    ready_timeout: float = 30.0
    stop_grace: float = 5.0
    pids_max: int | None = 1024
    memory: int | str | None = None
    require_limits: bool = True
    cgroup_root: str = "/sys/fs/cgroup"
    cgroup_parent: str = "agentix"
    share_net: bool = False
    tmp_size: int | str = "1g"
    run_size: int | str = "16m"
    shm_size: int | str = "64m"
    log_max_bytes: int = 16 << 20
    seccomp: bool = True
    extra_bwrap_args: list[str] = field(default_factory=list)
    ttl: float = 300.0

    def __post_init__(self) -> None:
        if self.ready_timeout <= 0 or self.stop_grace < 0:
            raise ValueError("ready_timeout must be > 0 and stop_grace >= 0")
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, (int, float)) or not self.ttl >= 3:
            raise ValueError(f"ttl must be a number of seconds >= 3 (got {self.ttl!r})")
        if self.pids_max is not None and (isinstance(self.pids_max, bool) or self.pids_max < 1):
            raise ValueError(f"pids_max must be a positive int or None (got {self.pids_max!r})")
        if self.memory is not None:
            parse_memory(self.memory)
        for size in (self.tmp_size, self.run_size, self.shm_size):
            parse_memory(size)
        if isinstance(self.log_max_bytes, bool) or self.log_max_bytes < 2 * _TAIL_BYTES:
            raise ValueError(f"log_max_bytes must be an int >= {2 * _TAIL_BYTES} (got {self.log_max_bytes!r})")
        if self.seccomp and not _seccomp.supported():
            raise ValueError(
                f"no seccomp filter for {platform_module.machine()}: pass LocalProviderConfig(seccomp=False) to run without"
            )
        if not self.cgroup_parent or ".." in self.cgroup_parent.split("/"):
            raise ValueError(f"cgroup_parent must be a relative cgroup name (got {self.cgroup_parent!r})")

    def to_provider(self) -> LocalProvider:
        """A `LocalProvider` (the provider service's client) with these settings."""
        from agentix.provider.local import LocalProvider

        return LocalProvider(self)


class _Cgroups:
    """The cgroup v1 directories of one sandbox (one per controller used)."""

    def __init__(self, root: str, parent: str, sandbox_id: str) -> None:
        self.root = Path(root)
        self.parent = parent
        self.sandbox_id = sandbox_id
        self.paths: dict[str, Path] = {}

    def _own(self, controller: str) -> str | None:
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
        return None

    def make(self, controller: str) -> Path | str:
        """Creates this sandbox's cgroup for `controller`; returns it, or the
        reason it cannot (a string)."""
        mount = self.root / controller
        own = self._own(controller)
        if own is None or not (mount / "cgroup.procs").is_file():
            return f"cgroup v1 controller {controller!r} is not mounted at {mount}"
        # Under our own cgroup: the sandbox stays inside whatever accounting
        # this process is under (a VM slice, a CI job's limit).
        path = mount / own.lstrip("/") / self.parent / self.sandbox_id
        try:
            path.mkdir(parents=True, mode=0o755)
        except OSError as error:
            return f"cannot create {path}: {error.strerror}"
        self.paths[controller] = path
        return path

    def write(self, controller: str, name: str, value: str) -> None:
        (self.paths[controller] / name).write_text(value)

    def join_files(self) -> list[str]:
        """The file a single-threaded process writes "0" into to join each cgroup:
        `tasks` on a v1 hierarchy (the current thread moves without the global
        threadgroup lock), `cgroup.procs` where there is none (v2)."""
        return [str(path / "tasks") if (path / "tasks").is_file() else str(path / "cgroup.procs")
                for path in self.paths.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths.values():
            try:
                found.update(int(line) for line in (path / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return found

    def read(self, controller: str, name: str) -> str | None:
        path = self.paths.get(controller)
        try:
            return (path / name).read_text() if path else None
        except OSError:
            return None

    def remove(self) -> list[str]:
        """Removes the cgroups (they must be empty); returns what could not be removed."""
        left = []
        for controller, path in list(self.paths.items()):
            for _ in range(100):  # exiting tasks leave the cgroup a moment after they die
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
            else:
                left.append(str(path))
                continue
            del self.paths[controller]
            try:  # the shared parent, once its last sandbox is gone
                path.parent.rmdir()
            except OSError:
                pass
        return left


class _LogDrain:
    """Copies the sandbox's stdout and stderr (the read end of a pipe) into
    ``sandbox.log`` on a thread of its own, at most ``max_bytes / 2`` per
    file: beyond, ``sandbox.log`` becomes ``sandbox.log.1`` (replacing the
    previous one) and a new one starts. The pipe is drained to the end even
    when the files cannot be written, so the sandbox never blocks on it.

    Why a pipe: a host file as the sandbox's stdout could be reopened from
    inside through ``/proc/<pid>/fd/1`` — read, truncated or grown without
    bound. A pipe reopened that way is still only this capped stream."""

    def __init__(self, read_fd: int, path: Path, max_bytes: int, wake: Callable[[], None] | None = None) -> None:
        self.path = path
        self._fd = read_fd
        self._half = max_bytes // 2
        # Called once when the daemon says it serves (its log line) or the
        # output ends: the provider's readiness wait wakes then, not a poll later.
        self._wake = wake
        self._thread = threading.Thread(target=self._run, name=f"agentix-log-{path.parent.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        out = None
        written = 0
        try:
            out = open(self.path, "ab", buffering=0)
            carry = b""
            while data := os.read(self._fd, 1 << 16):
                if self._wake is not None:
                    if _SERVING_LINE in carry + data:
                        self._call_wake()
                    carry = data[-len(_SERVING_LINE) + 1:]
                while data and out is not None:
                    try:
                        if written >= self._half:
                            out.close()
                            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                            out = open(self.path, "wb", buffering=0)
                            written = 0
                        piece = data[: self._half - written]
                        out.write(piece)
                        written += len(piece)
                        data = data[len(piece):]
                    except OSError:  # the directory is being removed: keep draining
                        out = None
        except OSError:
            pass
        finally:
            os.close(self._fd)
            if out is not None:
                out.close()
            self._call_wake()

    def _call_wake(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None:
            try:
                wake()
            except RuntimeError:  # the waiting loop has closed
                pass

    def join(self, timeout: float) -> None:
        """Waits until the sandbox's side is closed and everything is written."""
        self._thread.join(timeout)


@dataclass
class _Running:
    sandbox_id: str
    host_dir: Path
    socket_path: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    cgroups: _Cgroups
    runtime_url: str
    token: str = ""
    log: _LogDrain | None = None
    # Set (from the log drain's thread) once the daemon said it serves or its output ended.
    said_serving: asyncio.Event | None = None


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (all threads), from /proc."""
    result: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return result
    for task in tasks:
        try:
            result.extend(int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except OSError:
            pass
    return result


def _tail(path: Path, limit: int = _TAIL_BYTES) -> str:
    """The last `limit` bytes of `path`, preceded by its rotated
    predecessor ``<path>.1`` when `path` alone is shorter."""
    data = b""
    size = 0
    for part in (path, path.with_name(path.name + ".1")):
        try:
            with open(part, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                part_size = handle.tell()
                handle.seek(max(0, part_size - (limit - len(data))))
                data = handle.read() + data
                size += part_size
        except OSError:
            pass
        if len(data) >= limit:
            break
    text = data.decode(errors="replace").strip()
    return ("…" + text) if size > limit else text


def _private_dir(path: Path) -> None:
    """Creates `path` mode 0700, or checks that an existing one is a real
    directory of ours that nobody else can enter (it is under /tmp by default)."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(
            f"{path} must be a directory owned by uid {os.getuid()} with mode 0700; "
            "remove it or set LocalProviderConfig.runtime_dir"
        )


class _TokenNotEnforced(RuntimeError):
    """The daemon serves without checking the sandbox's token."""


async def _health_ok(socket_path: Path, timeout: float, token: str = "") -> grpc.aio.Channel | None:
    """One ``grpc.health.v1.Health/Check`` on the daemon's socket. Hand-encoded
    (an empty request; the reply's field 1 is the status, 1 = SERVING) because
    Debian's grpcio ships without the grpc_health package. With a token, a
    second check without it must be refused (else `_TokenNotEnforced`).
    Returns the channel, still open, when the daemon serves (made with the
    client's options: the sandbox's client takes it, `CheckedChannel`), else
    None."""
    import grpc

    from agentix.runtime.client.channels import channel_options, close_channel
    from agentix.runtime.client.tls import TlsFiles

    target = f"unix://{socket_path}"
    channel = grpc.aio.insecure_channel(target, options=channel_options(TlsFiles(target, None, None, None, None)))
    serving = False
    try:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda _: b"",
            response_deserializer=lambda data: data,
        )
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        reply = await check(None, timeout=timeout, metadata=metadata)
        if reply[:2] != b"\x08\x01":
            return None
        if token:
            # Fail closed: an entry point that drops its arguments leaves the
            # daemon without --token-file, i.e. without a token check.
            try:
                await check(None, timeout=timeout)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                    serving = True
                    return channel
            raise _TokenNotEnforced(
                "the sandbox's daemon answers without the token: its entry point must pass its arguments "
                "(--token-file /proc/self/fd/N) to agentix-sandboxd, as a bundle's bootstrap.sh does"
            )
        serving = True
        return channel
    except grpc.aio.AioRpcError as error:
        # Something answered gRPC on the socket but has no health service: it is up.
        serving = error.code() == grpc.StatusCode.UNIMPLEMENTED
        return channel if serving else None
    finally:
        if not serving:
            await close_channel(channel)


def _waker(event: asyncio.Event | None) -> Callable[[], None] | None:
    """What another thread calls to set `event` on the running loop (None
    without an event)."""
    if event is None:
        return None
    loop, set_event = asyncio.get_running_loop(), event.set

    def wake() -> None:
        loop.call_soon_threadsafe(set_event)

    return wake


class InProcessLocalProvider(SandboxProvider):
    """Sandboxes on this machine with bubblewrap, run by this process (see the module docstring).

    `SandboxConfig` fields:
      image: ``"host"`` (or ``"/"``, ``""``) for the host's root read-only; a
        directory holding a root filesystem; or an OCI image layout directory,
        as ``oci:DIR[:REF]`` or a directory with an ``oci-layout`` file. Images
        are not pulled.
      bundle: a directory holding ``nix/runtime/bootstrap.sh`` (or that ``nix``
        directory itself), or a bundle tarball (unpacked once per sha256 into
        the cache).
      platform: must be this machine's (``linux/amd64`` here) or None.
      env: added to the sandbox's environment (which does not inherit the host's).
      resource: ``memory`` and ``cpu`` through cgroup v1; ``gpu`` is refused.
    """

    def __init__(self, config: LocalProviderConfig | None = None, **kwargs: object) -> None:
        if config is not None and kwargs:
            raise TypeError("pass either a LocalProviderConfig or keyword settings, not both")
        self.config = config if config is not None else LocalProviderConfig(**kwargs)  # type: ignore[arg-type]
        self.runtime_dir = Path(self.config.runtime_dir) if self.config.runtime_dir else _default_runtime_dir()
        self.cache_dir = Path(self.config.cache_dir) if self.config.cache_dir else _default_cache_dir()
        self._sandboxes: dict[str, _Running] = {}
        # (realpath, size, mtime) of a bundle tarball -> its sha256, so a
        # create does not re-hash an unchanged tarball.
        self._tar_digests: dict[tuple[str, int, int], str] = {}
        self._pruned = False

    async def __aenter__(self) -> InProcessLocalProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Deletes every sandbox this provider still runs."""
        for sandbox_id in list(self._sandboxes):
            await self.delete(SandboxId(sandbox_id))

    # ------------------------------------------------------------------ create

    async def create(self, config: SandboxConfig) -> Sandbox:
        if not isinstance(config, SandboxConfig):
            raise TypeError(f"create() needs a SandboxConfig (got {type(config).__name__})")
        self._check_platform(config.platform)
        resource = config.resource
        if resource is not None and resource.gpu:
            raise ValueError("the local provider cannot give a sandbox GPUs (SandboxResource.gpu must be None)")
        bwrap = shutil.which(self.config.bwrap)
        if bwrap is None:
            raise RuntimeError(f"bubblewrap not found ({self.config.bwrap!r}): install it with `apt-get install bubblewrap`")
        # Slow, cached steps (unpacking) run off the event loop.
        nix_dir = await asyncio.to_thread(self._bundle_nix_dir, config.bundle)
        root = await asyncio.to_thread(self._root_dir, config.image)

        sandbox_id = f"local-{secrets.token_hex(6)}"
        _private_dir(self.runtime_dir)
        if not self._pruned:
            self._pruned = True
            await asyncio.to_thread(self.prune)
        host_dir = self.runtime_dir / sandbox_id
        host_dir.mkdir(mode=0o700)
        # Made a symlink to /proc/<sandbox init>/root/run/agentix once the
        # sandbox is set up (_wait_ready): the socket directory is the
        # sandbox's own small tmpfs, not a host directory it could fill.
        socket_path = host_dir / "run" / _SOCKET_NAME
        if len(str(socket_path)) > _MAX_SOCKET_PATH:
            shutil.rmtree(host_dir)
            raise RuntimeError(
                f"socket path {socket_path} is longer than a Unix socket allows; set a shorter LocalProviderConfig.runtime_dir"
            )
        running = _Running(
            sandbox_id=sandbox_id,
            host_dir=host_dir,
            socket_path=socket_path,
            log_path=host_dir / "sandbox.log",
            process=None,  # type: ignore[arg-type]  # set below
            cgroups=_Cgroups(self.config.cgroup_root, self.config.cgroup_parent, sandbox_id),
            runtime_url=f"unix://{socket_path}",
            # Every RPC to the sandbox's daemon must carry it (docs/PROVIDERS.md).
            token=secrets.token_urlsafe(32),
            said_serving=asyncio.Event(),
        )
        try:
            self._apply_limits(running.cgroups, resource)
            # Who owns this directory and what else to remove, for prune()
            # after a host process that died without deleting its sandboxes.
            (host_dir / _OWNER_FILE).write_text(
                json.dumps({"owner": _process_identity(os.getpid()), "cgroups": [str(p) for p in running.cgroups.paths.values()]})
            )
            env = self._sandbox_env(sandbox_id, config.env)
            self._start(running, bwrap, root, nix_dir, env)
            self._sandboxes[sandbox_id] = running
            channel = await self._wait_ready(running)
        except BaseException:
            # Cancelled or failed: leave nothing behind (shielded so a
            # cancellation cannot interrupt the cleanup itself).
            self._sandboxes.pop(sandbox_id, None)
            await asyncio.shield(self._teardown(running))
            raise
        _log.debug("sandbox %s ready at %s", sandbox_id, running.runtime_url)
        sandbox = Sandbox(
            sandbox_id=SandboxId(sandbox_id), runtime_url=running.runtime_url, status="running", token=running.token
        )
        if channel is not None:
            from agentix.runtime.client.channels import CheckedChannel

            sandbox.checked_channel = CheckedChannel(running.runtime_url, running.token, channel)
        return sandbox

    def _start(self, running: _Running, bwrap: str, root: Path, nix_dir: Path, env: dict[str, str]) -> None:
        """Starts the bwrap tree of `running`. What it gets besides argv and env:
        the token through a pipe (``--token-file /proc/self/fd/N``: nothing
        in the sandbox can read it once the daemon has), the seccomp filter
        on an fd, and a pipe as stdout and stderr (drained by `_LogDrain`)."""
        opened: list[int] = []
        try:
            token_read, token_write = os.pipe()
            opened += [token_read, token_write]
            os.write(token_write, running.token.encode())  # 43 bytes: fits the pipe buffer
            os.close(token_write)
            opened.remove(token_write)
            passed = [token_read]
            seccomp_fd = None
            if self.config.seccomp:
                seccomp_fd = _seccomp.filter_fd()
                opened.append(seccomp_fd)
                passed.append(seccomp_fd)
            argv = self._argv(bwrap, running.sandbox_id, root, nix_dir, seccomp_fd=seccomp_fd)
            argv += ["--token-file", f"/proc/self/fd/{token_read}"]  # the entry point passes these to the daemon
            if running.cgroups.paths:
                argv = ["/bin/sh", "-c", _ENTER_CGROUPS, "agentix-enter-cgroups", *running.cgroups.join_files(), "--", *argv]
            log_read, log_write = os.pipe()
            opened += [log_read, log_write]
            running.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log_write, stderr=log_write, env=env, close_fds=True,
                pass_fds=passed,
            )
            opened.remove(log_read)
            running.log = _LogDrain(log_read, running.log_path, self.config.log_max_bytes, _waker(running.said_serving))
        finally:
            for fd in opened:
                os.close(fd)

    def _check_platform(self, requested: str | None) -> None:
        if requested is None:
            return
        wanted = requested.strip().lower()
        if wanted not in _PLATFORM_ALIASES.get(_MACHINE_PLATFORM, {_MACHINE_PLATFORM}):
            raise ValueError(
                f"the local provider runs sandboxes on this machine ({_MACHINE_PLATFORM}); "
                f"platform {requested!r} cannot be honoured (leave SandboxConfig.platform unset)"
            )

    def _apply_limits(self, cgroups: _Cgroups, resource: SandboxResource | None) -> None:
        memory = (resource.memory if resource else None) or self.config.memory
        cpu = resource.cpu if resource else None
        wanted: list[tuple[str, str, str, bool]] = []  # controller, file, value, explicitly requested
        if memory is not None:
            wanted.append(("memory", "memory.limit_in_bytes", str(parse_memory(memory)), True))
        if cpu is not None:
            period = 100_000
            wanted.append(("cpu", "cpu.cfs_quota_us", str(max(1000, int(cpu * period))), True))
        if self.config.pids_max is not None:
            wanted.append(("pids", "pids.max", str(self.config.pids_max), False))
        for controller, name, value, requested in wanted:
            made = cgroups.paths.get(controller) or cgroups.make(controller)
            problem = made if isinstance(made, str) else None
            if problem is None:
                try:
                    if controller == "cpu":
                        cgroups.write("cpu", "cpu.cfs_period_us", "100000")
                    cgroups.write(controller, name, value)
                    if controller == "memory":
                        _limit_swap_too(cgroups, value)
                except OSError as error:
                    problem = f"cannot set {name}={value}: {error.strerror}"
            if problem is None:
                continue
            message = f"sandbox {cgroups.sandbox_id}: {controller} limit not enforced: {problem}"
            if requested and self.config.require_limits:
                raise RuntimeError(
                    f"{message}. Run where cgroup v1 is writable (as root), or pass "
                    "LocalProviderConfig(require_limits=False) to run without the limit."
                )
            _log.warning("%s", message)

    def _sandbox_env(self, sandbox_id: str, extra: dict[str, str] | None) -> dict[str, str]:
        # Not the host's environment: nothing of the host (tokens, paths)
        # leaks in unless the config says so.
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "AGENTIX_SANDBOX_ID": sandbox_id,
        }
        env.update(extra or {})
        env[LISTEN_ENV] = f"unix://{SANDBOX_SOCKET}"  # the provider's to choose: it waits on that socket
        return env

    def _argv(self, bwrap: str, sandbox_id: str, root: Path, nix_dir: Path, seccomp_fd: int | None = None) -> list[str]:
        config = self.config
        argv = [
            bwrap,
            # A user namespace: without it bwrap run by root keeps the host's
            # capability bounding set (it only clears it in a new one). The
            # sandbox's uid 0 still maps to the caller's uid.
            "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            *([] if config.share_net else ["--unshare-net"]),
            "--hostname", sandbox_id,
            "--die-with-parent", "--new-session",
            "--cap-drop", "ALL",
            # Applied last, to the namespace's init too: see _seccomp.
            *([] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]),
            # The root: an empty tmpfs holding read-only binds of the root's
            # top-level entries, remounted read-only at the end. Mount points
            # (/nix, /run/agentix) can then be made even when the root lacks them.
            "--tmpfs", "/",
        ]
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if entry.name in _FRESH_TOP_LEVEL:
                continue
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(entry.path), f"/{entry.name}"]
            elif entry.is_dir() or entry.is_file():
                argv += ["--ro-bind", entry.path, f"/{entry.name}"]
        argv += [
            "--ro-bind", str(nix_dir), BUNDLE_NIX_ROOT,
            "--proc", "/proc",
            # /dev is a tmpfs of device nodes: read-only (devices stay
            # usable), with a capped tmpfs for /dev/shm.
            "--dev", "/dev",
            "--remount-ro", "/dev",
            "--size", str(parse_memory(config.shm_size)), "--tmpfs", "/dev/shm",
            # Every writable mount is a capped tmpfs; no host directory is writable.
            "--size", str(parse_memory(config.tmp_size)), "--tmpfs", "/tmp",
            "--size", str(parse_memory(config.run_size)), "--tmpfs", "/run",
            # A mount point: the sandbox cannot rename or replace it, so the
            # host's path through /proc/<init>/root always reaches this tmpfs.
            "--size", str(_SOCKET_DIR_BYTES), "--tmpfs", SANDBOX_RUN_DIR,
            # The sandbox runs as uid 0 (without capabilities): /proc/sys and
            # friends are owned by uid 0 and global, so a writable /proc would
            # let it change e.g. the host's kernel.core_pattern.
            "--remount-ro", "/proc",
            "--remount-ro", "/",
            "--chdir", "/tmp",
            *config.extra_bwrap_args,
            BUNDLE_RUNTIME_ENTRYPOINT,
        ]
        return argv

    async def _wait_ready(self, running: _Running) -> grpc.aio.Channel | None:
        """Waits until the daemon answers its health check (`_health_ok`)
        and returns that check's channel (None when it could not be kept).
        Between looks it sleeps until the daemon's log says it serves (or its
        output ends), at most `_QUIET_POLL_SECONDS`; after that line, 5 ms."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.ready_timeout
        delay = 0.005
        while True:
            code = running.process.poll()
            if code is not None:
                if running.log is not None:
                    running.log.join(2.0)
                raise RuntimeError(
                    f"sandbox {running.sandbox_id} exited with code {code} before its runtime came up; "
                    f"its output ends with:\n{_tail(running.log_path)}"
                )
            if not running.socket_path.parent.is_symlink():
                _link_socket_dir(running)
            if _is_socket(running.socket_path):
                channel = await _health_ok(
                    running.socket_path, timeout=max(0.1, min(2.0, deadline - loop.time())), token=running.token
                )
                if channel is not None:
                    return channel
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(
                    f"sandbox {running.sandbox_id}: runtime not serving on {running.runtime_url} after "
                    f"{self.config.ready_timeout}s; its output ends with:\n{_tail(running.log_path)}"
                )
            said = running.said_serving
            if said is not None and not said.is_set():
                # No poll while the daemon starts: its "serving" line (or
                # the end of its output) wakes this wait (issue 25).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(said.wait(), min(_QUIET_POLL_SECONDS, left))
            else:
                # A short, flat interval: a backoff to 50 ms cost up to 40 ms
                # of every create (measured).
                await asyncio.sleep(min(delay, left))

    # ------------------------------------------------------------- bundle/root

    def _bundle_nix_dir(self, bundle: str) -> Path:
        path = Path(bundle).expanduser()
        if not path.exists():
            raise ValueError(f"bundle {bundle!r} does not exist (expected a bundle directory or tarball)")
        if path.is_dir():
            if has_bootstrap(path):
                return (path / "nix").resolve()
            if (path / "runtime" / "bootstrap.sh").is_file():  # the nix/ directory itself
                return path.resolve()
            raise ValueError(f"{bundle} is not a bundle: it has no nix/runtime/bootstrap.sh")
        deployed = self._deploy_tarball(path)
        return Path(deployed.bundle) / "nix"

    def _deploy_tarball(self, tar: Path, name: str | None = None, platform: str | None = None) -> DeployedBundle:
        if not tar.is_file() or not tarfile.is_tarfile(tar):
            raise ValueError(f"bundle {str(tar)!r} is neither a bundle directory nor a tarball")
        real = os.path.realpath(tar)
        info = os.stat(real)
        key = (real, info.st_size, info.st_mtime_ns)
        digest = self._tar_digests.get(key)
        if digest is None:
            hasher = hashlib.sha256()
            with open(real, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    hasher.update(chunk)
            digest = self._tar_digests[key] = hasher.hexdigest()
        root = self.cache_dir / "bundles" / f"sha256-{digest}"
        if is_verified_bundle(root, digest):
            manifest_path = root / "manifest.json"
            manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
        else:
            manifest = _read_manifest(tar)
            extract_nix_tree(tar, root, manifest=manifest, expected_sha256=digest)
        label = name or (f"{manifest.get('name')}:{manifest.get('tag')}" if manifest and manifest.get("name") else None)
        metadata = {"cache": str(root)}
        if label:
            metadata["name"] = label
        return DeployedBundle(
            bundle=str(root),
            platform=platform or (manifest or {}).get("platform"),
            metadata=metadata,
            hints={"inspect contents": f"ls -la {root}/nix/", "remove from cache": f"rm -rf {root}"},
        )

    async def deploy_bundle(
        self, bundle: Path, *, name: str | None = None, platform: str | None = None
    ) -> DeployedBundle:
        """Unpacks bundle tarball `bundle` into the cache (once per sha256) and
        returns the directory to use as `SandboxConfig.bundle`."""
        return await asyncio.to_thread(self._deploy_tarball, Path(bundle), name, platform)

    def _root_dir(self, image: str) -> Path:
        if image in ("", "host", "/"):
            return Path("/")
        if image.startswith("oci:"):
            spec = image[4:]
            layout, ref = (spec, None) if os.path.isdir(spec) else (spec.rpartition(":")[0], spec.rpartition(":")[2])
            if not os.path.isdir(layout):
                raise ValueError(f"image {image!r}: {layout!r} is not an OCI layout directory")
            return unpack_oci_layout(Path(layout), ref or None, self.cache_dir / "rootfs")
        path = Path(image).expanduser()
        if path.is_dir():
            if (path / "oci-layout").is_file():
                return unpack_oci_layout(path, None, self.cache_dir / "rootfs")
            return path.resolve()
        raise ValueError(
            f"image {image!r} is not usable by the local provider: use 'host' (this machine's root, read-only), "
            "a root filesystem directory, or an OCI image layout (oci:DIR[:REF]); images are not pulled"
        )

    def prune(self) -> list[str]:
        """Removes the leftovers (host directory, cgroups) of sandboxes whose
        creating process is gone — one killed before it could `delete` them.
        Their processes died with it (``--die-with-parent``). Runs once
        before the first `create`; returns the pruned sandbox ids."""
        pruned: list[str] = []
        try:
            entries = list(os.scandir(self.runtime_dir))
        except FileNotFoundError:
            return pruned
        for entry in entries:
            if not entry.name.startswith("local-") or entry.name in self._sandboxes:
                continue
            try:
                record = json.loads(Path(entry.path, _OWNER_FILE).read_text())
                owner = record["owner"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being created right now, or not ours to judge
            if _process_identity(int(owner.split()[0])) == owner:
                continue  # its provider process is alive
            for path in map(Path, record.get("cgroups", [])):
                try:
                    for pid in (path / "cgroup.procs").read_text().split():
                        _signal(int(pid), signal.SIGKILL)
                except OSError:
                    pass
                for _ in range(100):
                    try:
                        path.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.01)
                try:  # the shared parent, once its last sandbox is gone
                    path.parent.rmdir()
                except OSError:
                    pass
            shutil.rmtree(entry.path, ignore_errors=True)
            pruned.append(entry.name)
        if pruned:
            _log.info("removed leftovers of sandboxes whose provider process is gone: %s", ", ".join(pruned))
        return pruned

    # ------------------------------------------------------------ get / delete

    async def get(self, sandbox_id: SandboxId) -> SandboxInfo:
        running = self._lookup(sandbox_id)
        code = running.process.poll()
        status = "running" if code is None else f"exited ({code})"
        return SandboxInfo(sandbox_id=SandboxId(sandbox_id), runtime_url=running.runtime_url, status=status)

    async def delete(self, sandbox_id: SandboxId) -> None:
        running = self._lookup(sandbox_id)
        del self._sandboxes[sandbox_id]
        await asyncio.shield(self._teardown(running))

    def _lookup(self, sandbox_id: str) -> _Running:
        running = self._sandboxes.get(sandbox_id)
        if running is None:
            raise KeyError(f"no sandbox {sandbox_id!r} was created by this LocalProvider (or it was deleted)")
        return running

    async def _teardown(self, running: _Running) -> None:
        """SIGTERM the sandbox's processes, SIGKILL the tree after the grace
        period, then remove its cgroups and host directory."""
        process = running.process
        if process is not None and process.poll() is None:
            # bwrap -> the namespace's init -> the entry point (the daemon).
            # The daemon stops its worker on SIGTERM.
            for init in _children(process.pid):
                for pid in _children(init):
                    _signal(pid, signal.SIGTERM)
            if not await _exited(process, self.config.stop_grace):
                # Killing the namespace's init kills everything in the pid
                # namespace; --die-with-parent covers the init if bwrap goes first.
                for pid in (*_children(process.pid), process.pid, *running.cgroups.pids()):
                    _signal(pid, signal.SIGKILL)
                if not await _exited(process, 10.0):
                    _log.error("sandbox %s: bwrap (pid %d) survived SIGKILL", running.sandbox_id, process.pid)
        for pid in running.cgroups.pids():  # nothing can leave a pid namespace, but be sure
            _signal(pid, signal.SIGKILL)
        if running.log is not None:
            await asyncio.to_thread(running.log.join, 2.0)
        left = await asyncio.to_thread(running.cgroups.remove)
        if left:
            _log.warning("sandbox %s: could not remove cgroups %s", running.sandbox_id, left)
        await asyncio.to_thread(shutil.rmtree, running.host_dir, True)


def _link_socket_dir(running: _Running) -> None:
    """Points ``<host dir>/run`` at the sandbox's ``/run/agentix`` through
    ``/proc/<init>/root``, once the init has forked the entry point: bwrap
    forks it after the mounts and the pivot_root, so the path cannot reach
    the host's own ``/run/agentix`` in the meantime."""
    inits = _children(running.process.pid)  # bwrap's one child: the pid namespace's init
    if len(inits) != 1 or not _children(inits[0]):
        return
    running.socket_path.parent.symlink_to(f"/proc/{inits[0]}/root{SANDBOX_RUN_DIR}")


def _process_identity(pid: int) -> str:
    """``"<pid> <start time>"``: tells a live process from a later one that
    reused its pid ("" when no such process)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return f"{pid} {stat_line.rsplit(')', 1)[1].split()[19]}"


def _limit_swap_too(cgroups: _Cgroups, value: str) -> None:
    """memory+swap = memory, so a machine with swap cannot page the sandbox
    past its limit. Absent without swap accounting: nothing to do then."""
    try:
        cgroups.write("memory", "memory.memsw.limit_in_bytes", value)
    except FileNotFoundError:
        pass


def _is_socket(path: Path) -> bool:
    """True for a real socket: the sandbox owns the directory, and a symlink
    there would send the host's connection to some other socket on the host."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


async def _exited(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Waits (never a blocking waitpid on the loop) until `process` exits and
    is reaped, or `timeout` seconds pass: woken by its pidfd as it exits,
    where the kernel and the loop offer one (a 10 ms poll saw the exit 5 ms
    late on average), else polled every 10 ms."""
    if process.poll() is not None:
        return True
    pidfd = _pidfd(process.pid)  # not reaped yet (poll above): still our child's pid
    if pidfd is None:
        return await _polled_exit(process, timeout)
    try:
        loop = asyncio.get_running_loop()
        exited = loop.create_future()

        def readable() -> None:  # the pidfd stays readable until removed
            if not exited.done():
                exited.set_result(None)

        try:
            loop.add_reader(pidfd, readable)
        except (NotImplementedError, OSError, ValueError):
            return await _polled_exit(process, timeout)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(exited, timeout)
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    return process.poll() is not None


async def _polled_exit(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """`_exited` without a pidfd: looks every 10 ms."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while process.poll() is None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (readable once it exits), or None where the kernel
    or Python has none."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return pidfd_open(pid)
    except OSError:
        return None


def _read_manifest(tar: Path) -> dict | None:
    """The tarball's top-level manifest.json, if any; one with a ``format``
    other than ``agentix-bundle`` is refused."""
    manifest = read_manifest_member(tar)  # under the extraction caps
    if manifest is None:
        return None
    if not isinstance(manifest, dict):
        raise ValueError(f"{tar}: manifest.json is not a JSON object")
    if manifest.get("format", "agentix-bundle") != "agentix-bundle":
        raise ValueError(f"{tar}: manifest.json format is {manifest.get('format')!r}, not an agentix bundle")
    return manifest
