/**
 * The sans-I/O core of converger-client: events in (a connection opened,
 * a text frame, a close, the clock), actions out (connect, send, close, a
 * timer), and the application's events, with the C library's rules
 * (client/client_core.c, docs/protocol.md section 8):
 *
 *  - one welcomed connection at a time; a reconnect goes to a random other
 *    URL, after the backoff (backoff.ts) and never before the node's retry
 *    hint (retryAfterMs of an `error` frame or of a close reason);
 *  - a connect timeout (15 s from the attempt to the welcome), and a dead
 *    connection found after two heartbeats without a byte;
 *  - every message once, in seq order: a seq at or below the watermark is
 *    dropped, one above watermark + 1 is a gap, filled by one `sync`;
 *  - sends kept until `sent`, and sent again with the same id on the next
 *    connection, so the node stores each once (its idempotency key);
 *  - `drain`: a new connection after `afterMs`, to `reconnectTo` when
 *    given, the old one closed only once the new one is welcomed; later
 *    reconnects use the configured URLs again.
 *
 * Nothing here touches a socket or a clock: the transport (client.ts) runs
 * the actions and feeds the events, with `now` in ms on one monotonic
 * clock; tests feed them by hand with a fake one.
 */
import { Backoff, BackoffOptions } from "./backoff.js";
import { Random, randomRange } from "./random.js";

export const CONNECT_TIMEOUT_MS = 15000;

export type Action =
  | { type: "connect"; id: number; url: string }
  | { type: "send"; id: number; text: string }
  | { type: "close"; id: number; code: number; reason: string };

export type State = "idle" | "connecting" | "connected" | "waiting" | "stopped";

export interface Message {
  conv: string;
  seq: number;
  id: string;
  sender: string;
  body: unknown;
  ts: string;
  epoch?: string;
}

export interface CoreEvents {
  message?(m: Message): void;
  synced?(conv: string, head: number): void;
  state?(s: { state: State; node?: string; delayMs?: number; reason?: string }): void;
  error?(code: string, message: string, conv?: string): void;
}

export interface CoreOptions {
  urls: string[];
  token: string;
  backoff?: BackoffOptions;
  random?: Random;
  clientId?: string;
  connectTimeoutMs?: number;
}

interface Sub {
  conv: string;
  watermark: number | null; // the last seq delivered; null: start at the head
  epoch: string;
  syncing: boolean; // a sync for a gap is out
}

interface Transport {
  id: number;
  url: string;
  st: "opening" | "hello" | "welcomed" | "closing";
  deadline: number; // the connect timeout, or (welcomed) the heartbeat's
  idleMs: number; // two heartbeats, once welcomed
  node?: string;
}

interface PendingSend {
  conv: string;
  id: string;
  frame: string;
  sentOn: number; // the transport it was last written on; 0: none
  done(result: { seq: number; id: string } | { error: string }): void;
}

export class Core {
  private readonly urls: string[];
  private token: string;
  private readonly random: Random;
  private readonly backoff: Backoff;
  private readonly connectTimeoutMs: number;
  readonly clientId: string;
  private readonly subs = new Map<string, Sub>();
  private readonly transports = new Map<number, Transport>();
  private readonly sends = new Map<string, PendingSend>();
  private actions: Action[] = [];
  private nextId = 0;
  private active = 0; // the welcomed transport in use; 0: none
  private state: State = "idle";
  private retryAt = -1; // a reconnect is due then
  private moveAt = -1; // a drain move is due then
  private moveTo: string | null = null;
  private hintMs = 0; // the node's last retry hint, for the next delay
  private lastUrl = "";
  readonly stats = { attempts: 0, welcomes: 0, duplicatesDropped: 0, gapsFilled: 0, unavailable: 0, migrations: 0 };

  constructor(options: CoreOptions, private readonly events: CoreEvents = {}) {
    if (!options.urls || options.urls.length === 0) throw new TypeError("at least one URL is needed");
    if (!options.token) throw new TypeError("a token is needed");
    this.urls = [...options.urls];
    this.token = options.token;
    this.random = options.random ?? Math.random;
    this.backoff = new Backoff(options.backoff, this.random);
    this.connectTimeoutMs = options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    this.clientId = options.clientId ?? randomId(this.random);
  }

  /** The actions to run now, in order (the list is emptied). */
  takeActions(): Action[] {
    const a = this.actions;
    this.actions = [];
    return a;
  }

  /** The next time `tick` must be called, or -1 for none. */
  nextTimer(): number {
    let t = -1;
    const earlier = (x: number) => {
      if (x >= 0 && (t < 0 || x < t)) t = x;
    };
    earlier(this.retryAt);
    earlier(this.moveAt);
    for (const tr of this.transports.values()) if (tr.st !== "closing") earlier(tr.deadline);
    return t;
  }

  /** Subscribe to `conv` from `watermark` (null: the head). Before start
   * or on a live connection (then a `subscribe` frame). */
  subscribe(conv: string, watermark: number | null = null, epoch = ""): void {
    if (this.subs.has(conv)) return;
    this.subs.set(conv, { conv, watermark, epoch, syncing: false });
    const t = this.activeTransport();
    if (t) this.write(t, { type: "subscribe", conv, watermark, ...(epoch ? { epoch } : {}) });
  }

  /** The watermark of `conv` (null before anything was delivered from the head). */
  watermark(conv: string): number | null {
    return this.subs.get(conv)?.watermark ?? null;
  }

  /** Send `body` to `conv` with idempotency key `id`; `done` is called once. */
  send(conv: string, id: string, body: unknown, done: PendingSend["done"]): void {
    const p: PendingSend = { conv, id, frame: JSON.stringify({ type: "send", conv, id, body }), sentOn: 0, done };
    this.sends.set(id, p);
    const t = this.activeTransport();
    if (t) this.transmit(p, t);
  }

  start(now: number): void {
    if (this.state !== "idle") return;
    this.connect(now, this.pickUrl());
  }

  stop(): void {
    if (this.state === "stopped") return;
    for (const t of this.transports.values()) this.closeTransport(t, 1000, "closed by the application");
    for (const p of this.sends.values()) p.done({ error: "closed" });
    this.sends.clear();
    this.retryAt = this.moveAt = -1;
    this.setState("stopped", { reason: "closed by the application" });
  }

  opened(id: number, now: number): void {
    const t = this.transports.get(id);
    if (!t || t.st !== "opening") return;
    t.st = "hello";
    const subs = [...this.subs.values()].map((s) => ({
      conv: s.conv,
      watermark: s.watermark,
      ...(s.epoch && s.watermark !== null ? { epoch: s.epoch } : {}),
    }));
    this.write(t, { type: "hello", token: this.token, clientId: this.clientId, subs });
    void now;
  }

  text(id: number, data: string, now: number): void {
    const t = this.transports.get(id);
    if (!t || t.st === "opening" || t.st === "closing") return;
    if (t.st === "welcomed") t.deadline = now + t.idleMs;
    let f: Record<string, unknown>;
    try {
      f = JSON.parse(data);
    } catch {
      return;
    }
    switch (f.type) {
      case "welcome":
        return this.onWelcome(t, f, now);
      case "msg":
        return this.onMsg(t, f as unknown as Message);
      case "synced":
        return this.onSynced(t, f);
      case "sent":
        return this.onSent(f);
      case "error":
        return this.onError(t, f);
      case "drain":
        return this.onDrain(t, f, now);
    }
  }

  /** Bytes or a ping came on `id` (the heartbeat counts them). */
  alive(id: number, now: number): void {
    const t = this.transports.get(id);
    if (t && t.st === "welcomed") t.deadline = now + t.idleMs;
  }

  closed(id: number, code: number, reason: string, now: number): void {
    const t = this.transports.get(id);
    if (!t) return;
    this.transports.delete(id);
    const hint = hintOf(reason);
    if (hint > this.hintMs) this.hintMs = hint;
    if (this.state === "stopped") return;
    const wasActive = this.active === id;
    if (wasActive) this.active = 0;
    if (this.active) return; // an old connection after a move, or a failed move target
    if (this.transports.size > 0) return; // a move's new connection is on its way
    this.moveAt = -1; // a move not begun becomes a reconnect, after the backoff and the hint
    this.moveTo = null;
    this.scheduleRetry(now, `connection closed (${code}${reason ? " " + reason : ""})`);
  }

  tick(now: number): void {
    if (this.state === "stopped") return;
    for (const t of [...this.transports.values()]) {
      if (t.st === "closing" || t.deadline < 0 || now < t.deadline) continue;
      const why = t.st === "welcomed" ? "heartbeat timeout" : "connect timeout";
      this.closeTransport(t, 4000, why);
      this.closed(t.id, 1006, why, now);
    }
    if (this.moveAt >= 0 && now >= this.moveAt) {
      this.moveAt = -1;
      const to = this.moveTo ?? this.pickUrl();
      this.moveTo = null;
      this.connect(now, to, true);
    }
    if (this.retryAt >= 0 && now >= this.retryAt) {
      this.retryAt = -1;
      this.connect(now, this.pickUrl());
    }
  }

  // ---- frames ---------------------------------------------------------------

  private onWelcome(t: Transport, f: Record<string, unknown>, now: number): void {
    t.st = "welcomed";
    const hb = typeof f.heartbeatMs === "number" && f.heartbeatMs > 0 ? f.heartbeatMs : 25000;
    t.idleMs = 2 * hb;
    t.deadline = now + t.idleMs;
    t.node = typeof f.node === "string" ? f.node : undefined;
    const old = this.activeTransport();
    this.active = t.id;
    this.stats.welcomes++;
    this.backoff.reset();
    this.hintMs = 0;
    for (const e of Array.isArray(f.subs) ? f.subs : []) {
      const s = this.subs.get(e.conv);
      if (!s) continue;
      s.syncing = false;
      if (typeof e.epoch === "string") s.epoch = e.epoch;
      // a reset, or a start at the head: live from the head the node says
      if (e.reset || s.watermark === null) s.watermark = e.head;
    }
    if (old && old !== t) {
      this.stats.migrations++;
      this.closeTransport(old, 1000, "moved"); // make-before-break: only now
    }
    this.setState("connected", t.node ? { node: t.node } : {});
    for (const p of this.sends.values()) if (p.sentOn !== t.id) this.transmit(p, t);
  }

  private onMsg(t: Transport, m: Message): void {
    if (t.id !== this.active) return; // the old connection of a move: the new one delivers
    const s = this.subs.get(m.conv);
    if (!s || typeof m.seq !== "number") return;
    if (s.watermark !== null && m.seq <= s.watermark) {
      this.stats.duplicatesDropped++;
      return;
    }
    if (s.watermark !== null && m.seq > s.watermark + 1) {
      // a gap: one sync from the watermark; the replay brings the rest in order
      if (!s.syncing) {
        s.syncing = true;
        this.stats.gapsFilled++;
        this.write(t, { type: "sync", conv: s.conv, watermark: s.watermark, ...(s.epoch ? { epoch: s.epoch } : {}) });
      }
      return;
    }
    s.watermark = m.seq;
    if (m.epoch) s.epoch = m.epoch;
    this.events.message?.(m);
  }

  private onSynced(t: Transport, f: Record<string, unknown>): void {
    const s = this.subs.get(f.conv as string);
    if (!s || t.id !== this.active) return;
    s.syncing = false;
    if (typeof f.epoch === "string") s.epoch = f.epoch;
    if (f.reset && typeof f.head === "number") s.watermark = f.head;
    this.events.synced?.(s.conv, f.head as number);
  }

  private onSent(f: Record<string, unknown>): void {
    const p = this.sends.get(f.id as string);
    if (!p) return;
    this.sends.delete(p.id);
    p.done({ seq: f.seq as number, id: p.id });
  }

  private onError(t: Transport, f: Record<string, unknown>): void {
    const code = String(f.code ?? "");
    const conv = typeof f.conv === "string" ? f.conv : undefined;
    if (typeof f.retryAfterMs === "number" && f.retryAfterMs > this.hintMs) this.hintMs = f.retryAfterMs;
    if (code === "unavailable") this.stats.unavailable++;
    const details = f.details as Record<string, unknown> | undefined;
    const sendId = details && typeof details.id === "string" ? details.id : undefined;
    if (sendId && (code === "forbidden" || code === "not_found" || code === "channel_inactive" || code === "too_large")) {
      const p = this.sends.get(sendId);
      if (p) {
        this.sends.delete(sendId);
        p.done({ error: code });
      }
    } else if (conv && (code === "forbidden" || code === "not_found" || code === "channel_inactive")) {
      this.subs.delete(conv); // ended: not in later hellos
    }
    void t;
    this.events.error?.(code, String(f.message ?? ""), conv);
  }

  private onDrain(t: Transport, f: Record<string, unknown>, now: number): void {
    if (t.id !== this.active || this.moveAt >= 0) return;
    const after = typeof f.afterMs === "number" && f.afterMs > 0 ? f.afterMs : 0;
    this.moveAt = now + after;
    this.moveTo = typeof f.reconnectTo === "string" && f.reconnectTo ? f.reconnectTo : null;
    this.setState("connected", { ...(t.node ? { node: t.node } : {}), delayMs: after, reason: "drain: moving" });
  }

  // ---- helpers --------------------------------------------------------------

  private activeTransport(): Transport | undefined {
    const t = this.transports.get(this.active);
    return t && t.st === "welcomed" ? t : undefined;
  }

  /** A random URL, another than the last one when there are several. */
  private pickUrl(): string {
    if (this.urls.length === 1) return this.urls[0];
    const others = this.urls.filter((u) => u !== this.lastUrl);
    return others[randomRange(this.random, 0, others.length - 1)];
  }

  private connect(now: number, url: string, move = false): void {
    const id = ++this.nextId;
    this.transports.set(id, { id, url, st: "opening", deadline: now + this.connectTimeoutMs, idleMs: 0 });
    this.stats.attempts++;
    if (!move) this.lastUrl = url; // a move's target is not sticky
    if (!move) this.setState("connecting", { reason: url });
    this.actions.push({ type: "connect", id, url });
  }

  private scheduleRetry(now: number, why: string): void {
    const delay = this.backoff.next(this.hintMs);
    this.hintMs = 0;
    this.retryAt = now + delay;
    this.setState("waiting", { delayMs: delay, reason: why });
  }

  private transmit(p: PendingSend, t: Transport): void {
    p.sentOn = t.id;
    this.actions.push({ type: "send", id: t.id, text: p.frame });
  }

  private write(t: Transport, frame: unknown): void {
    this.actions.push({ type: "send", id: t.id, text: JSON.stringify(frame) });
  }

  private closeTransport(t: Transport, code: number, reason: string): void {
    if (t.st === "closing") return;
    t.st = "closing";
    this.actions.push({ type: "close", id: t.id, code, reason });
  }

  private setState(state: State, more: { node?: string; delayMs?: number; reason?: string }): void {
    this.state = state;
    this.events.state?.({ state, ...more });
  }
}

/** retryAfterMs of a close reason that is JSON ({"retryAfterMs": n}), else 0. */
export function hintOf(reason: string): number {
  if (!reason || reason[0] !== "{") return 0;
  try {
    const r = JSON.parse(reason);
    return typeof r.retryAfterMs === "number" && r.retryAfterMs > 0 ? r.retryAfterMs : 0;
  } catch {
    return 0;
  }
}

function randomId(random: Random): string {
  let s = "";
  for (let i = 0; i < 32; i++) s += "0123456789abcdef"[randomRange(random, 0, 15)];
  return `${s.slice(0, 8)}-${s.slice(8, 12)}-4${s.slice(13, 16)}-8${s.slice(17, 20)}-${s.slice(20, 32)}`;
}
