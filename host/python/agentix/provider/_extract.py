"""Hardened extraction of a bundle tarball's ``nix/`` tree.

A bundle tarball is data from elsewhere; extracting it must never write outside
the destination, whatever its members say. `extract_nix_tree` accepts only
``nix/...`` members (``./nix/...`` too), rejects absolute and ``..`` names,
never writes through a symlink or a non-directory parent, accepts hard links
only to files already extracted inside the tree, and omits (with a warning)
symlinks that would point outside ``/nix`` — Nix GC-root residue has those.

`safe_join` and `write_member` are shared with the OCI layer unpacker of the
local provider, which has looser rules for symlink *targets* (they resolve
inside the sandbox's root) but the same rules for where bytes are written.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["extract_nix_tree"]

_log = logging.getLogger(__name__)

BOOTSTRAP = Path("nix") / "runtime" / "bootstrap.sh"


def normalise_member_name(name: str, tar_path: Path | str) -> str | None:
    """``./nix/a/../b`` -> ``nix/b``; None for the archive root (``.``).
    Raises RuntimeError for absolute names and names escaping with ``..``."""
    if name.startswith("/") or "\0" in name:
        raise RuntimeError(f"{tar_path}: unsafe member {name!r} (absolute path)")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise RuntimeError(f"{tar_path}: unsafe member {name!r} (contains '..')")
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
            raise RuntimeError(f"{what}: refusing to write {relative!r}: its parent {current} is {kind}")
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
            raise RuntimeError(f"{what}: member {member.name!r} would replace a directory")
        return
    os.unlink(path)


def write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, root: Path, what: str) -> None:
    """Writes one dir / file / symlink / hard-link member at `target`
    (obtained from `safe_join`). Hard links must name a regular file already
    under `root`. Directory modes are applied by the caller afterwards."""
    _clear(target, member, what)
    if member.isdir():
        if not target.exists():
            os.mkdir(target, 0o755)
    elif member.isfile():
        source = tar.extractfile(member)
        assert source is not None
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with source, os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
        os.chmod(target, member.mode & 0o7777)
        os.utime(target, (member.mtime, member.mtime))
    elif member.issym():
        os.symlink(member.linkname, target)
    elif member.islnk():
        link = normalise_member_name(member.linkname, what)
        if link is None:
            raise RuntimeError(f"{what}: hard link {member.name!r} has an empty target")
        source_path = root / link
        real_root = os.path.realpath(root)
        real_source = os.path.realpath(source_path)
        if os.path.commonpath([real_root, real_source]) != real_root:
            raise RuntimeError(f"{what}: hard link {member.name!r} -> {member.linkname!r} leaves the tree")
        try:
            info = os.lstat(source_path)
        except FileNotFoundError:
            raise RuntimeError(
                f"{what}: hard link {member.name!r} -> {member.linkname!r} names a file not (yet) in the archive"
            ) from None
        if not stat.S_ISREG(info.st_mode):
            raise RuntimeError(f"{what}: hard link {member.name!r} -> {member.linkname!r} is not a regular file")
        os.link(source_path, target, follow_symlinks=False)
    else:
        raise RuntimeError(f"{what}: unsupported member type for {member.name!r} (only dirs, files, links)")


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
    current = root
    for part in BOOTSTRAP.parts:
        current = current / part
        try:
            info = os.lstat(current)
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            return False
    return stat.S_ISREG(info.st_mode)


def extract_nix_tree(tar: Path | str, root: Path | str, *, manifest: dict[str, Any] | None = None) -> Path:
    """Extracts the ``nix/`` tree of bundle tarball `tar` into `root` and
    returns ``root/nix``.

    Idempotent: if ``root/nix/runtime/bootstrap.sh`` exists, nothing is done.
    Otherwise the tree is extracted into a temporary sibling of `root` and
    renamed to `root` in one step, only if it holds ``nix/runtime/bootstrap.sh``
    — a failed or concurrent extraction never leaves a half tree at `root`.
    `manifest`, when given, is written to ``root/manifest.json``; the tarball's
    own ``manifest.json`` is skipped.

    Raises RuntimeError for unsafe members (absolute, ``..``, outside
    ``nix/``, writes through symlinks, dangling or escaping hard links,
    devices/fifos) and for a tarball without ``nix/runtime/bootstrap.sh``.
    """
    tar_path = Path(tar)
    root = Path(root)
    if has_bootstrap(root):
        return root / "nix"
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.extract-", dir=root.parent))
    try:
        directories: list[tuple[Path, int]] = []
        with tarfile.open(tar_path, "r:*") as archive:
            for member in archive:
                name = normalise_member_name(member.name, tar_path)
                if name is None or name == "manifest.json":
                    continue
                if name != "nix" and not name.startswith("nix/"):
                    raise RuntimeError(f"{tar_path}: non-/nix member {member.name!r} (a bundle holds only nix/...)")
                if member.issym() and not _symlink_stays_in_nix(name, member.linkname):
                    _log.warning("%s: omitting symlink %s -> %s (points outside /nix)", tar_path, name, member.linkname)
                    continue
                target = safe_join(staging, name, str(tar_path))
                write_member(archive, member, target, staging, str(tar_path))
                if member.isdir():
                    directories.append((target, member.mode & 0o7777))
        if not has_bootstrap(staging):
            raise RuntimeError(f"{tar_path}: not an agentix bundle (no {BOOTSTRAP} in the archive)")
        # Deepest first, so a read-only directory does not block its children.
        for path, mode in sorted(directories, key=lambda item: len(item[0].parts), reverse=True):
            os.chmod(path, mode | 0o700)
        if manifest is not None:
            (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, root)
        except OSError:
            if not has_bootstrap(root):  # not a concurrent extraction that won
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return root / "nix"
