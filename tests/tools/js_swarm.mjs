// js_swarm.mjs: N converger-client (js/, the JavaScript client) instances in
// one Node process, with the `ws` package as their WebSocket, driven by a
// test over stdin/stdout as tests/tools/sdk_swarm.c is
// (tests/integration/test_sharded_chaos.py).
//
// Every client gets the same URL list, the same token and one subscription
// with watermark 0: client i to the (i mod K)-th of the K --conv given. The
// whole history is replayed first, so a client must deliver 1, 2, 3, ...
// with nothing left out. Per client it checks what the application gets
// (the Subscription's "message" events): the conversation, and a seq that
// is exactly the previous one + 1 (anything else counts as a gap, or as a
// duplicate when at or below the previous one). The id of every seq of a
// conversation is kept once for all clients; another id for the same seq
// counts as a mismatch.
//
// Protocol (lines):
//   out "ready N"      every client has been welcomed once
//   in  "head CONV H"  the head of CONV; once every conversation has one,
//                      wait until every client delivered its
//                      conversation's head (at most --head-timeout s), then
//   out {...}          one JSON line of results (see result()), after which
//                      every client is stopped and the process exits: 0
//                      when it got there, 1 on a timeout (the JSON line is
//                      still printed, with "ok": false) or any failure.
// Usage errors exit 2. Anomalies go to stderr.
//
// converger-client is loaded from js/dist (scripts/js-build, which the
// build runs, writes it) and ws from js/node_modules.
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createInterface } from "node:readline";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

function usage(out) {
  out.write(
    "usage: node tests/tools/js_swarm.mjs --url WS_URL [--url ...] --conv ID [--conv ...] --token JWT\n" +
      "       [--clients N] [--ready-timeout S] [--head-timeout S]\n" +
      "N converger-client instances, client i subscribed to the (i mod K)-th conversation with\n" +
      'watermark 0; prints "ready N", reads "head ID H" for every conversation, prints one JSON line.\n',
  );
}

function parseArgs(argv) {
  const o = { urls: [], convs: [], token: null, clients: 50, readyTimeoutS: 60, headTimeoutS: 60 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--help" || a === "-h") {
      usage(process.stdout);
      process.exit(0);
    }
    const v = argv[++i];
    if (v === undefined) throw new Error(`${a}: unknown option or missing value`);
    const int = (lo, hi) => {
      const x = Number(v);
      if (!Number.isInteger(x) || x < lo || x > hi) throw new Error(`${a} wants an integer in [${lo}, ${hi}]`);
      return x;
    };
    if (a === "--url") o.urls.push(v);
    else if (a === "--conv") {
      if (o.convs.includes(v)) throw new Error(`--conv ${v} given twice`);
      o.convs.push(v);
    } else if (a === "--token") o.token = v;
    else if (a === "--clients") o.clients = int(1, 10000);
    else if (a === "--ready-timeout") o.readyTimeoutS = int(1, 3600);
    else if (a === "--head-timeout") o.headTimeoutS = int(1, 3600);
    else throw new Error(`${a}: unknown option`);
  }
  if (!o.urls.length || !o.convs.length || !o.token) throw new Error("--url, --conv and --token are required");
  return o;
}

let opt;
try {
  opt = parseArgs(process.argv.slice(2));
} catch (e) {
  process.stderr.write(`js_swarm: ${e.message} (--help)\n`);
  process.exit(2);
}

const require = createRequire(join(ROOT, "js/package.json"));
const WebSocket = require("ws");
const { Client } = await import(pathToFileURL(join(ROOT, "js/dist/index.js")).href);

const convs = new Map(opt.convs.map((id) => [id, { id, head: -1, ids: [] }]));
const clients = [];
let welcomed = 0;
let headsKnown = false;
let finishing = false;
let headTimer;

for (let i = 0; i < opt.clients; i++) {
  const conv = convs.get(opt.convs[i % opt.convs.length]);
  const c = new Client({
    urls: opt.urls,
    token: opt.token,
    WebSocket,
    clientName: "js_swarm",
  });
  const s = { i, conv, c, last: 0, delivered: 0, gaps: 0, dups: 0, wrongConv: 0, idMismatch: 0,
    errors: 0, lastError: "", welcomed: false, losses: 0, state: "idle" };
  c.on("state", (e) => {
    const prev = s.state;
    s.state = e.state;
    if (e.state === "connected" && !s.welcomed) {
      s.welcomed = true;
      if (++welcomed === opt.clients) {
        clearTimeout(readyTimer);
        process.stdout.write(`ready ${opt.clients}\n`);
      }
    } else if (s.welcomed && prev === "connected" && (e.state === "connecting" || e.state === "waiting")) {
      s.losses++;
    }
  });
  c.on("error", (e) => {
    s.errors++;
    s.lastError = e.code;
    process.stderr.write(`js_swarm: client ${i}: error ${e.code} (${e.message})${e.conv ? " conv " + e.conv : ""}\n`);
  });
  const sub = c.subscribe(conv.id, { watermark: 0 });
  sub.on("message", (m) => {
    s.delivered++;
    if (m.conv !== conv.id) {
      s.wrongConv++;
      return;
    }
    const prev = s.last;
    if (m.seq !== prev + 1) {
      if (m.seq <= prev) s.dups++;
      else s.gaps++;
      process.stderr.write(`js_swarm: client ${i} delivered seq ${m.seq} after ${prev}\n`);
    }
    if (m.seq > s.last) s.last = m.seq;
    if (conv.ids[m.seq] === undefined) conv.ids[m.seq] = m.id;
    else if (conv.ids[m.seq] !== m.id) {
      s.idMismatch++;
      process.stderr.write(`js_swarm: client ${i}: seq ${m.seq} has id ${m.id}, another client had ${conv.ids[m.seq]}\n`);
    }
    if (headsKnown && prev < conv.head && s.last >= conv.head) checkDone();
  });
  clients.push(s);
}
for (const s of clients) s.c.start();
const readyTimer = setTimeout(() => finish(false, "not every client was welcomed within --ready-timeout"),
  opt.readyTimeoutS * 1000);
process.stderr.write(`js_swarm: ${opt.clients} clients started on ${opt.urls.join(", ")}\n`);

function reached(s) {
  return s.conv.head >= 0 && s.last >= s.conv.head;
}

function checkDone() {
  if (headsKnown && clients.every(reached)) finish(true, null);
}

/** The JSON line: ok, error, clients, welcomed, reached_head, gap_clients,
 * dup_clients (must be 0), wrong_conv, id_mismatches, error_frames,
 * lost_clients (left a welcomed connection for none), sdk_duplicates and
 * sdk_gaps (stats(): dropped on the wire, filled from the store), welcomes,
 * final_nodes {node: clients}, convs [{conv, head, clients, reached_head,
 * min_last, max_last, ids (of seq 1 .. max_last)}], per_client [{i, conv,
 * last, gaps, dups, losses, welcomes, node, state, errors, last_error}]. */
function result(ok, error) {
  const sum = (f) => clients.reduce((a, s) => a + f(s), 0);
  const stats = clients.map((s) => s.c.stats());
  const finalNodes = {};
  for (const st of stats) finalNodes[st.node] = (finalNodes[st.node] || 0) + 1;
  return {
    ok, error, clients: opt.clients, welcomed,
    reached_head: sum((s) => (reached(s) ? 1 : 0)),
    gap_clients: sum((s) => (s.gaps ? 1 : 0)),
    dup_clients: sum((s) => (s.dups ? 1 : 0)),
    wrong_conv: sum((s) => s.wrongConv),
    id_mismatches: sum((s) => s.idMismatch),
    error_frames: sum((s) => s.errors),
    lost_clients: sum((s) => (s.losses ? 1 : 0)),
    sdk_duplicates: stats.reduce((a, st) => a + st.duplicatesDropped, 0),
    sdk_gaps: stats.reduce((a, st) => a + st.gapsFilled, 0),
    welcomes: stats.reduce((a, st) => a + st.welcomes, 0),
    final_nodes: finalNodes,
    convs: [...convs.values()].map((cv) => {
      const mine = clients.filter((s) => s.conv === cv);
      const lasts = mine.map((s) => s.last);
      const hi = Math.max(0, ...lasts);
      return {
        conv: cv.id, head: cv.head, clients: mine.length, reached_head: mine.filter(reached).length,
        min_last: mine.length ? Math.min(...lasts) : 0, max_last: hi,
        ids: Array.from({ length: hi }, (_, k) => cv.ids[k + 1] ?? null),
      };
    }),
    per_client: clients.map((s, k) => ({
      i: s.i, conv: s.conv.id, last: s.last, gaps: s.gaps, dups: s.dups, losses: s.losses,
      welcomes: stats[k].welcomes, node: stats[k].node, state: s.c.state, errors: s.errors, last_error: s.lastError,
    })),
  };
}

async function finish(ok, error) {
  if (finishing) return;
  finishing = true;
  clearTimeout(readyTimer);
  clearTimeout(headTimer);
  if (error) process.stderr.write(`js_swarm: ${error}\n`);
  // a pipe's write is asynchronous in Node: exit only once it is out
  await new Promise((r) => process.stdout.write(JSON.stringify(result(ok, error)) + "\n", r));
  rl.close();
  const stopped = Promise.all(clients.map((s) => s.c.stop()));
  const late = new Promise((r) => setTimeout(() => r("late"), 15000));
  if ((await Promise.race([stopped, late])) === "late") {
    process.stderr.write("js_swarm: clients did not stop within 15 s\n");
    process.exit(1);
  }
  process.exit(ok ? 0 : 1);
}

const rl = createInterface({ input: process.stdin });
rl.on("line", (l) => {
  if (finishing || l === "") return;
  const m = /^head (\S+) (\d+)$/.exec(l);
  const cv = m && convs.get(m[1]);
  if (!cv) return void finish(false, `bad input line: ${l.slice(0, 80)}`);
  if (cv.head >= 0) return void finish(false, `a second "head" line for ${cv.id}`);
  cv.head = Number(m[2]);
  if ([...convs.values()].some((c) => c.head < 0)) return;
  headsKnown = true;
  const there = clients.filter(reached).length;
  process.stderr.write(`js_swarm: heads of ${convs.size} conversation(s): ${there} of ${opt.clients} clients there already\n`);
  headTimer = setTimeout(
    () => finish(false, `${clients.filter(reached).length} of ${opt.clients} clients delivered their head within --head-timeout`),
    opt.headTimeoutS * 1000,
  );
  checkDone();
});
rl.on("close", () => {
  if (!headsKnown) finish(false, "stdin ended before every head was known");
});
