// The sans-I/O core on a live connection (protocol 1.1 and 1.2) with a fake
// clock: subscribe and unsubscribe, resets, token refresh timing, refused
// frames tried again after the hint, presence and signals, the snapshot
// that storage keeps, and a drain move that fails.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Core, seededRandom } from "../dist/index.js";

const URLS = ["ws://a/v1/ws", "ws://b/v1/ws"];

function harness(opts = {}) {
  const log = { messages: [], states: [], errors: [], resets: [], subscribed: [], unsubscribed: [], joins: [],
                leaves: [], signals: [], refreshed: [] };
  const core = new Core({ urls: URLS, token: "T", random: seededRandom(7), clientId: "cid", ...opts }, {
    message: (m) => log.messages.push(`${m.conv}:${m.seq}`),
    state: (s) => log.states.push(s),
    error: (c, _m, conv) => log.errors.push(conv ? `${c}:${conv}` : c),
    reset: (r) => log.resets.push(r),
    subscribed: (s) => log.subscribed.push(s.conv),
    unsubscribed: (c, why) => log.unsubscribed.push(`${c}:${why}`),
    join: (p) => log.joins.push(`${p.user}/${p.client}`),
    leave: (p) => log.leaves.push(`${p.user}/${p.client}`),
    signal: (s) => log.signals.push(s.body),
    refreshed: (ms) => log.refreshed.push(ms),
  });
  const actions = () => core.takeActions();
  const frames = () => actions().filter((a) => a.type === "send").map((a) => JSON.parse(a.text));
  const rx = (id, f, now) => core.text(id, JSON.stringify(f), now);
  return { core, log, actions, frames, rx };
}

function connect(h, now = 0, subs = [], extra = {}) {
  h.core.start(now);
  const [c] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(c.id, now);
  const hello = h.frames()[0];
  h.rx(c.id, { type: "welcome", node: "n1", heartbeatMs: 60000, subs, ...extra }, now);
  return { id: c.id, hello };
}

const msg = (conv, seq, epoch = "e1") => ({ type: "msg", conv, seq, epoch, id: `m${seq}`, sender: "s", body: {}, ts: "t" });

test("subscribe and unsubscribe on a live connection", () => {
  const h = harness();
  const { id } = connect(h);
  h.frames();
  h.core.subscribe("r", { watermark: 2, epoch: "e1", presenceEvents: "clients" });
  assert.deepEqual(h.frames(), [{ type: "subscribe", conv: "r", watermark: 2, epoch: "e1", presenceEvents: "clients" }]);
  h.core.subscribe("r", { watermark: 2, epoch: "e1", presenceEvents: "clients" }); // the same: nothing
  assert.deepEqual(h.frames(), []);
  h.rx(id, msg("r", 3), 1); // not granted yet: not delivered
  h.rx(id, { type: "subscribed", conv: "r", head: 4, epoch: "e1", presence: true }, 2);
  h.rx(id, msg("r", 3), 3);
  h.rx(id, msg("r", 4), 3);
  h.rx(id, { type: "synced", conv: "r", head: 4, epoch: "e1" }, 3);
  assert.deepEqual(h.log.messages, ["r:3", "r:4"]);
  assert.deepEqual(h.log.subscribed, ["r"]);
  h.core.unsubscribe("r");
  assert.deepEqual(h.frames(), [{ type: "unsubscribe", conv: "r" }]);
  h.rx(id, msg("r", 5), 4); // queued before the answer: not delivered
  h.rx(id, { type: "unsubscribed", conv: "r" }, 5);
  assert.deepEqual(h.log.messages, ["r:3", "r:4"]);
  assert.deepEqual(h.log.unsubscribed, ["r:unsubscribed"]);
  assert.equal(h.core.subscribed("r"), false);
});

test("a subscribe overtaken by an unsubscribe: its `cancelled` answer is not taken for a later subscribe", () => {
  // issue 31, item 5 (docs/protocol.md 4.6): the node answers the subscribe with
  // error cancelled, then the unsubscribe with unsubscribed
  const h = harness();
  const { id } = connect(h);
  h.frames();
  h.core.subscribe("r", { watermark: 0 });
  h.core.unsubscribe("r"); // the pending subscribe ends here, told once
  assert.deepEqual(h.log.unsubscribed, ["r:unsubscribed"]);
  h.core.subscribe("r", { watermark: 0 }); // at once again
  assert.deepEqual(h.frames().map((f) => f.type), ["subscribe", "unsubscribe", "subscribe"]);
  h.rx(id, { type: "error", code: "cancelled", conv: "r", message: "m" }, 1);
  h.rx(id, { type: "unsubscribed", conv: "r" }, 1);
  assert.deepEqual(h.log.errors, []); // not the application's: it unsubscribed
  assert.deepEqual(h.log.unsubscribed, ["r:unsubscribed"]);
  assert.equal(h.core.subscribed("r"), true);
  h.rx(id, { type: "subscribed", conv: "r", head: 2, epoch: "e1", presence: false }, 2);
  h.rx(id, msg("r", 1), 2);
  h.rx(id, msg("r", 2), 2);
  h.rx(id, { type: "synced", conv: "r", head: 2, epoch: "e1" }, 2);
  assert.deepEqual(h.log.subscribed, ["r"]);
  assert.deepEqual(h.log.messages, ["r:1", "r:2"]);
  assert.deepEqual(h.log.errors, []);
  // the node's own: an operator's unsubscribe of a subscribe under way
  h.core.subscribe("x", { watermark: 0 });
  h.frames();
  h.rx(id, { type: "error", code: "cancelled", conv: "x", message: "m" }, 3);
  assert.deepEqual(h.log.errors, ["cancelled:x"]);
  h.rx(id, { type: "unsubscribed", conv: "x" }, 3);
  assert.deepEqual(h.log.unsubscribed, ["r:unsubscribed", "x:cancelled"]);
  assert.equal(h.core.subscribed("x"), false);
});

test("a subscribe the node could not take is sent again after the hint; a refused one ends", () => {
  const h = harness();
  const { id } = connect(h);
  h.core.subscribe("r", { watermark: 0 });
  h.core.subscribe("x", { watermark: 0 });
  h.frames();
  h.rx(id, { type: "error", code: "unavailable", conv: "r", retryAfterMs: 1200, message: "busy" }, 100);
  h.rx(id, { type: "error", code: "forbidden", conv: "x", message: "no" }, 100);
  assert.deepEqual(h.log.unsubscribed, ["x:forbidden"]);
  assert.equal(h.core.nextTimer(), 1300);
  h.core.tick(1299);
  assert.deepEqual(h.frames(), []);
  h.core.tick(1300);
  assert.deepEqual(h.frames(), [{ type: "subscribe", conv: "r", watermark: 0 }]);
  // over the rate: the same, with the bucket's name
  h.rx(id, { type: "error", code: "rate_limited", conv: "r", retryAfterMs: 50, details: { frame: "subscribe" } }, 1400);
  h.core.tick(1450);
  assert.deepEqual(h.frames(), [{ type: "subscribe", conv: "r", watermark: 0 }]);
  assert.equal(h.core.stats(1450).rateLimited, 1);
  // a node's own end of a live subscription: error, then unsubscribed
  h.rx(id, { type: "subscribed", conv: "r", head: 0, epoch: "e1" }, 1500);
  h.rx(id, { type: "error", code: "channel_inactive", conv: "r", message: "off" }, 1600);
  assert.equal(h.core.subscribed("r"), true);
  h.rx(id, { type: "unsubscribed", conv: "r" }, 1601);
  assert.deepEqual(h.log.unsubscribed, ["x:forbidden", "r:channel_inactive"]);
});

test("rate_limited sends and replay_unavailable syncs go again after the hint", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const { id } = connect(h, 0, [{ conv: "r", head: 9, epoch: "e1" }]);
  const done = [];
  h.core.send("r", "k1", "hi", (r) => done.push(r));
  assert.equal(h.frames().length, 1);
  h.rx(id, { type: "error", code: "rate_limited", conv: "r", retryAfterMs: 300, details: { frame: "send", id: "k1" } }, 10);
  h.core.tick(309);
  assert.deepEqual(h.frames(), []);
  h.core.tick(310);
  assert.deepEqual(h.frames(), [{ type: "send", conv: "r", id: "k1", body: "hi" }]);
  h.rx(id, { type: "sent", conv: "r", id: "k1", seq: 10 }, 320);
  assert.deepEqual(done, [{ seq: 10, id: "k1" }]);
  h.rx(id, msg("r", 3), 400); // a gap: a sync, refused for now
  assert.deepEqual(h.frames(), [{ type: "sync", conv: "r", watermark: 0, epoch: "e1" }]);
  h.rx(id, { type: "error", code: "replay_unavailable", conv: "r", retryAfterMs: 2000, details: { watermark: 0 } }, 410);
  h.rx(id, msg("r", 4), 420); // no second sync meanwhile
  assert.deepEqual(h.frames(), []);
  h.core.tick(2410);
  assert.deepEqual(h.frames(), [{ type: "sync", conv: "r", watermark: 0, epoch: "e1" }]);
  assert.equal(h.log.errors.length, 0); // retried: nothing for the application
});

test("resets: in welcome, in synced, and a msg of another epoch; late frames of the old epoch dropped", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 10, epoch: "old" });
  const { id } = connect(h, 0, [{ conv: "r", head: 3, epoch: "e1", reset: true }]);
  assert.deepEqual(h.log.resets, [{ conv: "r", watermark: 10, head: 3, epoch: "e1" }]);
  h.rx(id, msg("r", 4), 1);
  assert.deepEqual(h.log.messages, ["r:4"]);
  h.rx(id, msg("r", 11, "old"), 2); // a late frame of the history the reset left
  assert.deepEqual(h.log.messages, ["r:4"]);
  // the history changed under the live connection: a reset to seq - 1, then delivered
  h.rx(id, msg("r", 2, "e2"), 3);
  assert.deepEqual(h.log.resets.at(-1), { conv: "r", watermark: 4, head: 1, epoch: "e2" });
  assert.deepEqual(h.log.messages, ["r:4", "r:2"]);
  h.rx(id, { type: "synced", conv: "r", head: 7, epoch: "e3", reset: true }, 4);
  assert.deepEqual(h.log.resets.at(-1), { conv: "r", watermark: 2, head: 7, epoch: "e3" });
  assert.equal(h.core.watermark("r"), 7);
  assert.equal(h.core.stats(4).resets, 3);
  assert.deepEqual(h.core.snapshot().subs, { r: { watermark: 7, epoch: "e3" } });
});

test("refresh: a token asked at 75..85 % of its lifetime, sent as refresh, rescheduled by refreshed", () => {
  for (let seed = 1; seed < 20; seed++) {
    const h = harness({ random: seededRandom(seed), refreshable: true });
    const { id } = connect(h, 1000, [], { expiresInMs: 100000, heartbeatMs: 1e9 });
    h.actions();
    const at = h.core.nextTimer();
    assert.ok(at >= 1000 + 75000 && at <= 1000 + 85000, `refresh at ${at}`);
    h.core.tick(at - 1);
    assert.deepEqual(h.actions(), []);
    h.core.tick(at);
    assert.deepEqual(h.actions(), [{ type: "token", reason: "refresh" }]);
    h.core.setToken("T2", at + 5);
    assert.deepEqual(h.frames(), [{ type: "refresh", token: "T2" }]);
    h.rx(id, { type: "refreshed", expiresInMs: 40000 }, at + 10);
    const next = h.core.nextTimer();
    assert.ok(next >= at + 10 + 30000 && next <= at + 10 + 34000, `next refresh at ${next}`);
    assert.equal(h.core.stats(at).refreshes, 1);
    assert.deepEqual(h.log.refreshed, [40000]);
  }
});

test("refresh: getToken failures are tried again after 1, 2, 4 .. s; no refresh without getToken", () => {
  const h = harness({ refreshable: true });
  connect(h, 0, [], { expiresInMs: 10000 });
  h.actions();
  h.core.tick(h.core.nextTimer());
  assert.deepEqual(h.actions(), [{ type: "token", reason: "refresh" }]);
  let now = 9000;
  const gaps = [];
  for (let i = 0; i < 4; i++) {
    h.core.tokenFailed(now, "backend down");
    const at = h.core.nextTimer();
    gaps.push(at - now);
    h.core.tick(at);
    assert.deepEqual(h.actions(), [{ type: "token", reason: "refresh" }]);
    now = at;
  }
  gaps.forEach((g, i) => assert.ok(g >= 500 * 2 ** i && g <= 1000 * 2 ** i, `try ${i}: ${g}`));
  assert.ok(h.log.errors.every((e) => e === "token_unavailable"));
  const plain = harness();
  connect(plain, 0, [], { expiresInMs: 10000 });
  assert.equal(plain.core.nextTimer(), 60000); // only the heartbeat's ping
});

test("token_expired: a new token before the next hello; without getToken the client stops", () => {
  const h = harness({ refreshable: true });
  h.core.subscribe("r", { watermark: 0 });
  const { id } = connect(h, 0, [{ conv: "r", head: 0, epoch: "e1" }]);
  h.actions();
  h.rx(id, { type: "error", code: "token_expired", message: "expired" }, 10);
  h.core.closed(id, 1008, "token_expired", 11);
  h.core.tick(h.core.nextTimer());
  assert.deepEqual(h.actions(), [{ type: "token", reason: "expired" }]);
  h.core.setToken("T3", 400);
  const [c] = h.actions();
  assert.equal(c.type, "connect");
  h.core.opened(c.id, 410);
  assert.equal(h.frames()[0].token, "T3");

  const p = harness();
  const pc = connect(p);
  p.core.closed(pc.id, 1008, "token_expired", 5);
  assert.equal(p.log.states.at(-1).state, "stopped");
  assert.deepEqual(p.log.errors, ["token_expired"]);
});

test("getToken at start, and a token it gave that is refused stops the client", () => {
  const h = harness({ token: undefined, refreshable: true });
  h.core.start(0);
  assert.deepEqual(h.actions(), [{ type: "token", reason: "start" }]);
  h.core.setToken("T1", 5);
  const [c] = h.actions();
  h.core.opened(c.id, 6);
  assert.equal(h.frames()[0].token, "T1");
  h.rx(c.id, { type: "error", code: "unauthorized", message: "bad" }, 7);
  h.core.closed(c.id, 1008, "", 8);
  assert.equal(h.log.states.at(-1).state, "stopped");
  assert.throws(() => new Core({ urls: URLS }), /token/);
});

test("presence: the read, its refusal by details.frame, and events from the connection in use only", () => {
  const h = harness();
  h.core.subscribe("r", { presenceEvents: true });
  const { id, hello } = connect(h, 0, [{ conv: "r", head: 0, epoch: "e1", presence: true }]);
  assert.deepEqual(hello.subs, [{ conv: "r", watermark: null, presenceEvents: true }]);
  h.frames();
  const pages = [];
  h.core.presence("r", { limit: 2 }, (p) => pages.push(p));
  h.core.presence("r", { members: false }, (p) => pages.push(p));
  assert.deepEqual(h.frames(), [{ type: "presence", conv: "r", limit: 2 }, { type: "presence", conv: "r", members: false }]);
  h.rx(id, { type: "presence", conv: "r", count: 3, members: [{ user: "a", clients: 1, since: 5 }], cursor: "a" }, 1);
  h.rx(id, { type: "error", code: "unavailable", conv: "r", retryAfterMs: 900, message: "x", details: { frame: "presence" } }, 2);
  assert.deepEqual(pages, [
    { conv: "r", count: 3, members: [{ user: "a", clients: 1, since: 5 }], cursor: "a" },
    { error: "unavailable", message: "x", retryAfterMs: 900 },
  ]);
  assert.equal(h.log.errors.length, 0);
  h.core.presence("q", {}, (p) => pages.push(p)); // not subscribed: at once
  assert.equal(pages.at(-1).error, "not_subscribed");
  h.rx(id, { type: "join", conv: "r", user: "kim", client: "k1" }, 3);
  h.rx(id, { type: "leave", conv: "r", user: "kim", client: "k1" }, 4);
  h.rx(id, { type: "signal", conv: "r", sender: "kim", ts: 9, body: { typing: true } }, 5);
  assert.equal(h.core.signal("r", { typing: false }), true);
  assert.deepEqual(h.frames(), [{ type: "signal", conv: "r", body: { typing: false } }]);
  // a signal's refusal is told (at most once: not retried)
  h.rx(id, { type: "error", code: "signals_disabled", conv: "r", message: "no", details: { frame: "signal" } }, 6);
  assert.deepEqual(h.log.errors, ["signals_disabled:r"]);
  assert.equal(h.core.subscribed("r"), true);
  // during a drain move only the connection in use tells
  h.rx(id, { type: "drain", afterMs: 0, reconnectTo: null, deadlineMs: 30000 }, 10);
  h.core.tick(10);
  const [c2] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(c2.id, 11);
  h.rx(c2.id, { type: "join", conv: "r", user: "ann", client: "a1" }, 12); // not welcomed yet
  h.rx(c2.id, { type: "welcome", node: "n2", heartbeatMs: 60000, subs: [{ conv: "r", head: 0, epoch: "e1" }] }, 13);
  h.rx(id, { type: "leave", conv: "r", user: "ann", client: "a1" }, 14); // the old one
  assert.deepEqual(h.log.joins, ["kim/k1"]);
  assert.deepEqual(h.log.leaves, ["kim/k1"]);
  assert.deepEqual(h.log.signals, [{ typing: true }]);
  assert.equal(h.core.signal("nowhere", 1), false);
});

test("a presence read that had no answer is asked again on the next connection", () => {
  const h = harness();
  h.core.subscribe("r");
  const { id } = connect(h, 0, [{ conv: "r", head: 0, epoch: "e1", presence: true }]);
  const pages = [];
  h.core.presence("r", {}, (p) => pages.push(p));
  h.frames();
  h.core.closed(id, 1001, "", 5);
  h.core.tick(h.core.nextTimer());
  const [c] = h.actions();
  h.core.opened(c.id, 1000);
  h.frames();
  h.rx(c.id, { type: "welcome", node: "n1", heartbeatMs: 60000, subs: [{ conv: "r", head: 0, epoch: "e1" }] }, 1001);
  assert.deepEqual(h.frames(), [{ type: "presence", conv: "r" }]);
  h.rx(c.id, { type: "presence", conv: "r", count: 0, members: [], cursor: null }, 1002);
  assert.deepEqual(pages, [{ conv: "r", count: 0, members: [], cursor: null }]);
});

test("the snapshot: watermarks and epochs, unacknowledged sends, the clientId", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const { id } = connect(h, 0, [{ conv: "r", head: 2, epoch: "e1" }]);
  h.core.takeDirty();
  h.rx(id, msg("r", 1), 1);
  assert.equal(h.core.takeDirty(), true);
  assert.equal(h.core.takeDirty(), false);
  h.core.send("r", "k9", { text: "x" }, () => {});
  assert.deepEqual(h.core.snapshot(), {
    clientId: "cid", subs: { r: { watermark: 1, epoch: "e1" } }, sends: [{ conv: "r", id: "k9", body: { text: "x" } }],
  });
  h.rx(id, { type: "sent", conv: "r", id: "k9", seq: 3 }, 2);
  assert.deepEqual(h.core.snapshot().sends, []);
});

test("offlineMs counts the time without a welcomed connection; node is the one in use", () => {
  const h = harness();
  const { id } = connect(h, 100, [], {});
  assert.deepEqual([h.core.stats(100).offlineMs, h.core.stats(100).node], [0, "n1"]);
  h.core.closed(id, 1006, "", 1100);
  assert.equal(h.core.stats(1600).offlineMs, 500);
  assert.equal(h.core.stats(1600).node, "");
  h.core.tick(h.core.nextTimer());
  const [c] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(c.id, 2100);
  h.rx(c.id, { type: "welcome", node: "n2", heartbeatMs: 60000, subs: [] }, 2100);
  assert.equal(h.core.stats(5000).offlineMs, 1000);
  assert.equal(h.core.stats(5000).node, "n2");
});

test("a drain move that fails keeps the old connection and tries again before the deadline", () => {
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const { id } = connect(h, 0, [{ conv: "r", head: 0, epoch: "e1" }]);
  h.actions();
  h.rx(id, { type: "drain", afterMs: 100, reconnectTo: "ws://gone/v1/ws", deadlineMs: 30000 }, 0);
  h.core.tick(100);
  const [m1] = h.actions();
  assert.equal(m1.url, "ws://gone/v1/ws");
  h.core.closed(m1.id, 1006, "refused", 150);
  assert.equal(h.log.states.at(-1).state, "connected"); // the old one still serves
  h.rx(id, msg("r", 1), 160);
  assert.deepEqual(h.log.messages, ["r:1"]);
  const again = h.core.nextTimer();
  assert.ok(again > 150 && again < 30000, `${again}`);
  h.core.tick(again);
  const [m2] = h.actions();
  assert.equal(m2.type, "connect");
  assert.ok(URLS.includes(m2.url), m2.url); // a random node this time, not the failed target
});

test("history: the last n messages first, once; a reconnect resumes from the watermark", () => {
  const h = harness();
  h.core.subscribe("r", { history: 3 });
  const { id, hello } = connect(h, 0, [{ conv: "r", head: 10, epoch: "e1" }]);
  assert.deepEqual(hello.subs, [{ conv: "r", watermark: null }]);
  assert.deepEqual(h.frames(), [{ type: "sync", conv: "r", watermark: 7, epoch: "e1" }]);
  h.rx(id, msg("r", 11), 1); // live, before the replay: a gap, dropped
  h.rx(id, { type: "synced", conv: "r", head: 10, epoch: "e1" }, 2); // the hello's
  for (const seq of [8, 9, 10, 11]) h.rx(id, msg("r", seq), 3);
  h.rx(id, { type: "synced", conv: "r", head: 11, epoch: "e1" }, 4);
  assert.deepEqual(h.log.messages, ["r:8", "r:9", "r:10", "r:11"]);
  h.core.closed(id, 1006, "", 5);
  h.core.tick(h.core.nextTimer());
  const [c] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(c.id, 1000);
  assert.deepEqual(h.frames()[0].subs, [{ conv: "r", watermark: 11, epoch: "e1" }]);
  h.rx(c.id, { type: "welcome", node: "n1", heartbeatMs: 60000, subs: [{ conv: "r", head: 20, epoch: "e1" }] }, 1001);
  assert.deepEqual(h.frames(), []); // no second history
  // a kept watermark earlier than head - n: from the watermark, no sync
  const k = harness();
  k.core.subscribe("r", { watermark: 2, epoch: "e1", history: 3 });
  connect(k, 0, [{ conv: "r", head: 10, epoch: "e1" }]);
  assert.deepEqual(k.frames(), []);
});

test("a hello entry refused for its shard is subscribed again after the hint on the same connection; the others go on", () => {
  // docs/protocol.md 2.3: a sharded cluster's node whose shard of a
  // conversation is down answers that hello entry with unavailable (conv,
  // retryAfterMs) and welcomes the others; the connection stays
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  h.core.subscribe("q", { watermark: 3 });
  h.core.subscribe("x", { watermark: 0 });
  h.core.start(0);
  const [c] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(c.id, 0);
  assert.deepEqual(h.frames()[0].subs.map((e) => e.conv), ["r", "q", "x"]);
  h.rx(c.id, { type: "error", code: "unavailable", conv: "q", retryAfterMs: 1500, message: "shard" }, 100);
  h.rx(c.id, { type: "welcome", node: "n1", heartbeatMs: 60000, subs: [{ conv: "r", head: 0, epoch: "e1" }] }, 110);
  // an answer after the welcome, without a hint: the first backoff step (250 ms)
  h.rx(c.id, { type: "error", code: "unavailable", conv: "x", message: "shard" }, 200);
  assert.deepEqual(h.frames(), []); // not at once
  assert.deepEqual(h.log.subscribed, ["r"]);
  h.rx(c.id, msg("q", 4), 210); // not live: not delivered
  h.rx(c.id, msg("r", 1), 210); // the others go on
  assert.deepEqual(h.log.messages, ["r:1"]);
  assert.equal(h.core.nextTimer(), 450);
  h.core.tick(450);
  assert.deepEqual(h.frames(), [{ type: "subscribe", conv: "x", watermark: 0 }]);
  assert.equal(h.core.nextTimer(), 1600); // q: its hint, from the error's time
  h.core.tick(1599);
  assert.deepEqual(h.frames(), []);
  h.core.tick(1600);
  const out = h.actions();
  assert.deepEqual(out.map((a) => a.type), ["send"]); // the same connection: no connect, no close
  assert.deepEqual(JSON.parse(out[0].text), { type: "subscribe", conv: "q", watermark: 3 });
  assert.equal(out[0].id, c.id);
  h.rx(c.id, { type: "subscribed", conv: "q", head: 4, epoch: "e1" }, 1700);
  h.rx(c.id, msg("q", 4), 1700);
  assert.deepEqual(h.log.messages, ["r:1", "q:4"]);
  assert.equal(h.core.stats(1700).attempts, 1);
  assert.deepEqual(h.log.unsubscribed, []);
  assert.equal(h.core.subscribed("q") && h.core.subscribed("x"), true);
});

test("a send refused for its shard goes again after the hint on the same connection; after an older node's 1013, once on the next", () => {
  // docs/protocol.md 4.3
  const h = harness();
  h.core.subscribe("r", { watermark: 0 });
  const { id } = connect(h, 0, [{ conv: "r", head: 0, epoch: "e1" }]);
  const done = [];
  h.core.send("r", "k1", { n: 1 }, (r) => done.push(r));
  const [first] = h.actions();
  h.rx(id, { type: "error", code: "unavailable", conv: "r", retryAfterMs: 700, message: "shard", details: { id: "k1" } }, 50);
  assert.deepEqual(h.actions(), []);
  assert.equal(h.core.nextTimer(), 750);
  h.core.tick(749);
  assert.deepEqual(h.actions(), []);
  h.core.tick(750);
  assert.deepEqual(h.actions(), [first]); // the same frame on the same connection
  h.rx(id, { type: "sent", conv: "r", id: "k1", seq: 1 }, 800);
  assert.deepEqual(done, [{ seq: 1, id: "k1" }]);

  // an older node: the same answer, then 1013
  h.core.send("r", "k2", { n: 2 }, (r) => done.push(r));
  h.actions();
  h.rx(id, { type: "error", code: "unavailable", conv: "r", retryAfterMs: 2000, message: "busy", details: { id: "k2" } }, 1000);
  h.core.closed(id, 1013, '{"retryAfterMs":2000}', 1000);
  assert.equal(h.log.states.at(-1).state, "waiting");
  assert.ok(h.core.nextTimer() >= 3000);
  h.core.tick(h.core.nextTimer());
  const [c2] = h.actions().filter((a) => a.type === "connect");
  h.core.opened(c2.id, 3500);
  h.actions();
  h.rx(c2.id, { type: "welcome", node: "n2", heartbeatMs: 60000, subs: [{ conv: "r", head: 1, epoch: "e1" }] }, 3500);
  const k2 = (fs) => fs.filter((f) => f.type === "send" && f.id === "k2").length;
  assert.equal(k2(h.frames()), 1);
  h.core.tick(10000); // no second resend by the timer
  assert.equal(k2(h.frames().filter((f) => f.type !== "ping")), 0);
  assert.equal(h.core.stats(10000).unavailable, 2); // two refusals; the 1013 not counted again

  // a refusal with a 4 s hint, the connection lost 1 s later: not before 3 s
  h.core.send("r", "k3", { n: 3 }, (r) => done.push(r));
  h.rx(c2.id, { type: "error", code: "unavailable", conv: "r", retryAfterMs: 4000, message: "shard", details: { id: "k3" } }, 10000);
  h.core.closed(c2.id, 1006, "", 11000);
  assert.ok(h.core.nextTimer() >= 14000, `${h.core.nextTimer()}`);
});
