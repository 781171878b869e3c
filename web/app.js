/*
 * converger demo page: a small chat on converger-client (js/), the same
 * package applications use; the page itself only draws.
 *
 * - The token comes from the form or from the URL fragment
 *   (#conv=room1&token=...), which browsers never send to a server; once
 *   read it is kept in the tab's sessionStorage, out of the address bar.
 * - The conversation's last 50 messages, then live ones, each once and in
 *   order; sessionStorage keeps the watermark and the sends not yet
 *   acknowledged, so a reload resumes and sends them again (stored once).
 * - Sends show as pending until the node has committed them.
 * - The connection's state, with a countdown while it waits to reconnect
 *   or to move off a draining node. After a move the next reconnect goes
 *   to the URL in the form (a load balancer), not to the move's target.
 * - Who is here (presence) and who is typing (signals), on channels that
 *   have them.
 */
import { Client, ConvergerError, browserStorage } from "converger-client";

const HISTORY = 50;
const TYPING_SEND_MS = 2000; // at most one "typing" signal this often
const TYPING_SHOW_MS = 4000; // a typing indicator fades after this

const $ = (id) => document.getElementById(id);
let client = null;
let room = null;
let countdown = 0;
const typing = new Map(); // user -> ms it was last seen typing
let lastTypingSent = 0;
let presenceTimer = 0;
let refused = ""; // the node refused the conversation: why
let me = "you"; // the token's sub, for our own pending sends
const TOKEN_KEY = "converger-demo:token"; // this tab's token, so that a reload reconnects

function defaultUrl() {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/ws`;
}

function fragment() {
  const q = new URLSearchParams(location.hash.slice(1));
  return { conv: q.get("conv") || "", token: q.get("token") || "", node: q.get("node") || "" };
}

/** The token's `sub` (read, not verified: the node verifies), or "you". */
function subOf(token) {
  try {
    const claims = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")));
    return typeof claims.sub === "string" ? claims.sub : "you";
  } catch {
    return "you";
  }
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; // text only: never innerHTML
  return e;
}

function bodyText(body) {
  if (body && typeof body === "object" && typeof body.text === "string") return body.text;
  return JSON.stringify(body);
}

function time(ts) {
  const d = typeof ts === "number" ? new Date(ts) : new Date(ts);
  return isNaN(d) ? "" : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function notice(text, kind = "bad") {
  const n = $("notice");
  n.hidden = !text;
  n.textContent = text || "";
  n.className = `notice ${kind}`;
  scrollDown(); // the notice takes room from the list: keep the last message in view
}

function clearPresence() {
  $("here").replaceChildren();
  $("here-count").textContent = "";
  typing.clear();
  renderTyping();
}

// ---- the connection state ----------------------------------------------

function showState(s) {
  clearInterval(countdown);
  const st = $("state");
  const label = {
    connecting: "connecting…",
    connected: s.node ? `connected to ${s.node}` : "connected",
    waiting: "reconnecting",
    stopped: "not connected",
    idle: "not connected",
  }[s.state];
  const draining = s.state === "connected" && (s.reason ?? "").startsWith("drain");
  st.className = `state ${s.state === "connected" && !draining ? "ok" : s.state === "stopped" || s.state === "idle" ? "bad" : "wait"}`;
  if (s.state !== "connected") clearPresence(); // who is here is not known while away
  if (refused && s.state === "connected") {
    st.textContent = "not allowed in this conversation"; // connected, but not to it
    st.className = "state bad";
  } else if (draining && !(s.delayMs > 0)) {
    st.textContent = s.reason === "drain: connecting to another node" ? "node draining: moving…" : "node draining";
  } else if (s.delayMs > 0 && (s.state === "waiting" || draining)) {
    const end = performance.now() + s.delayMs;
    const what = s.state === "waiting" ? "reconnecting in" : "node draining: moving in";
    const tick = () => {
      const left = Math.max(0, end - performance.now());
      st.textContent = `${what} ${(left / 1000).toFixed(1)} s`;
      if (left === 0) clearInterval(countdown);
    };
    tick();
    countdown = setInterval(tick, 100);
  } else {
    st.textContent = label;
  }
  st.title = s.reason || "";
  if (s.state === "connected" && room?.active) notice("");
  renderStats();
}

function renderStats() {
  const dl = $("stats");
  dl.replaceChildren();
  if (!client) return;
  const s = client.stats();
  const rows = [
    ["node", s.node || "–"],
    ["watermark", room?.watermark ?? "–"],
    ["reconnects", Math.max(0, s.welcomes - 1 - s.migrations)],
    ["drain moves", s.migrations],
    ["duplicates dropped", s.duplicatesDropped],
    ["gaps filled", s.gapsFilled],
    ["offline", `${(s.offlineMs / 1000).toFixed(1)} s`],
  ];
  for (const [k, v] of rows) dl.append(el("dt", "", k), el("dd", "", String(v)));
}

// ---- messages -----------------------------------------------------------

function addMessage(m) {
  document.querySelector(`#messages li.pending[data-id="${CSS.escape(m.id)}"]`)?.remove();
  const li = el("li", "msg");
  li.dataset.seq = m.seq;
  li.dataset.id = m.id;
  const head = el("div", "meta");
  head.append(el("span", "sender", m.sender), el("time", "", time(m.ts)), el("span", "seq", `#${m.seq}`));
  li.append(head, el("div", "text", bodyText(m.body)));
  const list = $("messages");
  const firstPending = list.querySelector("li.pending");
  list.insertBefore(li, firstPending);
  scrollDown();
  renderStats();
}

function addPending(p) {
  const li = el("li", "msg pending");
  li.dataset.id = p.id;
  const head = el("div", "meta");
  const offline = client?.state !== "connected";
  head.append(el("span", "sender", me), el("span", "status", offline ? "waiting for the connection" : "sending…"));
  li.append(head, el("div", "text", bodyText(p.body)));
  $("messages").append(li);
  scrollDown();
}

function failPending(id, why) {
  const li = document.querySelector(`#messages li.pending[data-id="${CSS.escape(id)}"]`);
  if (!li) return;
  li.classList.add("failed");
  li.querySelector(".status").textContent = `not sent: ${why}`;
}

function scrollDown() {
  const list = $("messages");
  list.scrollTop = list.scrollHeight;
}

// ---- presence and typing -------------------------------------------------

async function refreshPresence() {
  clearTimeout(presenceTimer);
  if (!room?.active) return;
  try {
    const page = await room.presence({ limit: 100 });
    const ul = $("here");
    ul.replaceChildren(...(page.members ?? []).map((m) =>
      el("li", "", m.clients > 1 ? `${m.user} (${m.clients})` : m.user)));
    $("here-count").textContent = String(page.count);
  } catch (e) {
    if (e instanceof ConvergerError && e.code === "presence_disabled") {
      $("here").replaceChildren(el("li", "muted", "no presence on this channel"));
      return;
    }
    if (e instanceof ConvergerError && e.retryAfterMs) presenceTimer = setTimeout(refreshPresence, e.retryAfterMs);
  }
}

function renderTyping() {
  const now = performance.now();
  for (const [u, t] of typing) if (now - t > TYPING_SHOW_MS) typing.delete(u);
  const who = [...typing.keys()];
  $("typing").textContent =
    who.length === 0 ? "" : who.length === 1 ? `${who[0]} is typing…` : `${who.join(", ")} are typing…`;
}
setInterval(renderTyping, 500);

// ---- connect, send, disconnect --------------------------------------------

async function disconnect() {
  clearTimeout(presenceTimer);
  const c = client;
  client = room = null;
  $("disconnect").disabled = true;
  clearPresence();
  if (c) await c.stop();
  renderStats();
}

async function connect(url, conv, token) {
  await disconnect();
  notice("");
  $("messages").replaceChildren();
  clearPresence();
  refused = "";
  me = subOf(token);
  sessionStorage.setItem(TOKEN_KEY, token);
  // the fragment names the conversation (a reload comes back to it); the
  // token stays out of it once read, in this tab's sessionStorage
  history.replaceState(null, "", `#conv=${encodeURIComponent(conv)}`);
  $("room").textContent = conv;
  document.title = `${conv} · converger`;
  try {
    client = new Client({ urls: [url], token, storage: browserStorage("session"), storageKey: `converger-demo:${conv}` });
  } catch (e) {
    notice(e.message);
    return;
  }
  client.on("state", showState);
  $("disconnect").disabled = false;
  client.on("sent", (s) => {
    if (s.error && s.error !== "stopped") failPending(s.id, s.error);
    const status = !s.error && document.querySelector(`#messages li.pending[data-id="${CSS.escape(s.id)}"] .status`);
    if (status) status.textContent = `sent as #${s.seq}`; // the msg itself replaces it
  });
  client.on("error", (e) => {
    if (e.code === "token_expired" || e.code === "unauthorized")
      notice(`The token was refused (${e.code}). Paste a new one and connect again.`);
  });
  room = client.subscribe(conv, { history: HISTORY, presenceEvents: true });
  window.converger = { client, room }; // for the browser test and the curious
  room.on("message", addMessage);
  room.on("synced", () => {
    renderStats();
    refreshPresence();
  });
  room.on("reset", (r) => notice(`The conversation's history was replaced (epoch ${r.epoch}); showing it from #${r.head}.`, "info"));
  room.on("join", refreshPresence);
  room.on("leave", refreshPresence);
  room.on("signal", (s) => {
    if (s.body && s.body.typing) typing.set(s.sender, performance.now());
    else typing.delete(s.sender);
    renderTyping();
  });
  room.on("unsubscribed", (why) => {
    const text = {
      forbidden: "the token does not cover this conversation",
      not_found: "there is no such conversation",
      channel_inactive: "its channel is inactive",
    }[why] ?? why;
    refused = why;
    notice(`${conv}: refused (${why}): ${text}.`);
    showState({ state: client?.state ?? "stopped" });
  });
  client.start();
  for (const p of client.pending()) addPending(p); // kept from before a reload
}

function onConnect(ev) {
  ev.preventDefault();
  const url = $("node").value.trim() || defaultUrl();
  const conv = $("conv").value.trim();
  const token = $("token").value.trim();
  if (conv && token) connect(url, conv, token);
}

function onSend(ev) {
  ev.preventDefault();
  const input = $("text");
  const text = input.value.trim();
  if (!text) return;
  if (!client) {
    notice("Connect to a conversation first.", "info");
    return;
  }
  if (!room?.active) return; // refused: the notice says why
  const id = crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
  addPending({ id, body: { text } });
  client.send(room.conv, { text }, { id }).catch(() => {}); // shown by the "sent" event
  input.value = "";
  room.signal({ typing: false });
  lastTypingSent = 0;
}

function onInput() {
  const now = performance.now();
  if (!room?.active || now - lastTypingSent < TYPING_SEND_MS) return;
  lastTypingSent = now;
  room.signal({ typing: true });
}

function init() {
  const f = fragment();
  $("node").value = f.node || defaultUrl();
  $("conv").value = f.conv;
  $("token").value = f.token || sessionStorage.getItem(TOKEN_KEY) || "";
  $("disconnect").disabled = true;
  $("connect-form").addEventListener("submit", onConnect);
  $("disconnect").addEventListener("click", async () => {
    await disconnect();
    notice("");
    showState({ state: "stopped", reason: "disconnected" });
  });
  $("send-form").addEventListener("submit", onSend);
  $("text").addEventListener("input", onInput);
  if (f.conv && $("token").value) connect($("node").value, f.conv, $("token").value);
  else
    notice("Paste a client token and a conversation, then Connect. A token for alice in room1: " +
      "build/converger token --sub alice --convs room1 (in the repository, where the node runs).", "info");
}

init();
