// The sans-I/O core with a fake clock and a seeded random source: every
// rule of docs/protocol.md section 8 that the C library keeps.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Core, seededRandom, hintOf } from "../dist/index.js";

const URLS = ["ws://a/v1/ws", "ws://b/v1/ws", "ws://c/v1/ws"];

function harness(opts = {}) {
  const log = { messages: [], states: [], synced: [], errors: [] };
  const core = new Core({ urls: URLS, token: "T", random: seededRandom(5), clientId: "cid", clientName: "test", ...opts }, {
    message: (m) => log.messages.push(m.seq),
    state: (s) => log.states.push(s),
    synced: (c, h) => log.synced.push([c, h]),
    error: (c) => log.errors.push(c),
  });
  const take = () => core.takeActions();
  const frames = (actions) => actions.filter((a) => a.type === "send").map((a) => JSON.parse(a.text));
  return { core, log, take, frames };
}

const welcome = (subs, extra = {}) => JSON.stringify({ type: "welcome", node: "n1", heartbeatMs: 1000, subs, ...extra });
const msg = (conv, seq) => JSON.stringify({ type: "msg", conv, seq, id: `m${seq}`, sender: "s", body: {}, ts: "t" });

/** start, open and welcome the first connection; returns its id */
function connect(h, now = 0, subs = [{ conv: "r", head: 0, epoch: "e1" }]) {
  h.core.start(now);
  const [c] = h.take();
  assert.equal(c.type, "connect");
  h.core.opened(c.id, now);
  const [hello] = h.frames(h.take());
  assert.equal(hello.type, "hello");
  h.core.text(c.id, welcome(subs), now);
  return c.id;
}

test("hello carries the token, the clientId and every watermark", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 4, epoch: "e1" });
  h.core.subscribe("q");
  h.core.start(0);
  const [c] = h.take();
  h.core.opened(c.id, 0);
  const [hello] = h.frames(h.take());
  assert.deepEqual(hello, { type: "hello", token: "T", clientId: "cid", client: "test",
                            subs: [{ conv: "r", watermark: 4, epoch: "e1" }, { conv: "q", watermark: null }] });
});

test("every message once and in order: duplicates dropped, one sync for a gap", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const id = connect(h);
  h.core.text(id, msg("r", 1), 1);
  h.core.text(id, msg("r", 1), 2); // duplicate
  h.core.text(id, msg("r", 4), 3); // gap: 2 and 3 missing
  h.core.text(id, msg("r", 5), 4); // still in the gap: no second sync
  const syncs = h.frames(h.take()).filter((f) => f.type === "sync");
  assert.deepEqual(syncs, [{ type: "sync", conv: "r", watermark: 1, epoch: "e1" }]);
  for (const s of [2, 3, 4, 5]) h.core.text(id, msg("r", s), 5);
  h.core.text(id, JSON.stringify({ type: "synced", conv: "r", head: 5 }), 6);
  assert.deepEqual(h.log.messages, [1, 2, 3, 4, 5]);
  assert.equal(h.core.stats(0).duplicatesDropped, 1);
  assert.equal(h.core.stats(0).gapsFilled, 1);
  assert.deepEqual(h.log.synced, [["r", 5]]);
  assert.equal(h.core.watermark("r"), 5);
});

test("a subscription from the head adopts the welcome's head", () => {
  const h = harness();
  h.core.subscribe("r");
  const id = connect(h, 0, [{ conv: "r", head: 41, epoch: "e1" }]);
  assert.equal(h.core.watermark("r"), 41);
  h.core.text(id, msg("r", 42), 1);
  assert.deepEqual(h.log.messages, [42]);
});

test("reconnect: backoff in its bounds, another URL, the hint a floor, sends resent with their id", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const first = connect(h);
  const results = [];
  h.core.send("r", "k1", { text: "hi" }, (r) => results.push(r));
  const sent1 = h.frames(h.take()).filter((f) => f.type === "send");
  assert.equal(sent1.length, 1);
  h.core.text(first, msg("r", 1), 10);
  // the node closes with a hint: no attempt before it
  h.core.closed(first, 1013, '{"retryAfterMs": 3000}', 100);
  const waiting = h.log.states.at(-1);
  assert.equal(waiting.state, "waiting");
  assert.ok(waiting.delayMs >= 3000, `delay ${waiting.delayMs}`);
  assert.equal(h.core.nextTimer(), 100 + waiting.delayMs);
  h.core.tick(100 + waiting.delayMs - 1);
  assert.deepEqual(h.take(), []);
  h.core.tick(100 + waiting.delayMs);
  const [c2] = h.take();
  assert.equal(c2.type, "connect");
  assert.ok(URLS.includes(c2.url), c2.url);
  h.core.opened(c2.id, 4000);
  const [hello] = h.frames(h.take());
  assert.deepEqual(hello.subs, [{ conv: "r", watermark: 1, epoch: "e1" }]);
  h.core.text(c2.id, welcome([{ conv: "r", head: 1, epoch: "e1" }]), 4001);
  const resent = h.frames(h.take()).filter((f) => f.type === "send");
  assert.deepEqual(resent, [{ type: "send", conv: "r", id: "k1", body: { text: "hi" } }]);
  h.core.text(c2.id, JSON.stringify({ type: "sent", conv: "r", id: "k1", seq: 2 }), 4002);
  assert.deepEqual(results, [{ seq: 2, id: "k1" }]);
  assert.equal(h.core.stats(0).welcomes, 2);
});

test("a reconnect goes to another URL than the one that failed", () => {
  for (let seed = 1; seed < 30; seed++) {
    const h = harness({ random: seededRandom(seed) });
    h.core.subscribe("r");
    h.core.start(0);
    const [c] = h.take();
    h.core.closed(c.id, 1006, "", 1);
    h.core.tick(h.core.nextTimer());
    const [c2] = h.take();
    assert.notEqual(c2.url, c.url);
  }
});

test("the connect timeout and the heartbeat end a silent connection", () => {
  const h = harness({ connectTimeoutMs: 15000 });
  h.core.subscribe("r");
  h.core.start(0);
  const [c] = h.take();
  assert.equal(h.core.nextTimer(), 15000);
  h.core.tick(15000);
  const acts = h.take();
  assert.equal(acts[0].type, "close");
  assert.equal(h.log.states.at(-1).state, "waiting");
  h.core.tick(h.core.nextTimer());
  const [c2] = h.take();
  h.core.opened(c2.id, 20000);
  h.take();
  h.core.text(c2.id, welcome([{ conv: "r", head: 0 }]), 20000);
  h.take();
  // heartbeat 1000 ms: a ping after one silent interval (a browser cannot
  // see the node's WebSocket pings), dead after two; any frame keeps it
  h.core.alive(c2.id, 21500);
  h.core.tick(22499);
  assert.deepEqual(h.take(), []);
  h.core.tick(22500);
  assert.deepEqual(h.frames(h.take()), [{ type: "ping" }]);
  h.core.tick(23000);
  assert.deepEqual(h.take(), []);
  h.core.tick(23500);
  const dead = h.take();
  assert.deepEqual([dead[0].type, dead[0].reason], ["close", "heartbeat timeout"]);
  void c;
});

test("drain: the new connection after afterMs to reconnectTo, the old closed after the new welcome", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const old = connect(h);
  h.core.text(old, msg("r", 1), 1);
  h.core.text(old, JSON.stringify({ type: "drain", afterMs: 500, reconnectTo: "ws://z/v1/ws", deadlineMs: 30000 }), 10);
  assert.equal(h.core.nextTimer(), 510);
  h.core.tick(509);
  assert.deepEqual(h.take(), []);
  h.core.tick(510);
  const [c] = h.take();
  assert.deepEqual([c.type, c.url], ["connect", "ws://z/v1/ws"]);
  h.core.text(old, msg("r", 2), 520); // the old one still delivers meanwhile
  h.core.opened(c.id, 530);
  const [hello] = h.frames(h.take());
  assert.deepEqual(hello.subs, [{ conv: "r", watermark: 2, epoch: "e1" }]);
  h.core.text(c.id, welcome([{ conv: "r", head: 2, epoch: "e1" }]), 540);
  const acts = h.take();
  assert.deepEqual(acts.filter((a) => a.type === "close").map((a) => [a.id, a.code]), [[old, 1000]]);
  h.core.closed(old, 1000, "moved", 541);
  assert.equal(h.log.states.at(-1).state, "connected");
  assert.equal(h.core.stats(0).migrations, 1);
  // a later reconnect uses the URLs
  h.core.closed(c.id, 1006, "", 600);
  h.core.tick(h.core.nextTimer());
  const [c3] = h.take();
  assert.ok(URLS.includes(c3.url), c3.url);
  assert.deepEqual(h.log.messages, [1, 2]);
});

test("a wss connection never moves to ws: the drain's ws reconnectTo is refused, told, and a configured URL used", () => {
  const TLS = ["wss://a/v1/ws", "wss://b/v1/ws", "wss://c/v1/ws"];
  const h = harness({ urls: TLS });
  h.core.subscribe("r", { watermark: 0 });
  const old = connect(h);
  h.core.text(old, JSON.stringify({ type: "drain", afterMs: 10, reconnectTo: "ws://plain/v1/ws", deadlineMs: 30000 }), 1);
  assert.deepEqual(h.log.errors, ["downgrade_refused"]);
  h.take();
  h.core.tick(11);
  const [c] = h.take();
  assert.equal(c.type, "connect");
  assert.ok(TLS.includes(c.url), c.url);
  h.core.opened(c.id, 12);
  h.take();
  h.core.text(c.id, welcome([{ conv: "r", head: 0, epoch: "e1" }]), 13);
  h.take();
  // wss -> wss is followed
  h.core.text(c.id, JSON.stringify({ type: "drain", afterMs: 10, reconnectTo: "wss://other/v1/ws", deadlineMs: 30000 }), 20);
  h.core.tick(30);
  assert.equal(h.take()[0].url, "wss://other/v1/ws");
  assert.deepEqual(h.log.errors, ["downgrade_refused"]);
  // a mixed list is refused
  assert.throws(() => new Core({ urls: ["wss://a/v1/ws", "ws://b/v1/ws"], token: "T" }), /mix ws:\/\/ and wss:\/\//);
});

test("only absolute ws:// and wss:// URLs are taken: https://, http://, relative ones are refused with the reason", () => {
  // ws and browsers take https:// (and a relative URL on an https page) as
  // TLS; taken here, it would count as plaintext for the downgrade rule
  for (const u of ["https://gw/v1/ws", "http://gw/v1/ws", "HTTPS://gw/v1/ws", "ftp://gw/v1/ws", "/v1/ws", "gw/v1/ws", "ws://", ""])
    assert.throws(() => new Core({ urls: [u], token: "T" }), (e) => e instanceof TypeError && /not a WebSocket URL/.test(e.message), u);
  assert.throws(() => new Core({ urls: ["wss://a/v1/ws", "https://b/v1/ws"], token: "T" }), /not a WebSocket URL/);
});

test("the scheme in any case (RFC 3986 3.1): WSS:// and ws:// are a mix", () => {
  for (const [a, b] of [["WSS://a/v1/ws", "ws://b/v1/ws"], ["wss://a/v1/ws", "WS://b/v1/ws"], ["Wss://a/v1/ws", "wS://b/v1/ws"]])
    assert.throws(() => new Core({ urls: [a, b], token: "T" }), /mix ws:\/\/ and wss:\/\//, `${a} ${b}`);
  new Core({ urls: ["WSS://a/v1/ws", "Wss://b/v1/ws", "wss://c/v1/ws"], token: "T" });
});

/** a client on `urls`, subscribed and welcomed, drained towards `to`; returns the harness and the move's connect action */
function drainedTo(urls, to) {
  const h = harness({ urls });
  h.core.subscribe("r", { watermark: 0 });
  const old = connect(h);
  h.core.text(old, JSON.stringify({ type: "drain", afterMs: 10, reconnectTo: to, deadlineMs: 30000 }), 1);
  h.take();
  h.core.tick(11);
  const [c] = h.take();
  assert.equal(c.type, "connect");
  return { h, c };
}

test("a WSS:// or Wss:// connection never moves to ws:// or WS://: refused and told", () => {
  for (const urls of [["WSS://a/v1/ws", "WSS://b/v1/ws"], ["Wss://a/v1/ws"]])
    for (const to of ["ws://plain/v1/ws", "WS://plain/v1/ws"]) {
      const { h, c } = drainedTo(urls, to);
      assert.deepEqual(h.log.errors, ["downgrade_refused"], `${urls[0]} -> ${to}`);
      assert.ok(urls.includes(c.url), c.url);
    }
});

test("a WSS:// reconnectTo is wss: a wss connection follows it", () => {
  for (const urls of [["wss://a/v1/ws"], ["WSS://a/v1/ws"]]) {
    const { h, c } = drainedTo(urls, "WSS://other/v1/ws");
    assert.equal(c.url, "WSS://other/v1/ws");
    assert.deepEqual(h.log.errors, []);
  }
});

test("a ws client may move to wss, and from that wss connection not back to ws", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const old = connect(h);
  h.core.text(old, JSON.stringify({ type: "drain", afterMs: 10, reconnectTo: "wss://secure/v1/ws", deadlineMs: 30000 }), 1);
  h.take();
  h.core.tick(11);
  const [c] = h.take();
  assert.equal(c.url, "wss://secure/v1/ws");
  h.core.opened(c.id, 12);
  h.take();
  h.core.text(c.id, welcome([{ conv: "r", head: 0, epoch: "e1" }]), 13);
  h.take();
  h.core.text(c.id, JSON.stringify({ type: "drain", afterMs: 10, reconnectTo: "ws://plain/v1/ws", deadlineMs: 30000 }), 20);
  assert.deepEqual(h.log.errors, ["downgrade_refused"]);
  h.core.tick(30);
  const [c2] = h.take();
  assert.ok(URLS.includes(c2.url), c2.url); // its own list's
});

test("after a move, the target is the URL the client is on: the reconnect after its loss goes elsewhere", () => {
  for (let seed = 1; seed < 40; seed++) {
    const h = harness({ random: seededRandom(seed) });
    h.core.subscribe("r", { watermark: 0 });
    const old = connect(h);
    h.take();
    const to = URLS[seed % 3];
    h.core.text(old, JSON.stringify({ type: "drain", afterMs: 0, reconnectTo: to, deadlineMs: 30000 }), 1);
    h.core.tick(1);
    const [c] = h.take();
    assert.equal(c.url, to);
    h.core.opened(c.id, 2);
    h.take();
    h.core.text(c.id, welcome([{ conv: "r", head: 0, epoch: "e1" }]), 3);
    h.take();
    h.core.closed(old, 1000, "moved", 4);
    h.core.closed(c.id, 1006, "", 5); // the new node is killed
    h.core.tick(h.core.nextTimer());
    const [c2] = h.take();
    assert.equal(c2.type, "connect");
    assert.notEqual(c2.url, to, `seed ${seed}: back to the dead target first`);
  }
});

test("errors: a hint from an error frame, a refused send, an ended subscription", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  h.core.subscribe("gone", { watermark: 0 });
  const id = connect(h, 0, [{ conv: "r", head: 0 }]);
  const results = [];
  h.core.send("r", "k2", 1, (r) => results.push(r));
  assert.equal(h.frames(h.take()).filter((f) => f.type === "send").length, 1);
  h.core.text(id, JSON.stringify({ type: "error", code: "too_large", message: "x", conv: "r", details: { id: "k2" } }), 1);
  assert.deepEqual(results, [{ error: "too_large", message: "x" }]);
  h.core.text(id, JSON.stringify({ type: "error", code: "not_found", message: "x", conv: "gone" }), 2);
  h.core.text(id, JSON.stringify({ type: "error", code: "unavailable", message: "x", retryAfterMs: 7000 }), 3);
  h.core.closed(id, 1013, "", 4);
  assert.ok(h.log.states.at(-1).delayMs >= 7000);
  h.core.tick(h.core.nextTimer());
  const [c] = h.take();
  h.core.opened(c.id, 8000);
  const [hello] = h.frames(h.take());
  assert.deepEqual(hello.subs.map((s) => s.conv), ["r"]);
  assert.equal(h.core.stats(0).unavailable, 1);
  assert.deepEqual(h.log.errors, ["too_large", "not_found", "unavailable"]);
});

test("stop closes everything and fails the pending sends", () => {
  const h = harness();
  h.core.subscribe("r");
  connect(h);
  const results = [];
  h.core.send("r", "k3", 1, (r) => results.push(r));
  h.take();
  h.core.stop();
  assert.equal(h.take()[0].type, "close");
  assert.deepEqual(results, [{ error: "stopped" }]);
  assert.equal(h.log.states.at(-1).state, "stopped");
});

test("hintOf reads a close reason's retryAfterMs", () => {
  assert.equal(hintOf('{"retryAfterMs": 1500, "reason": "x"}'), 1500);
  assert.equal(hintOf("going away"), 0);
  assert.equal(hintOf("{bad json"), 0);
  assert.equal(hintOf(""), 0);
});

test("bad options are refused", () => {
  assert.throws(() => new Core({ urls: [], token: "T" }), /URL/);
  assert.throws(() => new Core({ urls: URLS, token: "" }), /token/);
});
