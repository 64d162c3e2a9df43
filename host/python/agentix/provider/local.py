"""`LocalProvider`: sandboxes on this machine, run by the provider service.

`LocalProvider` keeps the API it had when it ran bubblewrap itself
(`LocalProviderConfig`, ``create/get/delete/session/prune/deploy_bundle/aclose``,
``async with``) and is now a client of ``agentix-providerd``, whose local
backend runs each sandbox under bubblewrap with the isolation, limits and
teardown docs/PROVIDERS.md describes. Which providerd:

1. the one at ``$AGENTIX_PROVIDER_URL``, when set;
2. else the per-user one at ``$XDG_RUNTIME_DIR/agentix/providerd.sock`` (else
   ``/tmp/agentix-<uid>/providerd.sock``), which `LocalProvider` starts when
   none answers there (``agentix-providerd --listen unix://… --ready-fd N``,
   detached in its own session so that it outlives this process and serves
   the next one; its log is ``providerd.log`` beside the socket; a lock file
   makes two processes starting at once start one);
3. but a PRIVATE providerd, started for this provider alone and stopped by
   `aclose`, when a setting only a server can apply differs from its default
   (``bwrap``, ``runtime_dir``, ``run_size``, ``shm_size``, ``log_max_bytes``,
   ``seccomp``, ``require_limits``, ``cgroup_root``, ``cgroup_parent``,
   ``extra_bwrap_args``, ``pids_max=None``).

When the per-user providerd it started (or found) stops answering (it was
killed, say), `LocalProvider` starts it again on its next call, and that
call goes to the new one. A providerd that starts on the state directory of
one that died destroys what the dead one left (directories, cgroups), so the
sandboxes of a killed providerd (whose processes died with it) leave
nothing behind after its restart; they are not restored.

The binary is ``$AGENTIX_PROVIDERD``, else ``agentix-providerd`` beside the
package (``agentix/bin/``), on ``PATH``, or in a Bazel output tree
(``$AGENTIX_BAZEL_BIN``, or the ``bazel-bin`` of the repository holding this
package or of the working directory).

Per sandbox, the config goes into the request: ``memory`` (when the
`SandboxConfig` has none) → ``resources.memory_bytes``, ``pids_max`` →
``resources.pids`` (only where the service can enforce it: the default cap is
best effort, as it always was), ``tmp_size`` → ``resources.scratch_bytes``,
``share_net`` → network HOST, ``ready_timeout`` → the request's
``ready_timeout``, ``stop_grace`` → the delete's grace. Bundle tarballs and
OCI image layouts are unpacked here, into ``cache_dir`` as before (the
service runs on this machine), and passed to it as directories (the bundle
as its resolved directory, the one holding ``nix/``).

Sandboxes belong to the service: another process can list, reach and delete
them (``agentix sandbox ls``). Each gets a TTL of ``LocalProviderConfig.ttl``
(300 s) that this provider renews every ``ttl / 3`` while it is open, so a
process that dies without deleting its sandboxes leaks them for at most
``ttl``; `aclose` deletes the ones it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import MISSING
from pathlib import Path
from typing import Any, TypeVar

from agentix.provider._local_inprocess import (
    InProcessLocalProvider,
    LocalProviderConfig,
    _default_cache_dir,
    _exited,
    _private_dir,
)
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
from agentix.provider.errors import NotFound, ProviderError, ProviderUnavailable
from agentix.provider.service import URL_ENV, ServiceProvider, spec_from_config

__all__ = ["LocalProvider", "LocalProviderConfig", "default_socket", "find_providerd", "parse_memory"]

_log = logging.getLogger(__name__)
T = TypeVar("T")

PROVIDERD_ENV = "AGENTIX_PROVIDERD"
_BINARY = "agentix-providerd"
# Where Bazel puts the binary, relative to bazel-bin.
_BAZEL_PATHS = ("providers/agentix-providerd", "providers/service/agentix-providerd")
_DEFAULTS = LocalProviderConfig.__dataclass_fields__
# How long a started providerd may take to report ready on its --ready-fd.
START_TIMEOUT = 30.0
# How long "does one answer there?" may take.
_PROBE_TIMEOUT = 2.0


def default_socket() -> Path:
    """The per-user providerd socket: ``$XDG_RUNTIME_DIR/agentix/providerd.sock``,
    else ``/tmp/agentix-<uid>/providerd.sock``."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return Path(base) / "agentix" / "providerd.sock"
    return Path("/tmp") / f"agentix-{os.getuid()}" / "providerd.sock"


def find_providerd() -> str:
    """The ``agentix-providerd`` binary (see the module docstring for where
    it is looked for); `FileNotFoundError` with what to do when none is found."""
    explicit = os.environ.get(PROVIDERD_ENV)
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise FileNotFoundError(f"${PROVIDERD_ENV} is {explicit!r}, which is not an executable file")
    package = Path(__file__).resolve().parent.parent
    candidates = [package / "bin" / _BINARY]
    on_path = shutil.which(_BINARY)
    if on_path:
        candidates.append(Path(on_path))
    trees = []
    if os.environ.get("AGENTIX_BAZEL_BIN"):
        trees.append(Path(os.environ["AGENTIX_BAZEL_BIN"]))
    trees += [parent / "bazel-bin" for parent in package.parents]
    trees.append(Path.cwd() / "bazel-bin")
    candidates += [tree / rel for tree in trees for rel in _BAZEL_PATHS]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError(
        f"{_BINARY} not found (looked at ${PROVIDERD_ENV}, {package / 'bin'}, PATH and bazel-bin): build it with "
        f"`bazel build //providers/...`, put it on PATH or set {PROVIDERD_ENV}; or set {URL_ENV} to a running one"
    )


def _server_flags(config: LocalProviderConfig) -> list[str]:
    """providerd flags for the settings only a server applies, for those that
    differ from their defaults ([] when all are default)."""
    flags: list[str] = []

    def changed(name: str) -> bool:
        default = _DEFAULTS[name]
        value = getattr(config, name)
        if default.default_factory is not MISSING:
            return value != default.default_factory()
        return value != default.default

    if changed("bwrap"):
        flags.append(f"--bwrap={shutil.which(config.bwrap) or config.bwrap}")
    if changed("runtime_dir") and config.runtime_dir:
        flags.append(f"--state-dir={config.runtime_dir}")
    sizes = {"run_size": "--local-run-size", "shm_size": "--local-shm-size"}
    for name, flag in sizes.items():
        if changed(name):
            flags.append(f"{flag}={parse_memory(getattr(config, name))}")
    if changed("log_max_bytes"):
        flags.append(f"--local-log-max-bytes={config.log_max_bytes}")
    if changed("seccomp"):
        flags.append(f"--local-seccomp={'true' if config.seccomp else 'false'}")
    if changed("require_limits"):
        flags.append(f"--local-require-limits={'true' if config.require_limits else 'false'}")
    if changed("cgroup_root"):
        flags.append(f"--local-cgroup-root={config.cgroup_root}")
    if changed("cgroup_parent"):
        flags.append(f"--local-cgroup-parent={config.cgroup_parent}")
    if config.pids_max is None:
        flags.append("--local-pids-max=0")
    flags += [f"--local-extra-bwrap-arg={arg}" for arg in config.extra_bwrap_args]
    return flags


class _Providerd:
    """One agentix-providerd this process started."""

    def __init__(self, process: subprocess.Popen[bytes] | None, socket: Path, log: Path, private_dir: Path | None):
        self.process = process
        self.socket = socket
        self.log = log
        self.private_dir = private_dir  # removed on stop (private providerds only)

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; removes its private directory."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            if not await _exited(process, timeout):
                process.kill()
                await asyncio.to_thread(process.wait)
        if self.private_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.private_dir, True)


def _log_tail(path: Path, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _wait_ready_fd(read_fd: int, timeout: float) -> bytes:
    """What providerd writes on its --ready-fd (b"" when it closed it first, or on timeout)."""
    import select

    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b""
            ready, _, _ = select.select([read_fd], [], [], left)
            if ready:
                return os.read(read_fd, 4096)
    finally:
        os.close(read_fd)


def spawn_providerd(
    socket: Path, log: Path, extra_flags: Sequence[str] = (), *, detach: bool, binary: str | None = None,
    timeout: float = START_TIMEOUT,
) -> subprocess.Popen[bytes] | None:
    """Starts ``agentix-providerd --listen unix://<socket> --ready-fd N`` with its
    output appended to `log`, and returns once it reports ready on fd N.

    `detach`: in a session of its own and not this process's child (so it
    outlives it; returns None); else a child that gets SIGTERM when this
    process dies (``setpriv --pdeathsig``), returned for `_Providerd.stop`.
    `RuntimeError` with its log's tail when it exits or stays silent."""
    binary = binary or find_providerd()
    read_fd, write_fd = os.pipe()
    argv = [binary, "--listen", f"unix://{socket}", "--ready-fd", str(write_fd), *extra_flags]
    if detach:
        # sh starts it in the background and exits: init (or a subreaper)
        # adopts it, so it is nobody's zombie and outlives this process.
        argv = ["/bin/sh", "-c", '"$@" &', "agentix-start-providerd", *argv]
    elif shutil.which("setpriv"):
        argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
    with open(log, "ab") as out:
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=(write_fd,), close_fds=True,
                start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
    if detach:
        process.wait()
    said = _wait_ready_fd(read_fd, timeout)
    if said:
        return None if detach else process
    if not detach and process.poll() is None:
        process.kill()
        process.wait()
    raise RuntimeError(
        f"{binary} did not report ready within {timeout}s (or exited); its log {log} ends with:\n{_log_tail(log)}"
    )


async def _answers(url: str) -> bool:
    """True when a provider service answers at `url`."""
    client = ServiceProvider(url, rpc_timeout=_PROBE_TIMEOUT)
    try:
        await client._unary("GetCapabilities", _capabilities_request(), what="probe", attempts=1)
        return True
    except ProviderError as error:
        # Something answered: only an unreachable socket means "nobody".
        return error.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    finally:
        await client.aclose()


def _capabilities_request():
    from agentix.provider.v1 import provider_pb2

    return provider_pb2.GetCapabilitiesRequest()


def _lock(path: Path, timeout: float) -> int:
    """An exclusive flock on `path` (its fd; close it to unlock), waited for
    at most `timeout` seconds."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise TimeoutError(
                    f"{path} stayed locked for {timeout}s (another process starting providerd?)"
                ) from None
            time.sleep(0.05)


async def ensure_default_providerd(
    socket: Path | None = None, *, timeout: float = START_TIMEOUT, flags: Sequence[str] = ()
) -> str:
    """The URL of the per-user providerd at `socket` (default `default_socket`),
    started (detached, with `flags`) when none answers there. Two processes
    starting it at once start one: the check and the start happen under
    ``<socket>.start-lock``. Its log is ``<socket stem>.log`` beside it."""
    socket = socket or default_socket()
    url = f"unix://{socket}"
    if socket.exists() and await _answers(url):
        return url
    await asyncio.to_thread(_private_dir, socket.parent)
    # Not <socket>.lock: providerd itself holds that one while it serves.
    lock = await asyncio.to_thread(_lock, socket.with_name(socket.name + ".start-lock"), timeout + 10)
    try:
        if socket.exists() and await _answers(url):
            return url  # another process started it while we waited for the lock
        # A socket file left by a providerd that died is providerd's to
        # remove (under its own <socket>.lock, so never a live one's).
        # Its state (journal, sandbox directories) goes to providerd's own
        # default, /var/tmp/agx-<uid>: short enough for the sandboxes' socket
        # paths, and kept across reboots like the journal should be.
        log = socket.with_name(socket.stem + ".log")
        _log.info("starting agentix-providerd on %s (log: %s)", url, log)
        await asyncio.to_thread(spawn_providerd, socket, log, list(flags), detach=True, timeout=timeout)
    finally:
        os.close(lock)
    return url


class LocalProvider(SandboxProvider):
    """Sandboxes on this machine through ``agentix-providerd`` (module docstring).

    `SandboxConfig` fields:
      image: ``"host"`` (or ``"/"``, ``""``) for the host's root read-only; a
        directory holding a root filesystem; or an OCI image layout directory,
        as ``oci:DIR[:REF]`` or a directory with an ``oci-layout`` file
        (unpacked here, once per digest). Images are not pulled.
      bundle: a directory holding ``nix/runtime/bootstrap.sh`` (or that ``nix``
        directory itself), or a bundle tarball (unpacked once per sha256 into
        the cache).
      platform: must be this machine's or None.
      env: added to the sandbox's environment (which does not inherit the host's).
      resource: ``memory`` and ``cpu`` through cgroups; ``gpu`` is refused.
    """

    def __init__(self, config: LocalProviderConfig | None = None, **kwargs: object) -> None:
        if config is not None and kwargs:
            raise TypeError("pass either a LocalProviderConfig or keyword settings, not both")
        self.config = config if config is not None else LocalProviderConfig(**kwargs)  # type: ignore[arg-type]
        self.cache_dir = Path(self.config.cache_dir) if self.config.cache_dir else _default_cache_dir()
        # Bundle and image references are resolved here, with the in-process
        # provider's (cached, hardened) unpacking: the service runs on this machine.
        self._files = InProcessLocalProvider(self.config)
        self._init_client(_server_flags(self.config))

    def _init_client(self, server_flags: list[str]) -> None:
        """The providerd client's state, shared by this class and the engine
        and Kubernetes providers built on it. `server_flags`: non-empty, a
        private providerd with these flags is started on first use."""
        self._server_flags = server_flags
        self._service: ServiceProvider | None = None
        self._providerd: _Providerd | None = None
        self._starting: asyncio.Lock | None = None
        self._owned: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._pids_enforceable: bool | None = None
        self._per_user = False  # the service is the per-user providerd this class starts

    @property
    def url(self) -> str | None:
        """The providerd this provider talks to (None before the first use)."""
        return self._service.address if self._service is not None else None

    async def __aenter__(self) -> LocalProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Deletes every sandbox this provider made and still runs, stops its
        private providerd (if it started one) and closes the channel."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(BaseException):
                await renewer
        try:
            for sandbox_id in list(self._owned):
                try:
                    await self.delete(SandboxId(sandbox_id))
                except KeyError:
                    self._owned.discard(sandbox_id)
                except ProviderUnavailable as error:
                    # No providerd to ask: its sandboxes are destroyed when one
                    # starts again on its state directory, or end by their TTL.
                    _log.warning("could not delete sandbox %s: %s", sandbox_id, error.describe())
                    self._owned.clear()
                    break
        finally:
            service, self._service = self._service, None
            if service is not None:
                await service.aclose()
            providerd, self._providerd = self._providerd, None
            if providerd is not None:
                await providerd.stop()

    # ------------------------------------------------------------- the service

    async def _connect(self) -> ServiceProvider:
        if self._service is not None:
            return self._service
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._service is not None:
                return self._service
            if self._server_flags:
                url = await self._start_private()
            else:
                named = os.environ.get(URL_ENV)
                if named:
                    url = named
                else:
                    socket = default_socket().with_name(self._socket_name())
                    url = await ensure_default_providerd(socket, flags=self.providerd_flags())
                self._per_user = not named
            self._service = ServiceProvider(url)
        return self._service

    def _socket_name(self) -> str:
        """The file name of the per-user providerd's socket (beside
        `default_socket`) this provider uses when ``$AGENTIX_PROVIDER_URL`` is
        unset; each backend's providers have their own providerd."""
        return default_socket().name

    def providerd_flags(self) -> list[str]:
        """The flags of the per-user providerd this provider starts (none: the
        local backend's defaults)."""
        return []

    async def _reconnect(self, broken: ServiceProvider, error: ProviderUnavailable) -> ServiceProvider:
        """After `broken` answered UNAVAILABLE without a reason (nothing
        listens): the per-user providerd died, so it is started again (which
        destroys the dead one's leftovers) and used; any other service's
        error is raised."""
        if not self._per_user or error.reason:
            raise error
        _log.warning("the per-user agentix-providerd at %s stopped answering; starting it again", broken.address)
        async with self._starting or asyncio.Lock():
            if self._service is broken:
                self._service = None
                await broken.aclose()
        return await self._connect()

    async def _call(self, operation: Callable[[ServiceProvider], Awaitable[T]]) -> T:
        """`operation` on the service, once more on a restarted per-user
        providerd if the first attempt found none listening (`_reconnect`)."""
        service = await self._connect()
        try:
            return await operation(service)
        except ProviderUnavailable as error:
            service = await self._reconnect(service, error)
        return await operation(service)

    async def _start_private(self) -> str:
        # Short: providerd's state directory holds the sandboxes' sockets
        # (at most 22 bytes, see its --state-dir).
        private = Path(tempfile.mkdtemp(prefix="agx-", dir="/tmp"))
        socket = private / "providerd.sock"
        flags = list(self._server_flags)
        if not any(flag.startswith("--state-dir=") for flag in flags):
            flags.append(f"--state-dir={private / 's'}")
        _log.info("starting a private agentix-providerd for this LocalProvider: %s", " ".join(flags))
        try:
            process = await asyncio.to_thread(
                spawn_providerd, socket, private / "providerd.log", flags, detach=False
            )
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
        self._providerd = _Providerd(process, socket, private / "providerd.log", private)
        return self._providerd.url

    # ------------------------------------------------------------------ create

    async def create(self, config: SandboxConfig) -> Sandbox:
        if not isinstance(config, SandboxConfig):
            raise TypeError(f"create() needs a SandboxConfig (got {type(config).__name__})")
        # What was refused before anything was made stays refused here, with the same errors.
        self._files._check_platform(config.platform)
        resource = config.resource
        if resource is not None and resource.gpu:
            raise ValueError("the local provider cannot give a sandbox GPUs (SandboxResource.gpu must be None)")
        if self._server_flags and shutil.which(self.config.bwrap) is None:
            # Checked here only for a private providerd: a shared one has its own.
            raise RuntimeError(
                f"bubblewrap not found ({self.config.bwrap!r}): install it with `apt-get install bubblewrap`"
            )
        nix_dir = await asyncio.to_thread(self._files._bundle_nix_dir, config.bundle)
        root = await asyncio.to_thread(self._files._root_dir, config.image)
        async def spec(service: ServiceProvider) -> Any:
            return await self._spec(service, config, nix_dir, root)

        sandbox = await self._create_owned(spec)
        manifest = (nix_dir.parent if nix_dir.name == "nix" else nix_dir) / "manifest.json"
        if manifest.is_file():
            sandbox.bundle_manifest = str(manifest)
        return sandbox

    async def _create_owned(self, spec: Any) -> Sandbox:
        """Creates a sandbox of `spec` (a SandboxSpec, or an async function
        of the service that makes one) on the service and keeps it: its TTL
        renewed while this provider is open, deleted by `aclose`."""

        async def create(service: ServiceProvider) -> Sandbox:
            made = await spec(service) if callable(spec) else spec
            return await service.create(None, spec=made, ready_timeout=self.config.ready_timeout)

        sandbox = await self._call(create)
        self._owned.add(sandbox.sandbox_id)
        self._renew()
        return sandbox

    async def _spec(self, service: ServiceProvider, config: SandboxConfig, nix_dir: Path, root: Path):
        memory = (config.resource.memory if config.resource else None) or self.config.memory
        resource = SandboxResource(cpu=config.resource.cpu if config.resource else None, memory=memory)
        pids = None
        if self.config.pids_max is not None and self.config.pids_max != _DEFAULTS["pids_max"].default:
            pids = self.config.pids_max if await self._pids_limit_available(service) else None
        tmp_default = LocalProviderConfig.tmp_size  # the field's default (a dataclass class attribute)
        scratch = None if parse_memory(self.config.tmp_size) == parse_memory(tmp_default) else self.config.tmp_size
        # The bundle directory (the one holding nix/), resolved: one spelling
        # per bundle, so a warm pool made with that directory matches (the
        # service compares paths as given).
        bundle = nix_dir.parent if nix_dir.name == "nix" else nix_dir
        resolved = SandboxConfig(
            image="host" if str(root) == "/" else str(root), bundle=str(bundle), env=config.env, resource=resource,
        )
        return spec_from_config(
            resolved, ttl=self.config.ttl, pids=pids, scratch_bytes=scratch,
            network="host" if self.config.share_net else None,
        )

    async def _pids_limit_available(self, service: ServiceProvider) -> bool:
        """The pids cap is best effort (as in-process): sent only where the
        service's backend can enforce it, logged otherwise."""
        if self._pids_enforceable is None:
            capabilities = await service.capabilities()
            name = capabilities.default_backend
            self._pids_enforceable = any(b.pids_limit for b in capabilities.backends if b.name == name)
            if not self._pids_enforceable:
                _log.warning("pids limit not enforced: the provider service's %s backend cannot set one here", name)
        return self._pids_enforceable

    def _renew(self) -> None:
        """Keeps this provider's sandboxes' TTL ahead of now while it is open."""
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        while self._owned:
            await asyncio.sleep(self.config.ttl / 3)
            service = self._service
            if service is None:
                return
            for sandbox_id in list(self._owned):
                try:
                    await service.extend(sandbox_id, self.config.ttl)
                except KeyError:
                    self._owned.discard(sandbox_id)
                except ProviderError as error:
                    _log.warning("could not renew the TTL of sandbox %s: %s", sandbox_id, error.describe())

    # ------------------------------------------------------------ get / delete

    async def get(self, sandbox_id: SandboxId) -> SandboxInfo:
        """Where the sandbox listens and its status (any sandbox of the
        service, not only this provider's); `KeyError` for an unknown id,
        and for a deleted one (as before: the service keeps its record for a
        while, but a deleted sandbox is gone)."""
        async def get(service: ServiceProvider) -> SandboxInfo:
            record = await service.describe(sandbox_id)
            self._raise_if_deleted(service, record)
            return service.info(record)

        return await self._call(get)

    async def delete(self, sandbox_id: SandboxId) -> None:
        """Deletes the sandbox (stopping it with ``stop_grace``) and returns
        once everything it had is removed; `KeyError` for an unknown id and
        for one already deleted (as before). A sandbox that ended by itself
        (or by its TTL) is deleted without error."""
        async def delete(service: ServiceProvider) -> None:
            self._raise_if_deleted(service, await service.describe(sandbox_id))
            await asyncio.shield(service.delete(sandbox_id, grace=self.config.stop_grace))

        try:
            await self._call(delete)
        finally:
            self._owned.discard(sandbox_id)
            if not self._owned and self._renewer is not None:
                self._renewer.cancel()  # nothing left to renew
                self._renewer = None

    @staticmethod
    def _raise_if_deleted(service: ServiceProvider, record: Any) -> None:
        from agentix.provider.v1 import provider_pb2 as pb

        status = record.status
        if status.phase == pb.SandboxStatus.TERMINATED and status.exit.reason == pb.Exit.DELETED:
            raise NotFound(
                f"no sandbox {record.id!r} on the provider service at {service.address}: it was deleted",
                code="NOT_FOUND", reason="SANDBOX_NOT_FOUND",
            )

    def prune(self) -> list[str]:
        """Kept for compatibility: the provider service removes the leftovers
        of sandboxes itself (at its start and by their TTL); returns []."""
        return []

    async def deploy_bundle(
        self, bundle: Path, *, name: str | None = None, platform: str | None = None
    ) -> DeployedBundle:
        """Unpacks bundle tarball `bundle` into the cache (once per sha256) and
        returns the directory to use as `SandboxConfig.bundle`."""
        return await self._files.deploy_bundle(bundle, name=name, platform=platform)

