"""Hardened extraction of a bundle tarball's ``nix/`` tree.

A bundle tarball is data from elsewhere; extracting it must never write outside
the destination, whatever its members say, nor leave behind a link that leads
out of it, a privileged mode, or more bytes than a cap. `extract_nix_tree`
accepts only ``nix/...`` members (``./nix/...`` too) and refuses, with an
`UnsafeArchiveError` naming the member and the rule:

- absolute names and names with ``..``; devices, fifos and sparse files;
- a write through a symlink or a non-directory parent;
- a symlink whose target, resolved against the tree extracted so far
  (earlier symlinks included) and again against the finished tree, leaves
  ``nix/`` — except that a symlink whose own target plainly points outside
  ``/nix`` is omitted with a warning (Nix GC-root residue has those);
- a hard link to anything but a regular file already extracted in the tree,
  reached without following a symlink;
- more than `ExtractLimits.max_members` members, or more than
  `ExtractLimits.max_bytes` of uncompressed archive or of file data — checked
  before each member's data is read, so a small compressed bomb fails at once.

Modes keep only ``0o755`` (setuid, setgid, sticky and group/world write are
dropped): the tree sits on the host. The tree is built in a temporary sibling
and renamed into place only once complete and verified; the entry records the
tarball's sha256 (computed over the very bytes extracted), and an existing
directory is reused only if it carries that record.

`safe_join`, `write_member`, `check_symlinks` and `open_archive` are shared with
the OCI layer unpacker of the local provider (`agentix.provider._oci`), whose
symlinks may point anywhere inside the image root (they resolve inside the
sandbox, whose root it becomes) but never above it.
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import logging
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from collections import deque
from pathlib import Path
from typing import IO, Any, Iterator

__all__ = ["ExtractLimits", "UnsafeArchiveError", "UnsafeCacheError", "extract_nix_tree", "is_verified_entry"]

_log = logging.getLogger(__name__)

BOOTSTRAP = Path("nix") / "runtime" / "bootstrap.sh"
#: The record an extraction writes last into a cache entry: what was verified.
VERIFIED_FILE = ".agentix-verified.json"
_VERIFIED_FORMAT = 1
#: Modes kept on extracted files and directories (no setuid/setgid/sticky, no group/world write).
MODE_MASK = 0o755
#: GNU long-name and PAX headers are read into memory by tarfile: cap them.
_MAX_HEADER_BYTES = 1 << 20
_MAX_SYMLINK_HOPS = 40
_CHUNK = 1 << 20


class UnsafeArchiveError(RuntimeError):
    """An archive member broke an extraction rule. `archive`, `member` and
    `rule` name what was refused; nothing of the archive is left in place."""

    def __init__(self, archive: str, member: str | None, rule: str, detail: str = "") -> None:
        self.archive = archive
        self.member = member
        self.rule = rule
        subject = f"member {member!r}" if member is not None else "archive"
        super().__init__(f"{archive}: {subject} refused ({rule})" + (f": {detail}" if detail else ""))


class UnsafeCacheError(RuntimeError):
    """A cache directory cannot be trusted (a symlink, or not ours)."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None
    if number <= 0:
        raise ValueError(f"{name}={value!r} must be positive")
    return number


@dataclasses.dataclass(frozen=True)
class ExtractLimits:
    """Caps for one extraction (a bundle tarball, or all layers of one OCI image).

    max_bytes: cap on the uncompressed archive stream and, separately, on the
      total size of the files it holds. Default 8 GiB, or ``AGENTIX_EXTRACT_MAX_BYTES``.
    max_members: cap on the number of members. Default 1,000,000, or
      ``AGENTIX_EXTRACT_MAX_MEMBERS``.
    """

    max_bytes: int = 8 << 30
    max_members: int = 1_000_000

    @classmethod
    def from_env(cls) -> "ExtractLimits":
        return cls(
            max_bytes=_env_int("AGENTIX_EXTRACT_MAX_BYTES", cls.max_bytes),
            max_members=_env_int("AGENTIX_EXTRACT_MAX_MEMBERS", cls.max_members),
        )


class Budget:
    """Running totals of one extraction against its `ExtractLimits`."""

    def __init__(self, limits: ExtractLimits) -> None:
        self.limits = limits
        self.stream_bytes = 0  # uncompressed archive bytes read so far
        self.file_bytes = 0  # file data written so far
        self.members = 0

    def charge_member(self, archive: str, member: tarfile.TarInfo) -> None:
        """Counts `member` and, for a file, its size — before any of its data is read."""
        self.members += 1
        if member.sparse is not None:
            raise UnsafeArchiveError(archive, member.name, "sparse file", "sparse members are not supported")
        if self.members > self.limits.max_members:
            raise UnsafeArchiveError(archive, member.name, "member cap", f"more than {self.limits.max_members} members")
        if member.isfile():
            self.file_bytes += member.size
            if self.file_bytes > self.limits.max_bytes:
                raise UnsafeArchiveError(
                    archive, member.name, "size cap",
                    f"{member.size} bytes would bring the files to {self.file_bytes}, over {self.limits.max_bytes}",
                )


class _Source:
    """The raw archive file: hashes every byte handed out (and, via `drain`,
    the rest), so the digest is of exactly the bytes that were extracted."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._head = b""

    def peek_magic(self) -> bytes:
        self._head = self._handle.read(6)
        return self._head

    def read(self, size: int = -1) -> bytes:
        if self._head:
            data, self._head = self._head, b""
            if size is None or size < 0:
                data += self._handle.read()
            elif size > len(data):
                data += self._handle.read(size - len(data))
            elif size < len(data):
                data, self._head = data[:size], data[size:]
        else:
            data = self._handle.read(size)
        self.sha256.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    def seekable(self) -> bool:
        """False: the archive is read forward once (what the decompressors ask)."""
        return False

    def seek(self, offset: int) -> int:
        """Refused: a rewind would hash bytes twice."""
        raise io.UnsupportedOperation("the archive is read forward only")


class _Bounded:
    """The uncompressed stream, refused once it exceeds the budget's byte cap."""

    def __init__(self, stream: IO[bytes], budget: Budget, archive: str) -> None:
        self._stream = stream
        self._budget = budget
        self._archive = archive

    def read(self, size: int = -1) -> bytes:
        limit = self._budget.limits.max_bytes
        want = limit - self._budget.stream_bytes + 1
        data = self._stream.read(want if size is None or size < 0 else min(size, want))
        self._budget.stream_bytes += len(data)
        if self._budget.stream_bytes > limit:
            raise UnsafeArchiveError(self._archive, None, "size cap", f"uncompressed stream over {limit} bytes")
        return data


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses, before tarfile reads them, header records it would hold in
    memory whole (GNU long names, PAX headers) beyond a small cap, and sparse
    files (their maps are unbounded and they expand on disk beyond their size
    in the archive)."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        archive = str(getattr(tarfile_, "name", None) or "archive")
        if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                         tarfile.SOLARIS_XHDTYPE) and self.size > _MAX_HEADER_BYTES:
            raise UnsafeArchiveError(archive, self.name, "header cap", f"a {self.size}-byte header record")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeArchiveError(archive, self.name, "sparse file", "sparse members are not supported")
        return super()._proc_member(tarfile_)  # type: ignore[misc]

    def _proc_gnusparse_10(self, next_: Any, pax_headers: Any, tarfile_: Any) -> None:
        raise UnsafeArchiveError("archive", next_.name, "sparse file", "sparse members are not supported")


@contextlib.contextmanager
def open_archive(path: Path, budget: Budget) -> Iterator[tuple[tarfile.TarFile, _Source]]:
    """Opens tar file `path` (plain, gzip, bzip2 or xz) as a forward-only
    stream whose uncompressed bytes are charged to `budget`; the `_Source`
    gives the sha256 of the file's bytes (call `drain` first)."""
    with open(path, "rb") as handle:
        source = _Source(handle)
        magic = source.peek_magic()
        decompressor: Any
        if magic.startswith(b"\x1f\x8b"):
            decompressor = gzip.GzipFile(fileobj=source, mode="rb")
        elif magic.startswith(b"BZh"):
            decompressor = bz2.BZ2File(source, "rb")
        elif magic.startswith(b"\xfd7zXZ\x00"):
            decompressor = lzma.LZMAFile(source, "rb")  # type: ignore[arg-type]  # typeshed: IO[bytes]; it only reads
        elif magic.startswith(b"\x28\xb5\x2f\xfd"):
            raise UnsafeArchiveError(str(path), None, "compression", "zstd is not supported; use gzip")
        else:
            decompressor = source
        with decompressor if decompressor is not source else contextlib.nullcontext():
            bounded = _Bounded(decompressor, budget, str(path))
            with tarfile.open(name=str(path), fileobj=bounded, mode="r|", tarinfo=_BoundedTarInfo) as archive:  # type: ignore[arg-type]
                yield archive, source


def normalise_member_name(name: str, tar_path: Path | str) -> str | None:
    """``./nix/a/b`` -> ``nix/a/b``; None for the archive root (``.``).
    Raises UnsafeArchiveError for absolute names and names with ``..``."""
    if name.startswith("/") or "\0" in name:
        raise UnsafeArchiveError(str(tar_path), name, "absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(str(tar_path), name, "'..' in path")
    return "/".join(parts) or None


def safe_join(root: Path, relative: str, what: str) -> Path:
    """``root/relative`` after checking that every existing parent below
    `root` is a real directory (not a symlink); missing parents are created.
    `relative` is already normalised (no ``..``, not absolute)."""
    current = root
    parts = relative.split("/")
    for part in parts[:-1]:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o755)
            continue
        if not stat.S_ISDIR(info.st_mode):
            kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
            raise UnsafeArchiveError(what, relative, "write through a link", f"its parent {current} is {kind}")
    return current / parts[-1]


def _clear(path: Path, member: tarfile.TarInfo, what: str) -> None:
    """Removes what a later member replaces (tar semantics), so the write never
    follows an earlier symlink; a directory is only replaced by a directory."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        if not member.isdir():
            raise UnsafeArchiveError(what, member.name, "replaces a directory")
        return
    os.unlink(path)


@dataclasses.dataclass(frozen=True)
class LinkPolicy:
    """Where a tree's links may lead. `confine`: the root-relative directory
    every link must stay within (``nix`` for a bundle, ``""`` for an image
    root). `absolute`: the absolute path that `confine` stands for in the
    sandbox (``/nix``; ``/`` for an image root) — absolute targets outside it leave."""

    confine: str
    absolute: str


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _resolve_escape(root: Path, name: str, target: str, policy: LinkPolicy) -> str | None:
    """Resolves symlink `name` -> `target` inside `root` as the sandbox would,
    following the symlinks already in the tree. Returns why it leaves
    `policy.confine`, or None if it stays (or dead-ends) inside."""
    confine = _split(policy.confine)
    absolute = _split(policy.absolute)
    current = _split(name)[:-1]
    pending: deque[str] = deque()
    hops = 0

    def restart(link: str) -> str | None:
        nonlocal current
        if link.startswith("/"):
            parts = _split(link)
            if parts[: len(absolute)] != absolute:
                return f"absolute target {link!r} is outside {policy.absolute}"
            current = list(confine)
            pending.extendleft(reversed(parts[len(absolute):]))
        else:
            pending.extendleft(reversed(_split(link)))
        return None

    reason = restart(target)
    exists = True
    while reason is None and pending:
        part = pending.popleft()
        if part == ".":
            continue
        if part == "..":
            if len(current) <= len(confine):
                return "resolves above " + (policy.absolute if confine else "the root")
            current.pop()
            continue
        current.append(part)
        if current[: len(confine)] != confine:
            return f"resolves outside {policy.absolute}"
        if not exists:
            continue
        try:
            info = os.lstat(root.joinpath(*current))
        except (FileNotFoundError, NotADirectoryError):
            exists = False  # the rest is lexical: nothing there yet
            continue
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > _MAX_SYMLINK_HOPS:
                return "too many levels of symlinks"
            link = os.readlink(root.joinpath(*current))
            current.pop()
            reason = restart(link)
        elif not stat.S_ISDIR(info.st_mode):
            exists = False
    if reason is None and current[: len(confine)] != confine:
        return f"resolves outside {policy.absolute}"
    return reason


def check_symlinks(root: Path, policy: LinkPolicy, what: str) -> None:
    """Re-resolves every symlink of the finished tree `root` (a later member
    can change what an earlier link resolves through)."""
    for directory, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            path = os.path.join(directory, entry)
            if os.path.islink(path):
                name = os.path.relpath(path, root)
                target = os.readlink(path)
                reason = _resolve_escape(root, name, target, policy)
                if reason is not None:
                    raise UnsafeArchiveError(what, name, "symlink leaves the tree", f"-> {target!r} {reason}")


def _regular_file_in_tree(root: Path, relative: str) -> Path | None:
    """``root/relative`` if it is a regular file reached through real
    directories only (no symlink anywhere on the way), else None."""
    current = root
    parts = relative.split("/")
    for index, part in enumerate(parts):
        current = current / part
        try:
            info = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            return None
        wanted = stat.S_ISREG if index == len(parts) - 1 else stat.S_ISDIR
        if not wanted(info.st_mode):
            return None
    return current


def write_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, root: Path, what: str, policy: LinkPolicy
) -> None:
    """Writes one dir / file / symlink / hard-link member at `target`
    (obtained from `safe_join`), modes masked with `MODE_MASK`. Symlinks
    must resolve within `policy`; hard links must name a regular file already
    extracted under ``root/policy.confine``. Directory modes are applied by
    the caller afterwards. The member's size is already charged."""
    name = normalise_member_name(member.name, what) or ""
    if member.issym():
        reason = _resolve_escape(root, name, member.linkname, policy)
        if reason is not None:
            raise UnsafeArchiveError(what, member.name, "symlink leaves the tree", f"-> {member.linkname!r} {reason}")
    _clear(target, member, what)
    if member.isdir():
        if not target.exists():
            os.mkdir(target, 0o755)
    elif member.isfile():
        source = tar.extractfile(member)
        assert source is not None
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with source, os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, _CHUNK)
            os.fchmod(out.fileno(), member.mode & MODE_MASK)
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
    elif member.issym():
        os.symlink(member.linkname, target)
    elif member.islnk():
        try:
            link = normalise_member_name(member.linkname, what)
        except UnsafeArchiveError as error:
            raise UnsafeArchiveError(what, member.name, error.rule, f"hard link target {member.linkname!r}") from None
        confine = policy.confine
        if link is None or (confine and link != confine and not link.startswith(confine + "/")):
            raise UnsafeArchiveError(what, member.name, "hard link leaves the tree", f"-> {member.linkname!r}")
        source_path = _regular_file_in_tree(root, link)
        if source_path is None:
            raise UnsafeArchiveError(
                what, member.name, "hard link target",
                f"-> {member.linkname!r} is not a regular file already extracted (reached without symlinks)",
            )
        os.link(source_path, target, follow_symlinks=False)
    else:
        raise UnsafeArchiveError(what, member.name, "member type", "only directories, files and links are extracted")


def _symlink_stays_in_nix(name: str, target: str) -> bool:
    if target.startswith("/"):
        normal = posixpath.normpath(target)
        return normal == "/nix" or normal.startswith("/nix/")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return resolved == "nix" or resolved.startswith("nix/")


def has_bootstrap(root: Path) -> bool:
    """True if ``root/nix/runtime/bootstrap.sh`` is a regular file reached
    without following any symlink (a symlinked ``nix`` could point anywhere
    on the host)."""
    return _regular_file_in_tree(Path(root), str(BOOTSTRAP)) is not None


def ensure_private_dir(path: Path) -> None:
    """Creates cache directory `path` (mode 0700), or checks that an existing
    one is a real directory of ours, and takes group/world write off it (an
    entry someone else planted would not be ours, see `is_verified_entry`).
    Raises UnsafeCacheError for a symlink or a directory of another user."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeCacheError(f"cache directory {path} is not a directory (a symlink?)")
    if info.st_uid != os.geteuid():
        raise UnsafeCacheError(f"cache directory {path} belongs to uid {info.st_uid}, not to us")
    if info.st_mode & 0o022:
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o022)


def write_verified(entry: Path, record: dict[str, Any]) -> None:
    """Writes the verification record into a staged entry, last."""
    (entry / VERIFIED_FILE).write_text(json.dumps({"format": _VERIFIED_FORMAT, **record}, sort_keys=True) + "\n")


def is_verified_entry(entry: Path, key: str, digest: str | None) -> bool:
    """True if cache entry `entry` is a real directory of ours holding the
    record of a completed, verified extraction whose `key` is `digest`
    (any digest if None). A directory merely of the right name is not enough."""
    try:
        info = os.lstat(entry)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return False
        record_path = entry / VERIFIED_FILE
        if not stat.S_ISREG(os.lstat(record_path).st_mode):
            return False
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("format") != _VERIFIED_FORMAT:
        return False
    return isinstance(record.get(key), str) and (digest is None or record[key] == digest)


def install_entry(staging: Path, destination: Path, key: str, digest: str | None) -> None:
    """Renames complete, verified `staging` to `destination` in one step. An
    existing `destination` that is not a verified entry is moved aside and
    removed; one a concurrent extraction just installed is kept."""
    try:
        os.rename(staging, destination)
        return
    except OSError:
        if is_verified_entry(destination, key, digest):
            return
    if os.path.lexists(destination):
        stale = Path(tempfile.mkdtemp(prefix=f".{destination.name}.stale-", dir=destination.parent))
        os.rename(destination, stale / "entry")
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(staging, destination)


def is_verified_bundle(root: Path | str, sha256: str | None = None) -> bool:
    """True if `root` is a completed, verified bundle cache entry (of tarball `sha256`)."""
    return is_verified_entry(Path(root), "sha256", sha256) and has_bootstrap(Path(root))


_NIX_LINKS = LinkPolicy(confine="nix", absolute="/nix")
_MAX_MANIFEST_BYTES = 1 << 20


def read_manifest_member(tar: Path | str, limits: ExtractLimits | None = None) -> Any:
    """The parsed top-level ``manifest.json`` of tarball `tar`, or None if it
    has none. Read under the same caps as extraction; a manifest over 1 MiB
    is refused (UnsafeArchiveError)."""
    what = str(tar)
    budget = Budget(limits or ExtractLimits.from_env())
    with open_archive(Path(tar), budget) as (archive, _):
        for member in archive:
            budget.charge_member(what, member)
            if member.isfile() and normalise_member_name(member.name, what) == "manifest.json":
                if member.size > _MAX_MANIFEST_BYTES:
                    raise UnsafeArchiveError(what, member.name, "size cap", f"a manifest over {_MAX_MANIFEST_BYTES} bytes")
                handle = archive.extractfile(member)
                assert handle is not None
                return json.loads(handle.read())
    return None


def extract_nix_tree(
    tar: Path | str,
    root: Path | str,
    *,
    manifest: dict[str, Any] | None = None,
    expected_sha256: str | None = None,
    limits: ExtractLimits | None = None,
) -> Path:
    """Extracts the ``nix/`` tree of bundle tarball `tar` into cache entry
    `root` and returns ``root/nix``.

    Idempotent: if `root` is a verified entry (of `expected_sha256`, when
    given), nothing is done. Otherwise the tree is extracted into a
    temporary sibling of `root`, checked (holds ``nix/runtime/bootstrap.sh``,
    every symlink resolves inside ``nix/``, the sha256 of the bytes read equals
    `expected_sha256`), given its verification record and renamed to `root`
    in one step, replacing an unverified directory there. `manifest`, when
    given, is written to ``root/manifest.json``; the tarball's own
    ``manifest.json`` is skipped. `limits` default to `ExtractLimits.from_env()`.

    Raises UnsafeArchiveError for a member breaking a rule (see the module
    docstring), RuntimeError for a tarball without ``nix/runtime/bootstrap.sh``
    or whose sha256 differs from `expected_sha256`, UnsafeCacheError for a
    cache directory others can write.
    """
    tar_path = Path(tar)
    root = Path(root)
    what = str(tar_path)
    if is_verified_bundle(root, expected_sha256):
        return root / "nix"
    ensure_private_dir(root.parent)
    budget = Budget(limits or ExtractLimits.from_env())
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.extract-", dir=root.parent))
    try:
        directories: list[tuple[Path, int]] = []
        with open_archive(tar_path, budget) as (archive, source):
            for member in archive:
                budget.charge_member(what, member)
                name = normalise_member_name(member.name, what)
                if name is None or name == "manifest.json":
                    continue
                if name != "nix" and not name.startswith("nix/"):
                    raise UnsafeArchiveError(what, member.name, "outside nix/", "a bundle holds only nix/...")
                if member.issym() and not _symlink_stays_in_nix(name, member.linkname):
                    _log.warning("%s: omitting symlink %s -> %s (points outside /nix)", what, name, member.linkname)
                    continue
                target = safe_join(staging, name, what)
                write_member(archive, member, target, staging, what, _NIX_LINKS)
                if member.isdir():
                    directories.append((target, (member.mode & MODE_MASK) | 0o700))
            source.drain()
            sha256 = source.sha256.hexdigest()
        if expected_sha256 is not None and sha256 != expected_sha256:
            raise RuntimeError(f"{what}: sha256 is {sha256}, expected {expected_sha256} (changed while read?)")
        if not has_bootstrap(staging):
            raise RuntimeError(f"{what}: not an agentix bundle (no {BOOTSTRAP} in the archive)")
        check_symlinks(staging, _NIX_LINKS, what)
        # Deepest first, so a read-only directory does not block its children.
        for path, mode in sorted(directories, key=lambda item: len(item[0].parts), reverse=True):
            os.chmod(path, mode)
        if manifest is not None:
            (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        write_verified(staging, {"sha256": sha256})
        os.chmod(staging, 0o755)
        install_entry(staging, root, "sha256", expected_sha256)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return root / "nix"
