"""Lists the installed distributions a venv's project needs from outside it.

Run by the bundler with the staging venv's interpreter (made with
--system-site-packages, so pip accepted dependencies that are installed on the
build machine). Walks the requirement graph from the given root distributions,
evaluating markers and extras, and prints JSON:

  {"external": [{"name", "version", "location", "files": [relative paths]}],
   "errors": ["message", ...]}

`external` are the distributions found outside the venv's site-packages; the
bundler copies their files into the venv. File lists come from RECORD or
installed-files.txt (importlib.metadata's `files`) and, for Debian's egg-info
directories that have neither, from top_level.txt.
"""

import importlib.metadata as metadata
import json
import os
import sys

from pip._vendor.packaging.requirements import InvalidRequirement, Requirement


def dist_dir(dist):
    # PathDistribution keeps the .dist-info/.egg-info path in _path; there is
    # no public accessor for it.
    return os.path.realpath(str(dist._path))


def files_of(dist, location):
    files = dist.files
    if files is not None:
        return sorted({str(f) for f in files})
    meta = os.path.relpath(dist_dir(dist), location)
    found = [meta]
    top_level = dist.read_text("top_level.txt") or ""
    names = [n.strip() for n in top_level.split() if n.strip()]
    if not names:
        return None
    entries = os.listdir(location)
    for name in names:
        hits = [e for e in entries
                if e == name or e == name + ".py"
                or (e.startswith(name + ".") and e.endswith(".so"))]
        if not hits:
            return None
        found.extend(hits)
    return sorted(found)


def main():
    site = os.path.realpath(sys.argv[1])
    roots = sys.argv[2:]
    queue = [(r, frozenset()) for r in roots]
    seen = set()
    external, errors = [], []
    while queue:
        name, extras = queue.pop()
        key = (name.lower().replace("_", "-"), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            errors.append(f"dependency '{name}' is not installed in the venv "
                          "or on the build machine")
            continue
        location = os.path.dirname(dist_dir(dist))
        if location != site and not any(e["name"] == dist.metadata["Name"]
                                        for e in external):
            files = files_of(dist, location)
            if files is None:
                errors.append(
                    f"installed distribution '{dist.metadata['Name']}' in "
                    f"{location} has no file list (RECORD, installed-files.txt "
                    "or top_level.txt); provide it as a wheel with "
                    "--wheelhouse DIR")
            else:
                external.append({"name": dist.metadata["Name"],
                                 "version": dist.version,
                                 "location": location, "files": files})
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement as exc:
                errors.append(f"{dist.metadata['Name']}: bad requirement "
                              f"{text!r}: {exc}")
                continue
            if req.marker is not None:
                envs = [{"extra": e} for e in (extras or {""})]
                if not any(req.marker.evaluate(env) for env in envs):
                    continue
            queue.append((req.name, frozenset(req.extras)))
    external.sort(key=lambda e: e["name"].lower())
    json.dump({"external": external, "errors": errors}, sys.stdout)


if __name__ == "__main__":
    main()
