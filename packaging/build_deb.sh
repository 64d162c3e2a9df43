#!/usr/bin/env bash
# Builds agentix_<VERSION>_amd64.deb with the Debian tools (used by //packaging:deb).
#
# Usage: build_deb.sh OUT.deb VERSION --sandboxd F --worker F --providerd F
#          --bundler F --dist-closure F --wheel F --control control.in
#
# Layout (docs/PACKAGING.md):
#   /usr/lib/agentix/bin/{agentix-sandboxd,agentix-worker,agentix-providerd,bundler}
#   /usr/lib/agentix/bin/bundler.runfiles/agentix/...   what the bundler bundles, where it
#                                                       looks for it (its runfiles tree)
#   /usr/bin/agentix-{sandboxd,providerd,bundler} -> ../lib/agentix/bin/...
#   /usr/lib/python3/dist-packages/agentix{,-VERSION.dist-info}   the platform wheel, unpacked
#   /usr/bin/agentix, /usr/bin/agentix-sio-gateway                its console scripts
# Depends: dpkg-shlibdeps over every ELF file, plus the Python and tool
# packages in control.in. SOURCE_DATE_EPOCH and normalized modes and owners
# make the output reproducible.
set -euo pipefail

out="$1"
version="$2"
shift 2
declare -A in=()
while (($#)); do
  case "$1" in
    --sandboxd | --worker | --providerd | --bundler | --dist-closure | --wheel | --control)
      in["${1#--}"]="$2"
      shift 2
      ;;
    *) echo "build_deb.sh: unknown argument $1" >&2; exit 1 ;;
  esac
done
for key in sandboxd worker providerd bundler dist-closure wheel control; do
  [[ -n "${in[$key]:-}" ]] || { echo "build_deb.sh: --$key is required" >&2; exit 1; }
done

case "$(basename "${in[wheel]}")" in
  "agentix-$version-"*.whl) ;;
  *) echo "build_deb.sh: ${in[wheel]} is not agentix $version" >&2; exit 1 ;;
esac

work="$(cd "$(mktemp -d "$(dirname "$out")/deb-build.XXXXXX")" && pwd)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
lib=usr/lib/agentix/bin
site=usr/lib/python3/dist-packages
mkdir -p "$root/$lib" "$root/usr/bin" "$root/$site" "$root/DEBIAN" \
  "$root/usr/share/doc/agentix"

# The binaries, stripped as Debian policy asks.
for pair in "sandboxd:agentix-sandboxd" "worker:agentix-worker" \
  "providerd:agentix-providerd" "bundler:bundler"; do
  install -m 0755 "${in[${pair%%:*}]}" "$root/$lib/${pair#*:}"
  strip --strip-unneeded --remove-section=.comment --remove-section=.note \
    "$root/$lib/${pair#*:}"
done
ln -s ../lib/agentix/bin/agentix-sandboxd "$root/usr/bin/agentix-sandboxd"
ln -s ../lib/agentix/bin/agentix-providerd "$root/usr/bin/agentix-providerd"
# On PATH too, for `agentix doctor` (the daemon finds it beside its own real path).
ln -s ../lib/agentix/bin/agentix-worker "$root/usr/bin/agentix-worker"
ln -s ../lib/agentix/bin/bundler "$root/usr/bin/agentix-bundle"

# The bundler finds the daemon, worker, wheel and closure helper in
# <its real path>.runfiles/agentix/ (bundler/bundler_main.cc, Runfile()).
runfiles="$root/$lib/bundler.runfiles/agentix"
mkdir -p "$runfiles/sandbox" "$runfiles/worker" "$runfiles/host/python" "$runfiles/bundler"
ln -s ../../../agentix-sandboxd "$runfiles/sandbox/agentix-sandboxd"
ln -s ../../../agentix-worker "$runfiles/worker/agentix-worker"
install -m 0644 "${in[wheel]}" "$runfiles/host/python/"
install -m 0644 "${in[dist-closure]}" "$runfiles/bundler/dist_closure.py"

# The Python package for /usr/bin/python3: the wheel unpacked into
# dist-packages, as Debian's own Python packages are. RECORD and INSTALLER
# are pip's: without them pip treats the package as the system's (dpkg's).
/usr/bin/python3 - "${in[wheel]}" "$root/$site" "$root/usr/bin" <<'PY'
import configparser, io, os, sys, zipfile

wheel, site, bindir = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    for info in archive.infolist():
        name = info.filename
        if name.endswith("/") or name.endswith(".dist-info/RECORD"):
            continue
        if ".data/" in name.split("/", 1)[0] + "/":
            sys.exit(f"build_deb.sh: unexpected {name} in the wheel (no .data directory is handled)")
        target = os.path.join(site, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(archive.read(info))
        os.chmod(target, 0o644)
    dist_info = next(n.split("/")[0] for n in archive.namelist() if n.split("/")[0].endswith(".dist-info"))
    entry_points = configparser.ConfigParser(delimiters=("=",))
    entry_points.optionxform = str
    entry_points.read_string(archive.read(f"{dist_info}/entry_points.txt").decode())
with open(os.path.join(site, dist_info, "INSTALLER"), "w") as f:
    f.write("dpkg\n")
for script, target in entry_points["console_scripts"].items():
    module, _, function = target.strip().partition(":")
    path = os.path.join(bindir, script)
    with open(path, "w") as f:
        f.write(
            "#!/usr/bin/python3\n"
            f"# The {script} command of the agentix package (entry point {target.strip()}).\n"
            "import sys\n\n"
            f"from {module} import {function}\n\n"
            f"sys.exit({function}())\n"
        )
    os.chmod(path, 0o755)
PY

cat >"$root/usr/share/doc/agentix/copyright" <<'TXT'
Agentix: see the project's repository for its license.
TXT

# Depends on the shared libraries the ELF files link, found by dpkg-shlibdeps
# from the installed Debian packages' shlibs/symbols files.
mkdir -p "$work/src/debian"
printf 'Source: agentix\n\nPackage: agentix\nArchitecture: amd64\n' >"$work/src/debian/control"
elves=()
while IFS= read -r -d '' file; do
  if [[ "$(head -c 4 "$file" | od -An -c | tr -d ' ')" == "177ELF" ]]; then
    elves+=("$file")
  fi
done < <(find "$root/usr" -type f -print0 | sort -z)
shlibs="$(cd "$work/src" && dpkg-shlibdeps -O "${elves[@]}" 2>"$work/shlibdeps.log")" || {
  cat "$work/shlibdeps.log" >&2
  exit 1
}
shlibs="${shlibs#shlibs:Depends=}"
[[ -n "$shlibs" ]] || { echo "build_deb.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

installed_kb="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s|@VERSION@|$version|" -e "s|@SHLIBS@|$shlibs|" -e "s|@INSTALLED_SIZE@|$installed_kb|" \
  "${in[control]}" >"$root/DEBIAN/control"
(cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"

export SOURCE_DATE_EPOCH=315532800
find "$root" -type d -exec chmod 0755 {} +
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
dpkg-deb --root-owner-group -Zxz --build "$root" "$work/out.deb" >/dev/null
mv "$work/out.deb" "$out"
