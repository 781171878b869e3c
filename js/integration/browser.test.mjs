// The demo page (web/, on converger-client) in headless Chromium (Debian's
// `chromium`, driven by playwright-core over the DevTools protocol), served
// by a node this file starts and stops by its pid:
//
//  - messages sent over REST and from the page's send box appear once and
//    in order, with pending sends shown until acknowledged;
//  - the node restarts and the page reconnects by itself; the page is
//    reloaded and shows the history again, once; a send typed while the
//    node was down survives a reload (sessionStorage) and is stored once;
//  - presence and a typing indicator from another client (Node, ws);
//  - a conversation the token does not cover is shown as refused;
//  - web/example.html, the README's browser example, works as written;
//  - both from a node that serves TLS itself (CONVERGER_TLS_CERT): the
//    page over https:// connects with wss:// on its own.
//
// A screenshot of the page is saved as a test artefact
// (CONVERGER_ARTEFACT_DIR, by default tmp/ of the repository).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket from "ws";
import { chromium } from "playwright-core";
import { Client } from "../dist/index.js";
import { ROOT, makeCerts, mintToken, sleep, startNode, until } from "./support.mjs";

const ARTEFACTS = process.env.CONVERGER_ARTEFACT_DIR || join(ROOT, "tmp");

function chromiumPath() {
  for (const name of ["chromium", "chromium-browser"]) {
    try {
      return execFileSync("sh", ["-c", `command -v ${name}`], { encoding: "utf8" }).trim();
    } catch {}
  }
  throw new Error("chromium not found: scripts/setup installs the Debian package");
}

let browser;
let n;
before(async () => {
  n = await startNode({ CONVERGER_PRESENCE_GRACE_MS: "500" });
  browser = await chromium.launch({ executablePath: chromiumPath(), args: ["--no-sandbox"], headless: true });
});
after(async () => {
  await browser?.close();
  await n?.finish();
});

/** The seqs the page shows, in DOM order (pending sends excluded). */
const shown = (page) => page.$$eval("#messages li.msg:not(.pending)", (els) => els.map((e) => Number(e.dataset.seq)));
const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i);

async function shows(page, want, what) {
  let last = [];
  try {
    await until(async () => {
      last = await shown(page);
      return last.length >= want.length;
    }, 20000, what);
  } catch (e) {
    throw new Error(`${e.message}; the page shows ${last.join(",")}`);
  }
  await sleep(300); // nothing more (no duplicate) comes
  assert.deepEqual(await shown(page), want, what);
}

async function post(conv, text) {
  return n.must("POST", `/v1/conversations/${conv}/messages`, { sender: "server", body: { text } });
}

test("the demo page: live and sent messages once, in order, across a restart and reloads", async () => {
  const ch = `team${Date.now()}`;
  await n.must("POST", "/v1/channels", { id: ch, name: "Team", presence: true, signals: true });
  const conv = `room${Date.now()}`;
  await n.must("POST", "/v1/conversations", { id: conv, channel: ch });
  const token = mintToken("alice", [conv]);
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${n.url}/#conv=${conv}&token=${token}`);
  await page.waitForSelector("#state.ok", { timeout: 10000 });
  assert.equal(await page.inputValue("#token"), token); // from the fragment, never in a request line

  for (let i = 1; i <= 3; i++) await post(conv, `from the server ${i}`);
  for (let i = 1; i <= 2; i++) {
    await page.fill("#text", `from the page ${i}`);
    await page.press("#text", "Enter");
  }
  await shows(page, range(1, 5), "three from REST and two from the page");

  // presence: alice is here; bob arrives and types
  const bob = new Client({ urls: [n.wsUrl], WebSocket, token: mintToken("bob", [conv]), clientId: "bob-1" });
  const bs = bob.subscribe(conv);
  let bobSynced = false;
  bs.on("synced", () => (bobSynced = true));
  bob.start();
  try {
    await until(() => bobSynced, 5000, "bob subscribed");
    await page.waitForFunction(() => document.querySelector("#here").textContent.includes("bob"), null, { timeout: 5000 });
    assert.match(await page.textContent("#here"), /alice/);
    bs.signal({ typing: true });
    await page.waitForFunction(() => document.querySelector("#typing").textContent.includes("bob is typing"), null, { timeout: 5000 });
    await bob.send(conv, { text: "hi from bob" });
    await shows(page, range(1, 6), "bob's message");
    mkdirSync(ARTEFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTEFACTS, "demo-page.png") });
  } finally {
    await bob.stop();
  }

  // the node restarts: the page counts down, reconnects, and misses nothing
  await n.stop();
  await page.waitForFunction(() => /reconnecting/.test(document.querySelector("#state").textContent), null, { timeout: 5000 });
  await page.fill("#text", "typed while the node was down");
  await page.press("#text", "Enter");
  assert.equal(await page.locator("#messages li.pending").count(), 1);
  await n.start();
  await post(conv, "after the restart");
  await shows(page, range(1, 8), "the restart");
  assert.equal(await page.locator("#messages li.pending").count(), 0);

  // a reload: the history again (once), then live
  await page.reload();
  await page.waitForSelector("#state.ok", { timeout: 10000 });
  await post(conv, "after the reload");
  await shows(page, range(1, 9), "the reload");

  const all = await n.messages(conv);
  assert.equal(all.length, 9);
  assert.equal(all.filter((m) => m.body.text === "typed while the node was down").length, 1);
  const texts = await page.$$eval("#messages li.msg .text", (els) => els.map((e) => e.textContent));
  assert.deepEqual(texts, all.map((m) => m.body.text));
  const stats = await page.textContent("#stats");
  assert.match(stats, /reconnects/);
  assert.deepEqual(errors, []);
  await page.close();
});

test("sends not acknowledged survive a reload (sessionStorage) and are stored once", async () => {
  // one send a second per connection: a burst from the page is mostly
  // rate_limited, so most of it is still pending when the page reloads
  const slow = await startNode({ CONVERGER_RATE_SEND: "1", CONVERGER_RATE_SEND_BURST: "1" });
  try {
    const conv = await slow.newConv();
    const page = await browser.newPage();
    await page.goto(`${slow.url}/#conv=${conv}&token=${mintToken("alice", [conv])}`);
    await page.waitForSelector("#state.ok", { timeout: 10000 });
    const texts = ["one", "two", "three", "four", "five"];
    for (const t of texts) {
      await page.fill("#text", t);
      await page.press("#text", "Enter");
    }
    await page.reload();
    const pending = await page.locator("#messages li.pending").count();
    assert.ok(pending >= 1, `${pending} pending after the reload`);
    await page.waitForSelector("#state.ok", { timeout: 10000 });
    let got = [];
    await until(async () => (got = await shown(page)).length >= 5, 20000, "the five sends");
    await sleep(300);
    assert.deepEqual(await shown(page), range(1, 5));
    const all = await slow.messages(conv);
    assert.deepEqual(all.map((m) => m.body.text).sort(), [...texts].sort()); // each stored once
    assert.equal(await page.locator("#messages li.pending").count(), 0);
    await page.close();
  } finally {
    await slow.finish();
  }
});

test("a conversation the token does not cover is shown as refused", async () => {
  const ch = `c${Date.now()}`;
  await n.must("POST", "/v1/channels", { id: ch, name: ch });
  const conv = `secret${Date.now()}`;
  await n.must("POST", "/v1/conversations", { id: conv, channel: ch });
  const page = await browser.newPage();
  await page.goto(`${n.url}/#conv=${conv}&token=${mintToken("mallory", ["elsewhere"])}`);
  await page.waitForSelector("#state.bad", { timeout: 10000 });
  assert.match(await page.textContent("#state"), /not allowed in this conversation/);
  assert.match(await page.textContent("#notice"), /refused \(forbidden\)/);
  assert.match(await page.textContent("#notice"), /does not cover this conversation/);
  await page.close();
});

test("web/example.html, the README's browser example, works as written", async () => {
  const ch = `e${Date.now()}`;
  await n.must("POST", "/v1/channels", { id: ch, name: ch });
  await n.must("POST", "/v1/conversations", { id: "room1", channel: ch }).catch(() => {}); // may exist
  const page = await browser.newPage();
  await page.goto(`${n.url}/example.html#${mintToken("alice", ["room1"])}`);
  await page.waitForFunction(() => document.title === "connected", null, { timeout: 10000 });
  await post("room1", "hello example");
  await page.waitForFunction(() => document.querySelector("#log").textContent.includes("server: hello example"), null, { timeout: 5000 });
  await page.close();
});

test("the demo page and web/example.html over https:// from a node that serves TLS use wss://", async () => {
  const dir = mkdtempSync(join(tmpdir(), "converger-js-tls-"));
  const certs = makeCerts(dir);
  const t = await startNode({ CONVERGER_TLS_CERT: certs.cert, CONVERGER_TLS_KEY: certs.key }, { ca: certs.ca });
  // Chromium does not know the test's CA: it is told to accept the
  // certificate; the REST calls here verify it.
  const ctx = await browser.newContext({ ignoreHTTPSErrors: true });
  try {
    const conv = await t.newConv();
    const page = await ctx.newPage();
    const sockets = [];
    page.on("websocket", (ws) => sockets.push(ws.url()));
    await page.goto(`${t.url}/#conv=${conv}&token=${mintToken("alice", [conv])}`);
    await page.waitForSelector("#state.ok", { timeout: 10000 });
    await t.must("POST", `/v1/conversations/${conv}/messages`, { sender: "server", body: { text: "over TLS" } });
    await page.fill("#text", "from the page over TLS");
    await page.press("#text", "Enter");
    await shows(page, [1, 2], "one from REST over https, one from the page over wss");
    assert.deepEqual(sockets, [`${t.wsUrl}`]);
    assert.deepEqual((await t.messages(conv)).map((m) => m.body.text), ["over TLS", "from the page over TLS"]);

    await t.must("POST", "/v1/channels", { id: "tlsex", name: "tlsex" });
    await t.must("POST", "/v1/conversations", { id: "room1", channel: "tlsex" });
    const ex = await ctx.newPage();
    await ex.goto(`${t.url}/example.html#${mintToken("alice", ["room1"])}`);
    await ex.waitForFunction(() => document.title === "connected", null, { timeout: 10000 });
    await t.must("POST", "/v1/conversations/room1/messages", { sender: "server", body: { text: "hello example" } });
    await ex.waitForFunction(() => document.querySelector("#log").textContent.includes("server: hello example"), null, { timeout: 5000 });
    const metrics = await t.request("GET", "/metrics");
    assert.match(metrics.text, /converger_tls_handshakes_total\{result="ok"\} [1-9]/);
  } finally {
    await ctx.close();
    await t.finish();
    rmSync(dir, { recursive: true, force: true });
  }
});
