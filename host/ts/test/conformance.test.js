// The conformance cases (testing/conformance/cases.json) for the TypeScript
// client, against the real agentix-sandboxd + agentix-worker, with
// @grpc/grpc-js's default limits (4 MiB receive). Each test is named by its
// case id; tests named "ts_*" cover what only this client has. Started by
// testing/e2e/test_ts_client.py, which passes the daemons' addresses:
//   AGENTIX_TEST_DAEMON        unix:///… of a daemon without a token
//   AGENTIX_TEST_SOCKET        its socket path (for the cutting proxy)
//   AGENTIX_TEST_TOKEN_DAEMON  a daemon started with AGENTIX_TEST_TOKEN
//   AGENTIX_TEST_TOKEN
const test = require("node:test");
const assert = require("node:assert/strict");
const net = require("node:net");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { RuntimeClient, RemoteError, DeadlineExceeded, ConnectionError } = require("../dist");

const CASES = JSON.parse(fs.readFileSync(path.resolve(__dirname, "../../../testing/conformance/cases.json"), "utf8"));
const DAEMON = process.env.AGENTIX_TEST_DAEMON;
const T = "e2e_targets::";
const MiB = 1 << 20;

function client(options = {}) {
  return new RuntimeClient(DAEMON, options);
}

/** A Unix-socket proxy to the daemon that can cut every connection at once. */
async function cuttingProxy() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "agentix-ts-proxy-"));
  const listen = path.join(dir, "proxy.sock");
  const sockets = new Set();
  const server = net.createServer((down) => {
    const up = net.connect(process.env.AGENTIX_TEST_SOCKET);
    for (const s of [down, up]) { sockets.add(s); s.on("close", () => sockets.delete(s)); s.on("error", () => {}); }
    down.pipe(up); up.pipe(down);
  });
  await new Promise((resolve) => server.listen(listen, resolve));
  return {
    url: `unix://${listen}`,
    cut() { for (const s of sockets) s.destroy(); },
    close() { this.cut(); server.close(); fs.rmSync(dir, { recursive: true, force: true }); },
  };
}

test("call_plain", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    assert.equal(await c.remote(T + "add", [2, 3]), 5);
    assert.equal(await c.remote("e2e_targets.greet", ["ts"], { kwargs: { punctuation: "?" } }), "hello ts?");
    const add = c.fn(T + "async_add");
    assert.equal(await add(40, 2), 42);
  } finally { c.close(); }
});

/** A cases.json value in JavaScript: tagged forms become bigint, Uint8Array, Date. */
function fromCase(v) {
  if (Array.isArray(v)) return v.map(fromCase);
  if (v !== null && typeof v === "object") {
    if ("$int" in v) {
      const n = BigInt(v.$int);
      return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n;
    }
    if ("$float" in v) return v.$float;
    if ("$bytes" in v) return new Uint8Array(Buffer.from(v.$bytes, "base64"));
    if ("$datetime" in v) return new Date(v.$datetime);
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, fromCase(x)]));
  }
  return v;
}

for (const c of CASES.values) {
  if ((c.not_for ?? []).includes("ts")) continue;
  test(c.id, { timeout: 60_000 }, async () => {
    const client = new RuntimeClient(DAEMON);
    try {
      const value = fromCase(c.value);
      assert.deepEqual(await client.remote(T + "echo", [value]), value);
      assert.deepEqual(await client.remote(T + "type_names", [[value]]), [c.python_type]);
    } finally { client.close(); }
  });
}

test("ts_int_mapping", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    // 64-bit ints that fit a double come back as numbers, larger ones as bigint.
    assert.equal(typeof (await c.remote(T + "echo", [2 ** 40])), "number");
    assert.equal(typeof (await c.remote(T + "echo", [2n ** 62n])), "bigint");
    assert.equal(await c.remote(T + "echo", [2n ** 40n]), 2 ** 40);
    // A whole float from Python is a number here (see value_float_whole's not_for).
    assert.equal(await c.remote(T + "add", [1.5, 0.5]), 2);
  } finally { c.close(); }
});

test("ts_call_context", { timeout: 60_000 }, async () => {
  const c = client();
  const traceHex = "4bf92f3577b34da6a3ce929d0e0e4736";
  try {
    assert.equal(await c.remote(T + "read_baggage", ["run"], { baggage: { run: "r42" } }), "r42");
    assert.equal(await c.remote(T + "read_baggage", ["run"]), "<unset>");
    assert.deepEqual(
      await c.remote(T + "open_span", [], { traceparent: `00-${traceHex}-00f067aa0ba902b7-01` }),
      { trace_id: "trace_" + traceHex, parent_id: "span_00f067aa0ba902b7" });
    await assert.rejects(c.remote(T + "add", [1, 2], { traceparent: "00-nope-01" }), (e) => {
      assert.ok(e instanceof RemoteError);
      assert.equal(e.type, "BadRequest");
      assert.match(e.message, /StartCall\.traceparent/);
      return true;
    });
    assert.equal(await c.remote(T + "add", [1, 2]), 3);
  } finally { c.close(); }
});

test("call_context", { timeout: 60_000 }, async () => {
  const c = client();
  const baggage = { run: "r42", user: "ada" };
  const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const tracestate = "agentix=00f067aa0ba902b7a1b2c3d4";
  const expected = { trace_id: "trace_4bf92f3577b34da6a3ce929d0e0e4736", parent_id: "span_00f067aa0ba902b7a1b2c3d4" };
  try {
    assert.equal(await c.remote(T + "read_baggage", ["run"], { baggage }), "r42");
    assert.equal(await c.remote(T + "read_baggage", ["run"]), "<unset>");
    assert.deepEqual(await c.remote(T + "open_span", [], { traceparent, tracestate }), expected);
    assert.deepEqual(await c.remote(T + "open_span", [], { traceparent, tracestate, baggage }), expected);
    assert.equal(await c.remote(T + "read_baggage", ["run"], { traceparent, tracestate, baggage }), "r42");
  } finally { c.close(); }
});

test("call_error", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    await assert.rejects(c.remote(T + "raise_value_error", ["boom"]), (e) => {
      assert.ok(e instanceof RemoteError);
      assert.equal(e.type, "ValueError");
      assert.match(e.message, /boom/);
      assert.match(e.traceback, /raise_value_error/);
      assert.equal(e.cancelled, false);
      return true;
    });
    // The stream keeps serving after failures.
    assert.equal(await c.remote(T + "add", [1, 1]), 2);
  } finally { c.close(); }
});

test("call_unknown_callable", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    await assert.rejects(c.remote("no_such_module::nothing", []), (e) => {
      assert.ok(e instanceof RemoteError);
      assert.match(e.message, /no_such_module/);
      return true;
    });
    assert.equal(await c.remote(T + "add", [1, 1]), 2);
  } finally { c.close(); }
});

test("concurrency_64", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const results = await Promise.all(Array.from({ length: 64 }, (_, i) => c.remote(T + "add", [i, i])));
    assert.deepEqual(results, Array.from({ length: 64 }, (_, i) => 2 * i));
  } finally { c.close(); }
});

test("results_default_limit", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    for (const size of [8 * MiB, 40 * MiB]) {
      const value = await c.remote(T + "make_bytes", [size]);
      assert.equal(value.length, size);
      assert.equal(value[size - 1], "x".charCodeAt(0));
    }
    const many = await Promise.all(Array.from({ length: 8 }, () => c.remote(T + "make_bytes", [3 * MiB])));
    for (const v of many) assert.equal(v.length, 3 * MiB);
  } finally { c.close(); }
});

test("result_64mib", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const value = await c.remote(T + "make_bytes", [64 * MiB]);
    assert.ok(value instanceof Uint8Array);
    assert.equal(value.length, 64 * MiB);
  } finally { c.close(); }
});

test("arguments_64mib", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const big = new Uint8Array(64 * MiB);
    for (let i = 0; i < big.length; i += 4096) big[i] = (i / 4096) % 251;
    const back = await c.remote(T + "echo", [big]);
    assert.equal(back.length, big.length);
    assert.ok(Buffer.compare(Buffer.from(back), Buffer.from(big)) === 0);
  } finally { c.close(); }
});

test("stream_items", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const items = [];
    for await (const item of c.remoteStream(T + "count_sync", [50], { window: 4 })) items.push(item);
    assert.deepEqual(items, Array.from({ length: 50 }, (_, i) => i * 10));
  } finally { c.close(); }
});

test("stream_early_exit", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const first = [];
    for await (const item of c.remoteStream(T + "count_async", [1_000_000], { window: 2 })) {
      first.push(item);
      if (first.length === 3) break;
    }
    assert.deepEqual(first, [0, 1, 2]);
    // The sandbox is free again (the cancelled generator is gone).
    assert.equal(await c.remote(T + "add", [2, 2]), 4);
  } finally { c.close(); }
});

test("cancel", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const controller = new AbortController();
    const started = Date.now();
    const pending = c.remote(T + "async_sleep", [30], { signal: controller.signal });
    setTimeout(() => controller.abort(), 200);
    await assert.rejects(pending, (e) => e instanceof RemoteError && e.type === "Cancelled" && e.cancelled);
    assert.ok(Date.now() - started < 10_000);
  } finally { c.close(); }
});

test("deadline", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const started = Date.now();
    await assert.rejects(c.remote(T + "async_sleep", [30], { timeoutMs: 300 }), DeadlineExceeded);
    assert.ok(Date.now() - started < 10_000);
    const info = await c.info();
    assert.equal(info.status, "ok");
  } finally { c.close(); }
});

test("logs", { timeout: 60_000 }, async () => {
  const c = client();
  const logs = c.logs();
  try {
    const token = `ts-${process.pid}-${Date.now()}`;
    assert.equal(await c.remote(T + "log_things", [token]), token);
    let warned = null;
    for await (const r of logs) {
      if (r.message === `warned ${token}`) { warned = r; break; }
    }
    assert.equal(warned.levelName, "WARNING");
    assert.equal(warned.logger, "e2e.app");
    assert.equal(warned.extras.token, token);
    assert.equal(warned.origin, "LOG_ORIGIN_LOGGING");
    assert.equal(warned.callId.length, 32);
  } finally { logs.close(); c.close(); }
});

test("spans", { timeout: 60_000 }, async () => {
  const c = client();
  const traces = c.traces();
  try {
    const token = `ts-span-${process.pid}-${Date.now()}`;
    assert.equal(await c.remote(T + "traced_work", [token]), token);
    const names = [];
    for await (const e of traces) {
      if (e.kind === "TRACE_EVENT_KIND_SPAN_END") names.push(e.name);
      if (e.kind === "TRACE_EVENT_KIND_SPAN_END" && e.name === "outer") {
        assert.equal(e.attributes.token, token);
        assert.equal(e.events[0].name, "started");
        assert.equal(e.spanId.length, 8);
        break;
      }
    }
    assert.deepEqual(names, ["inner", "failing", "outer"]);
  } finally { traces.close(); c.close(); }
});

test("log_backlog_6mib", { timeout: 120_000 }, async () => {
  const c = client();
  const n = 9_000;
  const size = 760;
  try {
    // Logged while nobody listens: the daemon buffers them (10,000 records).
    assert.equal(await c.remote(T + "log_sized", [n, size]), n);
    const logs = c.logs();
    const seqs = [];
    let bytes = 0;
    for await (const r of logs) {
      if (r.logger !== "e2e.sized") continue;
      seqs.push(Number(r.message.slice(0, 10)));
      bytes += r.message.length;
      if (seqs.length === n) break;
    }
    assert.deepEqual(seqs, Array.from({ length: n }, (_, i) => i));
    assert.ok(bytes > 6 * MiB, `backlog was ${bytes} bytes`);
  } finally { c.close(); }
});

test("resume_after_cut", { timeout: 60_000 }, async () => {
  const proxy = await cuttingProxy();
  const c = new RuntimeClient(proxy.url, { reconnect: { maxElapsedMs: 20_000 } });
  try {
    const base = 1_000_000 + (process.pid % 1000) * 100;
    const calls = Array.from({ length: 20 }, (_, i) => c.remote(T + "chaos_step", [base + i, 0.3]));
    await new Promise((r) => setTimeout(r, 100));
    proxy.cut();
    await new Promise((r) => setTimeout(r, 150));
    proxy.cut();
    const results = await Promise.all(calls);
    assert.deepEqual(results, Array.from({ length: 20 }, (_, i) => 2 * (base + i)));
    const executions = await c.remote(T + "chaos_executions", []);
    for (let i = 0; i < 20; i++) assert.equal(executions[String(base + i)], 1, `step ${base + i}`);
  } finally { c.close(); proxy.close(); }
});

test("auth", { timeout: 60_000 }, async () => {
  const address = process.env.AGENTIX_TEST_TOKEN_DAEMON;
  const bad = new RuntimeClient(address, { token: "wrong" });
  const none = new RuntimeClient(address);
  const good = new RuntimeClient(address, { token: process.env.AGENTIX_TEST_TOKEN });
  try {
    for (const c of [bad, none]) {
      await assert.rejects(c.remote(T + "add", [1, 2]), (e) => {
        assert.ok(e instanceof ConnectionError);
        assert.equal(e.name, "Unauthenticated");
        assert.equal(e.code, 16);
        return true;
      });
    }
    assert.equal(await good.remote(T + "add", [1, 2]), 3);
  } finally { bad.close(); none.close(); good.close(); }
});
