"""Writes worker/driver_source.h: the driver package's sources and bytecode.

    driver_header.py OUT.h worker/driver/a.py worker/driver/b.py ...

Each file of worker/driver/ becomes a `DriverFile`: its name, its source (a
C++ raw string, for tracebacks' sake and as the fallback) and its code object
marshalled by this interpreter (Debian's /usr/bin/python3, the Python the
worker links), so the worker does not compile ~2,000 lines at every start
(20-60 ms on these VMs; `marshal.loads` takes < 1 ms). `kDriverMagic` is the
bytecode's magic number: a worker whose linked Python has another one
compiles the sources instead (worker.cc), so a mismatch costs time, never
correctness.
"""

import importlib.util
import marshal
import os
import sys

DELIMITER = ")AGXDRIVER"
BYTES_PER_LINE = 24


def code_filename(name: str) -> str:
    """The filename the driver's code objects carry (worker.cc uses the same)."""
    return f"<agentix-worker driver/{name}>"


def render(paths: list) -> str:
    """The header's text for the driver files at `paths`."""
    magic = int.from_bytes(importlib.util.MAGIC_NUMBER, "little")
    lines = [
        "// Generated from worker/driver/*.py by //worker:driver_source. Do not edit.",
        "#pragma once",
        "#include <cstddef>",
        "namespace agentix::worker {",
        "// importlib's magic number for the bytecode below (PyImport_GetMagicNumber).",
        f"inline constexpr long kDriverMagic = {magic};",
        "struct DriverFile {",
        "  const char* name;  // the file name under worker/driver/",
        "  const char* source;",
        "  const unsigned char* bytecode;  // marshal.dumps(compile(source))",
        "  size_t bytecode_size;",
        "};",
    ]
    entries = []
    for index, path in enumerate(sorted(paths)):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        if DELIMITER in source:
            sys.exit(f"{path} must not contain the raw-string delimiter {DELIMITER}")
        code = marshal.dumps(compile(source, code_filename(name), "exec",
                                     dont_inherit=True, optimize=0))
        lines.append(f"inline constexpr unsigned char kDriverBytecode{index}[] = {{")
        for start in range(0, len(code), BYTES_PER_LINE):
            lines.append("    " + ",".join(str(b) for b in code[start:start + BYTES_PER_LINE]) + ",")
        lines.append("};")
        entries.append(f'    {{"{name}", R"AGXDRIVER({source}{DELIMITER}",\n'
                       f"     kDriverBytecode{index}, sizeof(kDriverBytecode{index})}},")
    lines.append("inline constexpr DriverFile kDriverFiles[] = {")
    lines.extend(entries)
    lines.append("};")
    lines.append("}  // namespace agentix::worker")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: driver_header.py OUT.h DRIVER.py...")
    text = render(sys.argv[2:])
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
