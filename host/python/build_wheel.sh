#!/usr/bin/env bash
# Builds the agentix wheel from a staged copy of the package (used by //host/python:wheel).
#
# Usage: build_wheel.sh OUT.whl KIND REQUIRES_PYTHON PACKAGE_DIR GEN_PACKAGE_DIR FILE...
#   KIND: "platform" (the FILEs include the native extension; tagged for the
#   building interpreter and platform) or "pure" (no extension; py3-none-any).
#   REQUIRES_PYTHON: the wheel's Requires-Python, written over pyproject.toml's
#   (the platform wheel runs only on the interpreter its extension is built for).
#   PACKAGE_DIR / GEN_PACKAGE_DIR: this package's source and generated-file roots
#   (host/python and bazel-out/.../bin/host/python); each FILE is staged at its path
#   below whichever root it lives under.
#
# Runs setuptools' PEP 517 backend with /usr/bin/python3 directly (no pip, no index,
# no build isolation). SOURCE_DATE_EPOCH and normalized file modes make the output
# byte-for-byte reproducible.
set -euo pipefail

out="$1"
kind="$2"
requires_python="$3"
src_root="$4"
gen_root="$5"
shift 5
case "$kind" in
  platform | pure) ;;
  *) echo "build_wheel.sh: KIND must be platform or pure, not '$kind'" >&2; exit 1 ;;
esac

work="$(cd "$(mktemp -d "$(dirname "$out")/wheel-build.XXXXXX")" && pwd)"
trap 'rm -rf "$work"' EXIT
stage="$work/stage"
mkdir -p "$stage" "$work/dist" "$work/home"

for file in "$@"; do
  case "$file" in
    "$gen_root"/*) rel="${file#"$gen_root"/}" ;;
    "$src_root"/*) rel="${file#"$src_root"/}" ;;
    *) echo "build_wheel.sh: $file is outside $src_root" >&2; exit 1 ;;
  esac
  if [[ "$kind" == pure && "$rel" == *.so ]]; then
    echo "build_wheel.sh: a pure wheel cannot carry $rel" >&2
    exit 1
  fi
  install -D -m 0644 "$file" "$stage/$rel"
done
# Exactly one requires-python line is rewritten, or the build fails.
if [[ "$(grep -c '^requires-python = ' "$stage/pyproject.toml")" != 1 ]]; then
  echo "build_wheel.sh: pyproject.toml must have one 'requires-python = ...' line" >&2
  exit 1
fi
sed -i "s|^requires-python = .*|requires-python = \"$requires_python\"|" "$stage/pyproject.toml"

export HOME="$work/home" TMPDIR="$work" PYTHONDONTWRITEBYTECODE=1
export SOURCE_DATE_EPOCH=315532800  # 1980-01-01, the earliest time a zip can hold
export AGENTIX_WHEEL_KIND="$kind"  # read by setup.py
if ! (cd "$stage" && /usr/bin/python3 -c '
import sys
from setuptools import build_meta
print(build_meta.build_wheel(sys.argv[1]))
' "$work/dist" >"$work/build.log" 2>&1); then
  cat "$work/build.log" >&2
  exit 1
fi

built=("$work"/dist/*.whl)
if [[ ${#built[@]} -ne 1 || "$(basename "${built[0]}")" != "$(basename "$out")" ]]; then
  echo "build_wheel.sh: expected $(basename "$out"), setuptools built: ${built[*]}" >&2
  echo "(the version in pyproject.toml and host/python/BUILD.bazel must agree, and WHEEL_TAG" >&2
  echo " there must be the tag of /usr/bin/python3 and this platform)" >&2
  exit 1
fi
mv "${built[0]}" "$out"
