// The TypeScript client against the real agentix-sandboxd + agentix-worker,
// with @grpc/grpc-js's default limits (4 MiB receive). Started by
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

test("a call returns its value; kwargs and typed handles work", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    assert.equal(await c.remote(T + "add", [2, 3]), 5);
    assert.equal(await c.remote("e2e_targets.greet", ["ts"], { kwargs: { punctuation: "?" } }), "hello ts?");
    const add = c.fn(T + "async_add");
    assert.equal(await add(40, 2), 42);
  } finally { c.close(); }
});

test("every mapped type round-trips through a Python echo", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const when = new Date(Date.UTC(2026, 11, 1, 12, 30, 15, 250));
    const cases = [
      null, true, false, 0, -1, 255, 2 ** 31, 2 ** 40, -(2 ** 53 - 1), 1.5, -0.25,
      2n ** 62n, -(2n ** 63n), "", "héllo ✓", new Uint8Array([0, 1, 254, 255]),
      [1, "two", [3]], { a: 1, nested: { b: [true, null] } }, when,
    ];
    for (const value of cases) {
      const back = await c.remote(T + "echo", [value]);
      assert.deepEqual(back, value, `echo(${String(value)})`);
    }
    assert.equal(typeof (await c.remote(T + "echo", [2n ** 62n])), "bigint");
    assert.equal(typeof (await c.remote(T + "echo", [2 ** 40])), "number");
    // Python's view: bytes stay bytes, str stays str, a Date is a datetime.
    assert.deepEqual(await c.remote(T + "type_names", [[new Uint8Array([1]), "s", when, 2n ** 62n, 1.5]]),
                     ["bytes", "str", "datetime", "int", "float"]);
  } finally { c.close(); }
});

test("a sandbox exception arrives as RemoteError with type, message and traceback", { timeout: 60_000 }, async () => {
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
    await assert.rejects(c.remote("no_such_module::nothing", []), (e) => e instanceof RemoteError && e.type !== "");
    // The stream keeps serving after failures.
    assert.equal(await c.remote(T + "add", [1, 1]), 2);
  } finally { c.close(); }
});

test("results of 8 and 40 MiB and eight concurrent 3 MiB results arrive with the default 4 MiB limit", { timeout: 60_000 }, async () => {
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

test("64 MiB arguments go up in pieces and come back intact", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const big = new Uint8Array(64 * MiB);
    for (let i = 0; i < big.length; i += 4096) big[i] = (i / 4096) % 251;
    const back = await c.remote(T + "echo", [big]);
    assert.equal(back.length, big.length);
    assert.ok(Buffer.compare(Buffer.from(back), Buffer.from(big)) === 0);
  } finally { c.close(); }
});

test("streaming yields items in order, and leaving the loop cancels the call", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const items = [];
    for await (const item of c.remoteStream(T + "count_sync", [50], { window: 4 })) items.push(item);
    assert.deepEqual(items, Array.from({ length: 50 }, (_, i) => i * 10));
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

test("cancel with an AbortSignal, and a deadline, stop the call in the sandbox", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const controller = new AbortController();
    const started = Date.now();
    const pending = c.remote(T + "async_sleep", [30], { signal: controller.signal });
    setTimeout(() => controller.abort(), 200);
    await assert.rejects(pending, (e) => e instanceof RemoteError && e.type === "Cancelled" && e.cancelled);
    await assert.rejects(c.remote(T + "async_sleep", [30], { timeoutMs: 300 }), DeadlineExceeded);
    assert.ok(Date.now() - started < 10_000);
    const info = await c.info();
    assert.equal(info.status, "ok");
  } finally { c.close(); }
});

test("log records and spans of a call reach the subscription", { timeout: 60_000 }, async () => {
  const c = client();
  const logs = c.logs();
  const traces = c.traces();
  try {
    const token = `ts-${process.pid}-${Date.now()}`;
    assert.equal(await c.remote(T + "log_things", [token]), token);
    assert.equal(await c.remote(T + "traced_work", [token]), token);
    let warned = null;
    for await (const r of logs) {
      if (r.message === `warned ${token}`) { warned = r; break; }
    }
    assert.equal(warned.levelName, "WARNING");
    assert.equal(warned.logger, "e2e.app");
    assert.equal(warned.extras.token, token);
    assert.equal(warned.origin, "LOG_ORIGIN_LOGGING");
    assert.equal(warned.callId.length, 32);
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
  } finally { logs.close(); traces.close(); c.close(); }
});

test("a 6 MiB log backlog reaches a subscriber with the default 4 MiB limit", { timeout: 60_000 }, async () => {
  const c = client();
  try {
    const n = 60_000;  // ~100 bytes each
    const before = await c.remote(T + "log_many", [n]);
    assert.equal(before, n);
    const logs = c.logs();
    let seen = 0;
    let bytes = 0;
    for await (const r of logs) {
      if (r.logger !== "e2e.many") continue;
      seen++;
      bytes += r.message.length + r.logger.length + r.file.length + r.function.length + 40;
      if (seen === n) break;
    }
    assert.equal(seen, n);
    assert.ok(bytes > 6 * MiB, `backlog was ${bytes} bytes`);
  } finally { c.close(); }
});

test("calls survive a cut connection: each runs once and its result arrives once", { timeout: 60_000 }, async () => {
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

test("a wrong or missing token is Unauthenticated; the right one works", { timeout: 60_000 }, async () => {
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
