"""Unpacking an OCI image layout into a root directory for the local provider.

Only what the local provider needs: pick one image manifest from ``index.json``
(by ``org.opencontainers.image.ref.name``, or the only one, or the one for this
machine's platform in a nested index), check each layer blob's sha256, and
apply the layers in order with their whiteouts. Writes follow the same rules as
bundle extraction (`agentix.provider._extract`): nothing is written through a
symlink or outside the destination. Symlink targets are left as they are — they
are resolved inside the sandbox, whose root this becomes. Device nodes and
fifos are skipped (the sandbox gets its own ``/dev``); setuid/setgid bits are
dropped, since the unpacked tree sits on the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from agentix.provider._extract import normalise_member_name, safe_join, write_member

__all__ = ["unpack_oci_layout"]

_REF_ANNOTATION = "org.opencontainers.image.ref.name"
_INDEX_TYPES = {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
_ZSTD_SUFFIX = "+zstd"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hex_digest = digest.partition(":")
    if algorithm != "sha256" or not _HEX64.fullmatch(hex_digest):
        raise RuntimeError(f"{layout}: unsupported or malformed digest {digest!r} (expected sha256:<64 hex>)")
    path = layout / "blobs" / "sha256" / hex_digest
    if not path.is_file():
        raise RuntimeError(f"{layout}: blob {digest} is missing (an incomplete OCI layout?)")
    return path


def _json_blob(layout: Path, digest: str) -> dict[str, Any]:
    return json.loads(_blob(layout, digest).read_bytes())


def _select_manifest(layout: Path, ref: str | None) -> dict[str, Any]:
    index_path = layout / "index.json"
    if not index_path.is_file():
        raise ValueError(f"{layout} is not an OCI image layout (no index.json)")
    manifests = json.loads(index_path.read_bytes()).get("manifests") or []
    if ref is not None:
        chosen = [m for m in manifests if (m.get("annotations") or {}).get(_REF_ANNOTATION) == ref]
        if not chosen:
            refs = sorted((m.get("annotations") or {}).get(_REF_ANNOTATION, "?") for m in manifests)
            raise ValueError(f"{layout}: no image tagged {ref!r}; tags in index.json: {refs}")
    else:
        chosen = manifests
        if len(chosen) != 1:
            refs = sorted((m.get("annotations") or {}).get(_REF_ANNOTATION, "?") for m in manifests)
            raise ValueError(f"{layout} holds {len(chosen)} images; name one as oci:{layout}:REF (tags: {refs})")
    descriptor = chosen[0]
    if descriptor.get("mediaType") in _INDEX_TYPES:
        nested = _json_blob(layout, descriptor["digest"]).get("manifests") or []
        matching = [
            m for m in nested
            if (m.get("platform") or {}).get("os", "linux") == "linux"
            and (m.get("platform") or {}).get("architecture") == _ARCH
        ]
        if not matching:
            raise ValueError(f"{layout}: the image has no linux/{_ARCH} variant")
        descriptor = matching[0]
    return descriptor


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _remove(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _apply_layer(layer: Path, root: Path) -> None:
    what = str(layer)
    created: set[str] = set()  # an opaque whiteout hides lower layers only
    directories: list[tuple[Path, int]] = []
    with tarfile.open(layer, "r:*") as archive:
        for member in archive:
            name = normalise_member_name(member.name, what)
            if name is None:
                continue
            parent, _, base = name.rpartition("/")
            if base == ".wh..wh..opq":
                directory = safe_join(root, f"{parent}/x" if parent else "x", what).parent
                if directory.is_dir():
                    for entry in os.listdir(directory):
                        if (f"{parent}/{entry}" if parent else entry) not in created:
                            _remove(directory / entry)
                continue
            if base.startswith(".wh."):
                hidden = f"{parent}/{base[4:]}" if parent else base[4:]
                _remove(safe_join(root, hidden, what))
                continue
            if member.ischr() or member.isblk() or member.isfifo():
                continue
            target = safe_join(root, name, what)
            write_member(archive, member, target, root, what)
            if member.isfile():
                os.chmod(target, member.mode & 0o1777)
            elif member.isdir():
                directories.append((target, member.mode & 0o1777))
            created.add(name)
    for path, mode in sorted(directories, key=lambda item: len(item[0].parts), reverse=True):
        os.chmod(path, mode | 0o700)


def unpack_oci_layout(layout: Path, ref: str | None, cache_dir: Path) -> Path:
    """Returns a root directory holding the image of OCI layout `layout`
    (optionally the one tagged `ref`), unpacked once under
    ``cache_dir/sha256-<manifest digest>`` and reused afterwards."""
    descriptor = _select_manifest(layout, ref)
    digest = descriptor.get("digest", "")
    _blob(layout, digest)  # validates the digest's form before it names a directory
    destination = cache_dir / f"sha256-{digest.partition(':')[2]}"
    if destination.is_dir():
        return destination
    manifest = _json_blob(layout, digest)
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".rootfs-", dir=cache_dir))
    try:
        for layer in manifest.get("layers") or []:
            media_type = layer.get("mediaType", "")
            if media_type.endswith(_ZSTD_SUFFIX):
                raise RuntimeError(f"{layout}: zstd layers are not supported here; re-export the image with gzip layers")
            path = _blob(layout, layer["digest"])
            if _sha256_of(path) != layer["digest"].partition(":")[2]:
                raise RuntimeError(f"{layout}: layer {layer['digest']} does not match its digest (corrupt layout)")
            _apply_layer(path, staging)
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, destination)
        except OSError:
            if not destination.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return destination
