#include "bundler/bytecode_pack.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "bundler/command.h"

namespace agentix::bundler {
namespace {

// Run as `python -I -S -c kPackScript STDLIB_DIR PACK_PATH`: imports the
// modules below (in this fresh interpreter), then packs every module they
// pulled in from the stdlib whose staged .pyc checks out. Prints
// "MODULES BYTES". The modules: the worker driver's boot (logging, pickle,
// re, threading, traceback, ...), asyncio with the modules the driver defers
// until after ready (ssl, inspect, locale), and what tool modules commonly
// import (json, dataclasses, typing, pathlib, ...).
constexpr char kPackScript[] = R"PY(
import importlib.util, marshal, os, sys
stdlib_dir, out = sys.argv[1], sys.argv[2]
before = set(sys.modules)
for name in ("asyncio", "base64", "concurrent.futures", "contextvars",
             "dataclasses", "datetime", "inspect", "json", "locale",
             "logging", "pathlib", "pickle", "platform", "queue", "re",
             "ssl", "subprocess", "textwrap", "threading", "traceback",
             "typing", "uuid", "weakref"):
    __import__(name)
own = os.path.dirname(os.__file__) + "/"
entries = []
for name in sorted(sys.modules):
    origin = getattr(getattr(sys.modules[name], "__spec__", None), "origin", None)
    if not isinstance(origin, str) or not origin.startswith(own) or not origin.endswith(".py"):
        continue
    rel = origin[len(own):]
    if "/" in rel and rel.split("/")[0] in ("lib-dynload", "site-packages", "dist-packages"):
        continue
    source = os.path.join(stdlib_dir, rel)
    cached = importlib.util.cache_from_source(source)
    try:
        with open(source, "rb") as f:
            source_bytes = f.read()
        with open(cached, "rb") as f:
            pyc = f.read()
    except OSError:
        continue
    # Unchecked-hash bytecode of exactly this source: what the path finder
    # would load without looking at the source.
    if (len(pyc) < 16 or pyc[:4] != importlib.util.MAGIC_NUMBER
            or int.from_bytes(pyc[4:8], "little") != 0b01
            or pyc[8:16] != importlib.util.source_hash(source_bytes)):
        continue
    entries.append((name, rel, rel.endswith("/__init__.py"), pyc[16:]))
def index_at(base):
    index, offset = {}, base
    for name, rel, is_package, body in entries:
        index[name] = (offset, len(body), rel, is_package)
        offset += len(body)
    return marshal.dumps((importlib.util.MAGIC_NUMBER, index))
# The index's size depends on the offsets' sizes: grow the reserve until the
# data's start fits after it.
reserve = len(index_at(0)) + 64
while True:
    index = index_at(16 + reserve)
    if len(index) <= reserve:
        break
    reserve = len(index) + 64
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "wb") as f:
    f.write(b"AGXPYC1\n" + len(index).to_bytes(8, "little") + index)
    f.write(b"\0" * (reserve - len(index)))
    for entry in entries:
        f.write(entry[3])
print(len(entries), os.path.getsize(out))
)PY";

}  // namespace

absl::StatusOr<BytecodePackReport> WriteBytecodePack(
    const std::string& python, const std::string& stdlib_dir) {
  const std::string out =
      absl::StrCat(stdlib_dir, "/__pycache__/", kBytecodePackName);
  AGX_ASSIGN_OR_RETURN(
      CommandResult result,
      RunCommandOrError({python, "-I", "-S", "-c", kPackScript, stdlib_dir, out},
                        {"PYTHONHASHSEED=0"}));
  std::vector<std::string> words =
      absl::StrSplit(result.out, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  BytecodePackReport report;
  if (words.size() != 2 || !absl::SimpleAtoi(words[0], &report.modules) ||
      !absl::SimpleAtoi(words[1], &report.bytes)) {
    return absl::InternalError(absl::StrCat(
        "the bytecode pack's helper printed '", result.out, "'"));
  }
  return report;
}

}  // namespace agentix::bundler
