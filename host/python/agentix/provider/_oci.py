"""Unpacking an OCI image layout into a root directory for the local provider.

Only what the local provider needs: pick one image manifest from ``index.json``
(by ``org.opencontainers.image.ref.name``, or the only one, or the one for this
machine's platform in a nested index) and apply its layers in order with their
whiteouts.

Content-addressed, and verified before use: every blob read — a nested
index, the manifest, the config and each layer — must have the size and the
sha256 its descriptor names, or `ImageDigestError` names the mismatch. The
unpacked root is cached under the manifest digest only once that digest is
verified (so a layout whose ``index.json`` claims another image's digest is
refused and never touches that image's cache entry), built in a temporary
directory and renamed into place with its verification record; an entry
without that record is rebuilt. A layer is hashed as it is extracted (one
read, so it cannot change between check and use).

Writes follow the same rules as bundle extraction (`agentix.provider._extract`):
nothing is written through a symlink or outside the destination, modes keep
only ``0o755``, and the caps of `ExtractLimits` apply to the image's layers
together. Symlink targets are kept as they are — they resolve inside the
sandbox, whose root this becomes — but one that resolves above the root
(through ``..``, following the links already unpacked) is refused. Device nodes
and fifos are skipped (the sandbox gets its own ``/dev``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from agentix.provider._extract import (
    MODE_MASK,
    Budget,
    ExtractLimits,
    LinkPolicy,
    check_symlinks,
    ensure_private_dir,
    install_entry,
    is_verified_entry,
    normalise_member_name,
    open_archive,
    safe_join,
    write_member,
    write_verified,
)

__all__ = ["ImageDigestError", "unpack_oci_layout"]

_REF_ANNOTATION = "org.opencontainers.image.ref.name"
_INDEX_TYPES = {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
_ZSTD_SUFFIX = "+zstd"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
#: index.json, manifests, indexes and configs are read whole: cap them.
_MAX_JSON_BYTES = 16 << 20
_ROOT_LINKS = LinkPolicy(confine="", absolute="/")


class ImageDigestError(RuntimeError):
    """A blob of an OCI layout does not match its descriptor (digest or size)."""


def _blob(layout: Path, digest: str) -> Path:
    if not isinstance(digest, str):
        raise ImageDigestError(f"{layout}: malformed digest {digest!r} (expected sha256:<64 hex>)")
    algorithm, _, hex_digest = digest.partition(":")
    if algorithm != "sha256" or not _HEX64.fullmatch(hex_digest):
        raise ImageDigestError(f"{layout}: unsupported or malformed digest {digest!r} (expected sha256:<64 hex>)")
    path = layout / "blobs" / "sha256" / hex_digest
    if not path.is_file():
        raise RuntimeError(f"{layout}: blob {digest} is missing (an incomplete OCI layout?)")
    return path


def _descriptor_size(layout: Path, descriptor: dict[str, Any], what: str) -> int:
    size = descriptor.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImageDigestError(f"{layout}: {what} descriptor has no valid size ({size!r})")
    return size


def _verified_json(layout: Path, descriptor: dict[str, Any], what: str) -> dict[str, Any]:
    """The JSON blob `descriptor` names, after checking its size and sha256."""
    digest = descriptor.get("digest")
    path = _blob(layout, digest)  # type: ignore[arg-type]
    size = _descriptor_size(layout, descriptor, what)
    if size > _MAX_JSON_BYTES:
        raise ImageDigestError(f"{layout}: {what} {digest} claims {size} bytes (over {_MAX_JSON_BYTES})")
    with open(path, "rb") as handle:
        data = handle.read(_MAX_JSON_BYTES + 1)
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if len(data) != size or actual != digest:
        raise ImageDigestError(
            f"{layout}: {what} blob does not match its descriptor: descriptor says {digest} ({size} bytes), "
            f"the blob is {actual} ({len(data)} bytes)"
        )
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"{layout}: {what} {digest} is not a JSON object")
    return value


def _select_manifest(layout: Path, ref: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chosen manifest descriptor and the verified manifest it names."""
    index_path = layout / "index.json"
    if not index_path.is_file():
        raise ValueError(f"{layout} is not an OCI image layout (no index.json)")
    with open(index_path, "rb") as handle:
        index = json.loads(handle.read(_MAX_JSON_BYTES + 1))
    manifests = [m for m in (index.get("manifests") or []) if isinstance(m, dict)]
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
        nested = _verified_json(layout, descriptor, "image index").get("manifests") or []
        matching = [
            m for m in nested
            if isinstance(m, dict)
            and (m.get("platform") or {}).get("os", "linux") == "linux"
            and (m.get("platform") or {}).get("architecture") == _ARCH
        ]
        if not matching:
            raise ValueError(f"{layout}: the image has no linux/{_ARCH} variant")
        descriptor = matching[0]
    return descriptor, _verified_json(layout, descriptor, "manifest")


def _remove(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _apply_layer(layer: Path, root: Path, budget: Budget | None = None) -> str:
    """Applies layer tarball `layer` to `root`; returns the sha256 (hex) of
    the layer's bytes, hashed as they were read."""
    what = str(layer)
    budget = budget or Budget(ExtractLimits.from_env())
    created: set[str] = set()  # an opaque whiteout hides lower layers only
    directories: list[tuple[Path, int]] = []
    with open_archive(layer, budget) as (archive, source):
        for member in archive:
            budget.charge_member(what, member)
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
            write_member(archive, member, target, root, what, _ROOT_LINKS)
            if member.isdir():
                directories.append((target, (member.mode & MODE_MASK) | 0o700))
            created.add(name)
        source.drain()
    for path, mode in sorted(directories, key=lambda item: len(item[0].parts), reverse=True):
        os.chmod(path, mode)
    return source.sha256.hexdigest()


def unpack_oci_layout(layout: Path, ref: str | None, cache_dir: Path, *, limits: ExtractLimits | None = None) -> Path:
    """Returns a root directory holding the image of OCI layout `layout`
    (optionally the one tagged `ref`), unpacked once under
    ``cache_dir/sha256-<manifest digest>/rootfs`` and reused afterwards.

    Raises ImageDigestError when a blob does not match its descriptor,
    `agentix.provider._extract.UnsafeArchiveError` for a layer member that
    breaks an extraction rule or a cap of `limits` (default
    `ExtractLimits.from_env()`, for all layers together)."""
    descriptor, manifest = _select_manifest(layout, ref)
    digest = descriptor["digest"]  # verified: the manifest's bytes hash to it
    entry = cache_dir / f"sha256-{digest.partition(':')[2]}"
    if is_verified_entry(entry, "manifest", digest):
        return entry / "rootfs"
    config = manifest.get("config")
    if isinstance(config, dict):
        _verified_json(layout, config, "config")
    layers = manifest.get("layers") or []
    for layer in layers:
        if not isinstance(layer, dict):
            raise ValueError(f"{layout}: manifest {digest} has a malformed layer descriptor")
        if str(layer.get("mediaType", "")).endswith(_ZSTD_SUFFIX):
            raise RuntimeError(f"{layout}: zstd layers are not supported here; re-export the image with gzip layers")
        path = _blob(layout, layer.get("digest"))  # type: ignore[arg-type]
        size = _descriptor_size(layout, layer, "layer")
        if os.stat(path).st_size != size:
            raise ImageDigestError(
                f"{layout}: layer blob {layer['digest']} is {os.stat(path).st_size} bytes, its descriptor says {size}"
            )
    ensure_private_dir(cache_dir)
    budget = Budget(limits or ExtractLimits.from_env())
    staging = Path(tempfile.mkdtemp(prefix=".rootfs-", dir=cache_dir))
    try:
        rootfs = staging / "rootfs"
        os.mkdir(rootfs, 0o755)
        for layer in layers:
            actual = _apply_layer(_blob(layout, layer["digest"]), rootfs, budget)
            if f"sha256:{actual}" != layer["digest"]:
                raise ImageDigestError(
                    f"{layout}: layer blob does not match its descriptor: descriptor says {layer['digest']}, "
                    f"the blob is sha256:{actual}"
                )
        check_symlinks(rootfs, _ROOT_LINKS, str(layout))
        write_verified(staging, {"manifest": digest, "layers": [layer["digest"] for layer in layers]})
        os.chmod(staging, 0o755)
        install_entry(staging, entry, "manifest", digest)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return entry / "rootfs"
