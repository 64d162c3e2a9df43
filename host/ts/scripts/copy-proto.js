// Copies the wire contract into the package (proto/runtime.proto) so a packed
// tarball carries it; in the repository it is read from proto/agentix/... .
const fs = require("fs");
const path = require("path");
const src = path.resolve(__dirname, "../../../proto/agentix/runtime/v1/runtime.proto");
const dst = path.resolve(__dirname, "../proto/runtime.proto");
fs.mkdirSync(path.dirname(dst), { recursive: true });
fs.copyFileSync(src, dst);
