// What the integration tests of converger-client need around it: real
// `converger serve` processes on loopback ports (SQLite in a temporary
// folder, or a PostgreSQL server from scripts/pg-tmp), the REST calls of
// docs/protocol.md section 9, and HS256 tokens signed with the test secret.
//
// Every process started here is stopped by its pid: by the test (stop,
// kill9) and, as a last resort, when this process exits.
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { createHmac, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, openSync, readFileSync, existsSync, writeFileSync } from "node:fs";
import { request as httpsRequest } from "node:https";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const BINARY = process.env.CONVERGER_BINARY || join(ROOT, "build/converger");
export const API_KEY = "test-api-key";
export const TOKEN_SECRET = "test-token-secret-of-at-least-32-bytes";

const live = new Map(); // pid -> ChildProcess
process.on("exit", () => {
  for (const p of live.values()) {
    try {
      process.kill(p.pid, "SIGKILL");
    } catch {}
  }
});

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A port nothing listens on now (the kernel's choice). */
export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

export function uid(prefix = "x") {
  return `${prefix}${randomBytes(5).toString("hex")}`;
}

const b64url = (b) => Buffer.from(b).toString("base64url");

/** An HS256 token for `sub` covering `convs`, valid for `ttlS` seconds (the node's secret here). */
export function mintToken(sub, convs, { ttlS = 3600, exp } = {}) {
  const now = Math.floor(Date.now() / 1000);
  const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const claims = b64url(JSON.stringify({ sub, convs, iat: now, exp: exp ?? now + ttlS, jti: uid("jti") }));
  const sig = createHmac("sha256", TOKEN_SECRET).update(`${head}.${claims}`).digest("base64url");
  return `${head}.${claims}.${sig}`;
}

/** Wait until `pred()` is true (polled every 20 ms), or throw after `ms`. */
export async function until(pred, ms, what = "the condition") {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return;
    await sleep(20);
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}`);
}

/** One `converger serve` on 127.0.0.1:<a free port>. */
/** A CA (ca.pem) and a certificate for localhost signed by it (srv.pem,
 * srv.key) in `dir`, made with openssl; returns their paths. */
export function makeCerts(dir) {
  const openssl = (...args) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=converger test CA");
  openssl("req", ...ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=localhost");
  writeFileSync(join(dir, "ext.cnf"), "subjectAltName=DNS:localhost\n");
  openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-out", "srv.pem", "-days", "1", "-extfile", "ext.cnf");
  return { ca: join(dir, "ca.pem"), cert: join(dir, "srv.pem"), key: join(dir, "srv.key") };
}

// Lines of a node's log that fail the test owning it (harness.py's list).
const SANITIZER_MARKERS = [
  "ERROR: AddressSanitizer",
  "ERROR: LeakSanitizer",
  "runtime error:",
  "AddressSanitizer:DEADLYSIGNAL",
  "BUG:",
];

export class Node {
  /** `env` overrides the node's environment; with CONVERGER_TLS_CERT in it,
   * the client port speaks TLS: url and wsUrl are https:// and wss://
   * localhost, REST calls trust `tls.ca`, readiness is asked of the admin
   * listener. */
  constructor(env = {}, tls = {}) {
    this.dir = mkdtempSync(join(tmpdir(), "converger-js-it-"));
    this.logPath = join(this.dir, "node.log");
    this.overrides = env;
    this.tls = env.CONVERGER_TLS_CERT ? tls : null;
    this.proc = null;
  }

  get url() {
    return this.tls ? `https://localhost:${this.port}` : `http://127.0.0.1:${this.port}`;
  }

  get wsUrl() {
    return this.tls ? `wss://localhost:${this.port}/v1/ws` : `ws://127.0.0.1:${this.port}/v1/ws`;
  }

  /** http://127.0.0.1:PORT of its admin listener (/metrics, /admin/*, /livez). */
  get adminUrl() {
    return `http://127.0.0.1:${this.adminPort}`;
  }

  async start() {
    if (!this.port) this.port = await freePort();
    if (!this.adminPort) this.adminPort = await freePort();
    const env = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith("CONVERGER_")) delete env[k];
    Object.assign(env, {
      CONVERGER_LISTEN: `127.0.0.1:${this.port}`,
      CONVERGER_DATABASE_URL: `sqlite:${this.dir}/converger.db`,
      CONVERGER_API_KEY: API_KEY,
      CONVERGER_TOKEN_SECRET: TOKEN_SECRET,
      CONVERGER_NODE_ID: `test:${this.port}`,
      CONVERGER_ADMIN_LISTEN: `127.0.0.1:${this.adminPort}`,
      CONVERGER_DRAIN_SHUTDOWN_MS: "0",
      ...this.overrides,
    });
    const log = openSync(this.logPath, "a");
    this.proc = spawn(BINARY, ["serve"], { env, stdio: ["ignore", log, log] });
    live.set(this.proc.pid, this.proc);
    const proc = this.proc;
    proc.exited = new Promise((r) => proc.on("exit", (code, sig) => {
      live.delete(proc.pid);
      r(code ?? sig);
    }));
    const end = Date.now() + 15000;
    while (Date.now() < end) {
      if (proc.exitCode !== null) throw new Error(`converger serve exited before ready:\n${this.log()}`);
      try {
        const r = await fetch(`${this.tls ? this.adminUrl : this.url}/readyz`);
        if (r.status === 200) return this;
      } catch {}
      await sleep(50);
    }
    await this.kill9();
    throw new Error(`converger serve not ready in 15 s:\n${this.log()}`);
  }

  /** SIGTERM (a drain when CONVERGER_DRAIN_SHUTDOWN_MS allows one); resolves with the exit status. */
  async stop() {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode) return;
    this.proc.kill("SIGTERM");
    const t = setTimeout(() => this.proc.kill("SIGKILL"), 20000);
    const rc = await this.proc.exited;
    clearTimeout(t);
    return rc;
  }

  async kill9() {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode) return;
    this.proc.kill("SIGKILL");
    await this.proc.exited;
  }

  /** Stop it and remove its folder; throws (failing the test that owns the
   * node) when its log has a BUG line, the node's own invariant checks
   * (a subscription moved outside its table, slots leaked at exit), or a
   * sanitizer report, as tests/integration/harness.py does. */
  async finish() {
    await this.stop();
    const log = existsSync(this.logPath) ? readFileSync(this.logPath, "utf8") : "";
    const bad = log.split("\n").filter((l) => SANITIZER_MARKERS.some((m) => l.includes(m)));
    rmSync(this.dir, { recursive: true, force: true });
    if (bad.length) throw new Error(`node test:${this.port}: BUG or sanitizer lines in its log:\n${bad.join("\n")}`);
  }

  log() {
    return existsSync(this.logPath) ? readFileSync(this.logPath, "utf8").split("\n").slice(-80).join("\n") : "";
  }

  /** A REST call: { status, body (parsed JSON or null) }. */
  async request(method, path, body, headers = {}) {
    const admin = path.startsWith("/admin/") || path === "/metrics" || path === "/livez";
    const init = {
      method,
      headers: { Authorization: `Bearer ${API_KEY}`, "Content-Type": "application/json", ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    };
    const r = this.tls && !admin ? await httpsFetch(this.url + path, init, this.tls.ca)
      : await fetch((admin ? this.adminUrl : this.url) + path, init);
    const text = await r.text();
    let js = null;
    try {
      js = text ? JSON.parse(text) : null;
    } catch {}
    return { status: r.status, body: js, text };
  }

  async must(method, path, body, headers) {
    const r = await this.request(method, path, body, headers);
    if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${r.text}`);
    return r.body;
  }

  /** A new channel and a conversation in it; returns the conversation's id. */
  async newConv({ presence = false, signals = false } = {}) {
    const ch = uid("ch");
    await this.must("POST", "/v1/channels", { id: ch, name: ch, presence, signals });
    const conv = uid("c");
    await this.must("POST", "/v1/conversations", { id: conv, channel: ch });
    return conv;
  }

  /** Every message of `conv` over REST, in seq order. */
  async messages(conv) {
    const out = [];
    for (let after = 0; ;) {
      const page = await this.must("GET", `/v1/conversations/${conv}/messages?after=${after}&limit=1000`);
      const ms = page.messages ?? [];
      out.push(...ms);
      if (ms.length === 0 || ms.at(-1).seq >= page.head) return out;
      after = ms.at(-1).seq;
    }
  }
}

/** fetch's shape over node:https, trusting the CA file `ca` (fetch takes no CA). */
function httpsFetch(url, init, ca) {
  return new Promise((res, rej) => {
    const req = httpsRequest(url, { method: init.method, headers: init.headers, ca: readFileSync(ca) }, (r) => {
      const chunks = [];
      r.on("data", (c) => chunks.push(c));
      r.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        res({ status: r.statusCode, text: async () => text });
      });
    });
    req.on("error", rej);
    if (init.body !== undefined) req.write(init.body);
    req.end();
  });
}

export async function startNode(env, tls) {
  return new Node(env, tls).start();
}

/**
 * A throwaway PostgreSQL server (scripts/pg-tmp), stopped by its watchdog if this process dies.
 * `--fast` (fsync and synchronous_commit off, not durable): these tests are about the clients'
 * semantics and never crash the database.
 */
export class Postgres {
  constructor() {
    this.dir = mkdtempSync(join(tmpdir(), "pg-js-it-"));
    this.url = this.run("start", "--owner", String(process.pid), "--fast");
  }

  run(...args) {
    const r = spawnSync(join(ROOT, "scripts/pg-tmp"), args, {
      env: { ...process.env, PG_TMP_DIR: this.dir }, encoding: "utf8", timeout: 90000,
    });
    if (r.status !== 0) throw new Error(`scripts/pg-tmp ${args.join(" ")} failed (${r.status}): ${r.stderr}`);
    return r.stdout.trim();
  }

  stop() {
    this.run("stop");
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** The package under test, as built in js/dist. */
export async function converger() {
  return import(join(ROOT, "js/dist/index.js"));
}

/**
 * A recorder of one subscription: every message's seq in delivery order,
 * and the events, for the assertions.
 */
export function record(sub) {
  const r = { seqs: [], events: [], synced: 0 };
  sub.on("message", (m) => r.seqs.push(m.seq));
  sub.on("synced", () => r.synced++);
  for (const e of ["reset", "join", "leave", "signal", "error", "unsubscribed", "subscribed"])
    sub.on(e, (v) => r.events.push([e, v]));
  return r;
}

export function inOrderOnce(seqs, top) {
  return seqs.length === top && seqs.every((s, i) => s === i + 1);
}
