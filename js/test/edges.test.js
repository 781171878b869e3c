// The core at the edges, with a fake clock: races between a refresh and
// token_expired, a 1009 close, a drain move that meets a reset, a second
// drain, an unsubscribe during a move, a rate_limited frame of a shared
// bucket, and storage after stop.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, Core, MemoryStorage, seededRandom } from "../dist/index.js";

const URLS = ["ws://a/v1/ws", "ws://b/v1/ws"];

function harness(opts = {}) {
  const log = { messages: [], states: [], errors: [], resets: [] };
  const core = new Core({ urls: URLS, token: "T", random: seededRandom(7), clientId: "cid", ...opts }, {
    message: (m) => log.messages.push(m.seq),
    state: (s) => log.states.push(s),
    error: (c) => log.errors.push(c),
    reset: (r) => log.resets.push(r),
  });
  const actions = () => core.takeActions();
  const frames = (acts) => acts.filter((a) => a.type === "send").map((a) => ({ ...JSON.parse(a.text), tid: a.id }));
  const rx = (id, f, now) => core.text(id, JSON.stringify(f), now);
  return { core, log, actions, frames, rx };
}

function connect(h, now, subs, extra = {}) {
  h.core.start(now);
  const [c] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(c.id, now);
  h.rx(c.id, { type: "welcome", node: "n1", heartbeatMs: 600000, subs, ...extra }, now);
  h.actions();
  return c.id;
}

/** drain the active connection `old` and open the move's connection; returns its id */
function beginMove(h, old, now) {
  h.rx(old, { type: "drain", afterMs: 0, reconnectTo: null, deadlineMs: 30000 }, now);
  h.core.tick(now);
  const [m] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(m.id, now);
  return m.id;
}

const msg = (conv, seq, epoch = "e1") => ({ type: "msg", conv, seq, epoch, id: `m${seq}`, sender: "s", body: {}, ts: "t" });

test("a refresh in flight when the node closes with token_expired: its token serves the next hello", () => {
  for (const fails of [false, true]) {
    const h = harness({ refreshable: true });
    h.core.subscribe("r", { watermark: 0 });
    const id = connect(h, 0, [{ conv: "r", head: 0, epoch: "e1" }], { expiresInMs: 10000 });
    h.core.tick(h.core.nextTimer());
    assert.deepEqual(h.actions(), [{ type: "token", reason: "refresh" }]); // getToken is running
    h.rx(id, { type: "error", code: "token_expired", message: "x" }, 15000);
    h.core.closed(id, 1008, "token_expired", 15001);
    h.core.tick(h.core.nextTimer()); // the reconnect is due: it needs that token
    assert.deepEqual(h.actions(), []);
    let now = 16000;
    if (fails) {
      h.core.tokenFailed(now, "down"); // then asked again, as for an expired one
      now = h.core.nextTimer();
      assert.ok(now > 16000 && now <= 17000, `${now}`);
      h.core.tick(now);
      assert.deepEqual(h.actions(), [{ type: "token", reason: "expired" }]);
      h.core.tick(now); // no timer spins meanwhile
      assert.deepEqual(h.actions(), []);
    }
    h.core.setToken("T2", now + 1);
    const [c] = h.actions();
    assert.equal(c.type, "connect", `getToken ${fails ? "failed first" : "answered"}`);
    h.core.opened(c.id, now + 2);
    assert.equal(h.frames(h.actions())[0].token, "T2");
  }
});

test("a 1009 close fails the largest send that went out on it; the others go again", () => {
  const h = harness();
  const id = connect(h, 0, []);
  const done = [];
  h.core.send("r", "small", "x", (r) => done.push(["small", r]));
  h.core.send("r", "big", "x".repeat(70000), (r) => done.push(["big", r]));
  h.actions();
  h.core.closed(id, 1009, "", 1);
  assert.deepEqual(done.map(([k, r]) => [k, r.error]), [["big", "too_large"]]);
  h.core.tick(h.core.nextTimer());
  const [c] = h.actions();
  h.core.opened(c.id, 2000);
  h.rx(c.id, { type: "welcome", node: "n1", heartbeatMs: 600000, subs: [] }, 2000);
  assert.deepEqual(h.frames(h.actions()).filter((f) => f.type === "send").map((f) => [f.tid, f.body]), [[c.id, "x"]]);
});

test("a connection the core closed does not hold up the reconnect", () => {
  const h = harness();
  const old = connect(h, 0, []);
  const m = beginMove(h, old, 1);
  h.actions(); // its hello
  h.rx(m, { type: "welcome", node: "n2", heartbeatMs: 600000, subs: [] }, 3);
  assert.deepEqual(h.actions().map((a) => [a.type, a.id]), [["close", old]]);
  h.core.closed(m, 1006, "", 4); // the new one dies before the old one's close event
  assert.equal(h.core.current, "waiting");
  assert.ok(h.core.nextTimer() > 4);
  h.core.closed(old, 1000, "moved", 5); // late: ignored
  assert.equal(h.core.current, "waiting");
});

test("a reset the old connection of a move already made is not made again", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 10, epoch: "e1" });
  const old = connect(h, 0, [{ conv: "r", head: 10, epoch: "e1" }]);
  const m = beginMove(h, old, 1);
  assert.deepEqual(h.frames(h.actions())[0].subs, [{ conv: "r", watermark: 10, epoch: "e1" }]);
  for (const s of [1, 2, 3]) h.rx(old, msg("r", s, "e2"), 3); // the history was replaced: a reset to 0
  assert.equal(h.log.resets.length, 1);
  h.rx(m, { type: "welcome", node: "n2", heartbeatMs: 600000, subs: [{ conv: "r", head: 5, epoch: "e2", reset: true }] }, 4);
  assert.equal(h.log.resets.length, 1);
  h.rx(m, msg("r", 6, "e2"), 5); // 4 and 5 missing: a sync, not a jump
  assert.deepEqual(h.frames(h.actions()).filter((f) => f.type === "sync").map((f) => [f.tid, f.watermark, f.epoch]), [[m, 3, "e2"]]);
  for (const s of [4, 5, 6]) h.rx(m, msg("r", s, "e2"), 6);
  assert.deepEqual(h.log.messages, [1, 2, 3, 4, 5, 6]);
});

test("a second drain during a move opens no second connection; it may only hurry a move not begun", () => {
  const h = harness();
  const old = connect(h, 0, []);
  h.rx(old, { type: "drain", afterMs: 5000, reconnectTo: null, deadlineMs: 30000 }, 0);
  h.rx(old, { type: "drain", afterMs: 1000, reconnectTo: null, deadlineMs: 30000 }, 10);
  assert.equal(h.core.nextTimer(), 1010);
  h.core.tick(1010);
  assert.equal(h.actions().filter((a) => a.type === "connect").length, 1);
  h.rx(old, { type: "drain", afterMs: 0, reconnectTo: "ws://y/v1/ws", deadlineMs: 10000 }, 1020);
  h.core.tick(1020);
  assert.deepEqual(h.actions(), []);
});

test("an unsubscribe during a move goes to both connections", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const old = connect(h, 0, [{ conv: "r", head: 0, epoch: "e1" }]);
  const m = beginMove(h, old, 1);
  h.actions();
  h.core.unsubscribe("r");
  assert.deepEqual(h.frames(h.actions()).map((f) => [f.tid, f.type]), [[old, "unsubscribe"], [m, "unsubscribe"]]);
  h.rx(m, { type: "welcome", node: "n2", heartbeatMs: 600000, subs: [{ conv: "r", head: 0, epoch: "e1" }] }, 3);
  h.rx(m, { type: "unsubscribed", conv: "r" }, 4); // the answer: no end told twice
  h.rx(m, msg("r", 1), 5);
  assert.deepEqual(h.log.messages, []);
});

test("rate_limited in the shared bucket: the sync and the presence read both go again", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const id = connect(h, 0, [{ conv: "r", head: 5, epoch: "e1" }]);
  h.rx(id, msg("r", 3), 1); // a gap: a sync
  const pages = [];
  h.core.presence("r", {}, (p) => pages.push(p));
  assert.deepEqual(h.frames(h.actions()).map((f) => f.type), ["sync", "presence"]);
  h.rx(id, { type: "error", code: "rate_limited", conv: "r", retryAfterMs: 100, details: { frame: "subscribe" } }, 2);
  h.core.tick(102);
  assert.deepEqual(h.frames(h.actions()).map((f) => f.type).sort(), ["presence", "sync"]);
  h.rx(id, { type: "presence", conv: "r", count: 1, members: [], cursor: null }, 103);
  assert.equal(pages.length, 1);
  assert.deepEqual(h.log.errors, []);
});

test("a listener that stops the client on connecting: no socket is opened after", () => {
  const opened = [];
  class FakeWS {
    constructor(url) {
      opened.push(url);
      this.onopen = this.onclose = this.onmessage = this.onerror = null;
    }
    send() {}
    close() {}
  }
  const c = new Client({ urls: URLS, token: "T", WebSocket: FakeWS });
  c.on("state", (s) => {
    if (s.state === "connecting") c.stop();
  });
  c.start();
  assert.deepEqual(opened, []);
});

test("storage keeps the unacknowledged sends through stop and a later unsubscribe", () => {
  class FakeWS {
    constructor() {
      this.onopen = this.onclose = this.onmessage = this.onerror = null;
    }
    send() {}
    close() {}
  }
  const kept = JSON.stringify({ clientId: "c", subs: { r: { watermark: 3, epoch: "e1" } }, sends: [{ conv: "r", id: "k1", body: 1 }] });
  const storage = new MemoryStorage();
  storage.setItem("converger-client", kept);
  const c = new Client({ urls: URLS, token: "T", WebSocket: FakeWS, storage });
  const sub = c.subscribe("r");
  assert.equal(sub.watermark, 3); // the kept watermark
  c.start();
  c.stop();
  sub.unsubscribe();
  assert.deepEqual(JSON.parse(storage.getItem("converger-client")).sends, [{ conv: "r", id: "k1", body: 1 }]);
  const s2 = new MemoryStorage();
  s2.setItem("converger-client", kept);
  new Client({ urls: URLS, token: "T", WebSocket: FakeWS, storage: s2 }).stop(); // before anything ran
  assert.deepEqual(JSON.parse(s2.getItem("converger-client")).sends, [{ conv: "r", id: "k1", body: 1 }]);
});
