// converger-client in Node 20 with the `ws` package, against real
// `converger serve` processes this file starts (and stops by pid):
//
//  - a node killed with SIGKILL and started again under a subscriber and a
//    sender: every acknowledged message delivered once and in order, and
//    stats() shows the reconnect and the time offline;
//  - a drain between two PostgreSQL nodes (make-before-break);
//  - a token that expires: refreshed on the open connection by getToken,
//    and, when getToken failed until the node closed with token_expired,
//    a new token before the next hello;
//  - subscribe and unsubscribe on a live connection, presence, join and
//    leave, signals;
//  - storage: a restart of the application resumes its watermark and
//    resends what was not acknowledged, stored once.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { Client, MemoryStorage } from "../dist/index.js";
import { Postgres, inOrderOnce, mintToken, record, sleep, startNode, until } from "./support.mjs";

const nodes = [];
async function node(env) {
  const n = await startNode(env);
  nodes.push(n);
  return n;
}
after(async () => {
  for (const n of nodes.splice(0)) await n.finish();
});

/** A client with ws, a short backoff, and its states recorded. */
function client(urls, options = {}) {
  const c = new Client({ urls, WebSocket, backoff: { strategy: "decorrelated", baseMs: 100, capMs: 1000 }, ...options });
  c.states = [];
  c.errors = [];
  c.on("state", (s) => c.states.push(s));
  c.on("error", (e) => c.errors.push(e));
  return c;
}

/** Send to `conv` one message after another (each awaited, 10 ms apart)
 * until stop(); `acked` holds the seqs acknowledged so far, in order. */
function keepSending(writer, conv) {
  const acked = [];
  let sending = true;
  const loop = (async () => {
    for (let i = 0; sending; i++) {
      acked.push((await writer.send(conv, { i })).seq);
      await sleep(10);
    }
  })();
  return { acked, stop: () => ((sending = false), loop) };
}

/** Send `n` messages one after another, each awaited; returns their seqs. */
async function sendAll(c, conv, n, from = 0) {
  const seqs = [];
  for (let i = from; i < from + n; i++) {
    const { seq } = await c.send(conv, { i });
    seqs.push(seq);
    await sleep(5);
  }
  return seqs;
}

describe("against one node (SQLite)", () => {
  test("SIGKILL and a restart under a subscriber and a sender: every acknowledged message once, in order", async () => {
    const n = await node();
    const conv = await n.newConv();
    const reader = client([n.wsUrl], { token: mintToken("ann", [conv]) });
    const writer = client([n.wsUrl], { token: mintToken("bob", [conv]) });
    const got = record(reader.subscribe(conv, { watermark: 0 }));
    writer.subscribe(conv);
    reader.start();
    writer.start();
    try {
      const sender = keepSending(writer, conv);
      const acked = sender.acked;
      await until(() => acked.length >= 20, 10000, "20 acknowledged sends");
      await n.kill9();
      await sleep(300); // sends pending while the node is down
      await n.start(); // same port, same data
      await until(() => acked.length >= 60, 20000, "60 acknowledged sends after the restart");
      await sender.stop();
      const top = Math.max(...acked);
      await until(() => got.seqs.length >= top, 10000, `delivery up to ${top}`);
      await sleep(300); // nothing more (no duplicate) comes
      assert.ok(inOrderOnce(got.seqs, top), `delivered ${got.seqs.join(",")}`);
      assert.deepEqual([...acked].sort((a, b) => a - b), acked); // acknowledged in order too
      assert.equal(new Set(acked).size, acked.length); // each stored once
      assert.equal((await n.messages(conv)).length, top);
      const st = reader.stats();
      assert.ok(st.welcomes >= 2, `welcomes ${st.welcomes}`);
      assert.ok(st.attempts >= 2);
      assert.ok(st.offlineMs > 0, `offlineMs ${st.offlineMs}`);
      assert.equal(st.node, `test:${n.port}`);
      assert.ok(reader.states.some((s) => s.state === "waiting" && s.delayMs >= 0));
    } finally {
      await reader.stop();
      await writer.stop();
    }
  });

  test("token refresh by getToken on the open connection; token_expired then a new token before the hello", async () => {
    const n = await node({ CONVERGER_TOKEN_LEEWAY_MS: "0" });
    const conv = await n.newConv();
    const asked = [];
    let failing = false;
    const c = client([n.wsUrl], {
      getToken: async (why) => {
        asked.push(why);
        if (failing) throw new Error("the backend is down");
        return mintToken("ann", [conv], { ttlS: 3 });
      },
    });
    const got = record(c.subscribe(conv, { watermark: 0 }));
    const refreshed = [];
    c.on("refreshed", (ms) => refreshed.push(ms));
    c.start();
    try {
      await until(() => c.state === "connected", 5000, "connected");
      // 3 s tokens are refreshed at 2.25..2.55 s: the connection stays
      await until(() => refreshed.length >= 2, 9000, "two refreshes");
      assert.equal(c.stats().welcomes, 1);
      assert.deepEqual(asked.slice(0, 3), ["start", "refresh", "refresh"]);
      await n.must("POST", `/v1/conversations/${conv}/messages`, { sender: "bot", body: 1 });
      // getToken fails now: the token runs out, the node closes with token_expired
      failing = true;
      await until(() => c.errors.some((e) => e.code === "token_expired"), 8000, "token_expired");
      failing = false;
      await until(() => c.stats().welcomes >= 2, 10000, "a new welcome with a new token");
      assert.ok(asked.includes("expired"), asked.join(","));
      await n.must("POST", `/v1/conversations/${conv}/messages`, { sender: "bot", body: 2 });
      await until(() => got.seqs.length >= 2, 5000, "both messages");
      assert.deepEqual(got.seqs, [1, 2]);
      assert.ok(c.errors.some((e) => e.code === "token_unavailable"));
    } finally {
      await c.stop();
    }
  });

  test("subscribe and unsubscribe live, presence with join and leave, signals", async () => {
    const n = await node({ CONVERGER_PRESENCE_GRACE_MS: "300" });
    const room = await n.newConv({ presence: true, signals: true });
    const other = await n.newConv();
    const kim = client([n.wsUrl], { token: mintToken("kim", [room, other]), clientId: "kim-1" });
    const ann = client([n.wsUrl], { token: mintToken("ann", [room]), clientId: "ann-1" });
    kim.start();
    try {
      await until(() => kim.state === "connected", 5000, "kim connected with no subscription");
      const ks = kim.subscribe(room, { presenceEvents: true });
      const kr = record(ks);
      await until(() => kr.synced >= 1, 5000, "kim's subscribe answered");
      // a second conversation on the same connection, then away again
      const os = kim.subscribe(other, { watermark: 0 });
      const or = record(os);
      await n.must("POST", `/v1/conversations/${other}/messages`, { sender: "bot", body: "x" });
      await until(() => or.seqs.length === 1, 5000, "a message of the later subscription");
      os.unsubscribe();
      assert.equal(os.active, false);
      await n.must("POST", `/v1/conversations/${other}/messages`, { sender: "bot", body: "y" });
      // ann arrives: kim is told, and both are listed
      const as = ann.subscribe(room);
      const ar = record(as);
      ann.start();
      await until(() => kr.events.some(([e]) => e === "join"), 5000, "kim told of ann's join");
      assert.deepEqual(kr.events.find(([e]) => e === "join")[1], { conv: room, user: "ann", client: "ann-1" });
      const page = await ks.presence();
      assert.equal(page.count, 2);
      assert.deepEqual(page.members.map((m) => m.user), ["ann", "kim"]);
      // ann types: kim and ann get the signal; never stored
      await until(() => ar.synced >= 1, 5000, "ann synced");
      assert.equal(as.signal({ typing: true }), true);
      await until(() => kr.events.some(([e]) => e === "signal"), 5000, "the signal");
      const sig = kr.events.find(([e]) => e === "signal")[1];
      assert.deepEqual([sig.sender, sig.body], ["ann", { typing: true }]);
      assert.equal((await n.messages(room)).length, 0);
      // ann leaves: after the grace, a leave
      await ann.stop();
      await until(() => kr.events.some(([e]) => e === "leave"), 5000, "kim told of ann's leave");
      assert.equal((await ks.presence({ members: false })).count, 1);
      await sleep(200);
      assert.equal(or.seqs.length, 1, "no message of the conversation unsubscribed from");
      await assert.rejects(kim.subscribe("nope").presence(), (e) => e.code === "not_subscribed");
      const refused = kim.subscription("nope");
      assert.ok(!refused || !refused.active);
    } finally {
      await kim.stop();
      await ann.stop();
    }
  });

  test("storage: a restarted application resumes its watermark and resends what was not acknowledged", async () => {
    const n = await node();
    const conv = await n.newConv();
    const storage = new MemoryStorage();
    const tok = mintToken("ann", [conv]);
    const first = client([n.wsUrl], { token: tok, storage });
    const r1 = record(first.subscribe(conv, { watermark: 0 }));
    first.start();
    await until(() => first.state === "connected", 5000, "connected");
    await sendAll(first, conv, 3);
    await until(() => r1.seqs.length === 3, 5000, "three messages");
    await n.kill9();
    const lost = first.send(conv, { text: "while down" }, { id: "k-down" }).catch((e) => e);
    await sleep(100);
    await first.stop(); // the application ends with one send unacknowledged
    assert.equal((await lost).code, "stopped");
    await n.start();
    await n.must("POST", `/v1/conversations/${conv}/messages`, { sender: "bot", body: "meanwhile" });
    const second = client([n.wsUrl], { token: tok, storage });
    assert.equal(second.clientId, first.clientId);
    assert.deepEqual(second.pending(), [{ conv, id: "k-down", body: { text: "while down" } }]);
    const sent = [];
    second.on("sent", (s) => sent.push(s));
    const r2 = record(second.subscribe(conv, { watermark: 0 })); // the kept watermark wins
    second.start();
    try {
      await until(() => sent.length === 1, 5000, "the resend acknowledged");
      assert.equal(sent[0].id, "k-down");
      await until(() => r2.seqs.length === 2, 5000, "the two messages after the watermark");
      assert.deepEqual(r2.seqs, [4, 5]);
      const all = await n.messages(conv);
      assert.equal(all.filter((m) => m.id === "k-down").length, 1);
      assert.deepEqual(JSON.parse(storage.getItem("converger-client")).sends, []);
    } finally {
      await second.stop();
    }
  });
});

describe("across two PostgreSQL nodes", () => {
  let pg;
  before(() => {
    pg = new Postgres();
  });
  after(() => pg?.stop());

  test("a drain moves the client make-before-break; nothing lost, nothing twice", async () => {
    const env = { CONVERGER_DATABASE_URL: pg.url, CONVERGER_DRAIN_WINDOW_MS: "1000", CONVERGER_DRAIN_SHUTDOWN_MS: "8000" };
    const a = await node(env);
    const b = await node(env);
    const conv = await a.newConv();
    const reader = client([a.wsUrl], { token: mintToken("ann", [conv]) });
    const writer = client([b.wsUrl], { token: mintToken("bob", [conv]) });
    const got = record(reader.subscribe(conv, { watermark: 0 }));
    writer.subscribe(conv);
    reader.start();
    writer.start();
    try {
      await until(() => reader.stats().node === `test:${a.port}`, 5000, "the reader on a");
      const sender = keepSending(writer, conv);
      const acked = sender.acked;
      await until(() => acked.length >= 20, 10000, "20 sends");
      const offline = reader.stats().offlineMs;
      const dr = await a.request("POST", "/admin/drain", {});
      assert.ok([200, 202].includes(dr.status), dr.text);
      await until(() => reader.stats().node === `test:${b.port}`, 10000, "the reader moved to b");
      await until(() => acked.length >= 60, 10000, "60 sends");
      await sender.stop();
      const top = Math.max(...acked);
      await until(() => got.seqs.length >= top, 10000, `delivery up to ${top}`);
      await sleep(300);
      assert.ok(inOrderOnce(got.seqs, top), `delivered ${got.seqs.join(",")}`);
      const st = reader.stats();
      assert.equal(st.migrations, 1);
      assert.equal(st.welcomes, 2);
      assert.ok(reader.states.some((s) => s.reason === "drain: moving"));
      // make-before-break: not a moment without a welcomed connection
      assert.equal(st.offlineMs, offline);
    } finally {
      await reader.stop();
      await writer.stop();
    }
  });
});

