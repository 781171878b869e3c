/**
 * The sans-I/O core of converger-client: events in (a connection opened,
 * a text frame, a close, the clock, a token), actions out (connect, send,
 * close, ask for a token), and the application's events, with the C
 * library's rules (client/client_core.c, docs/protocol.md section 8):
 *
 *  - one welcomed connection at a time; a reconnect goes to a random other
 *    URL, after the backoff (backoff.ts) and never before the node's retry
 *    hint (retryAfterMs of an `error` frame or of a close reason);
 *  - a connect timeout (15 s from the attempt to the welcome), and a dead
 *    connection found after two heartbeats without a frame (a `ping` is
 *    sent after one: a browser cannot see WebSocket pings);
 *  - every message once, in seq order: a seq at or below the watermark is
 *    dropped, one above watermark + 1 is a gap, filled by one `sync`; an
 *    epoch change is a reset (section 3.1), told to the application;
 *  - sends kept until `sent`, and sent again with the same id on the next
 *    connection, so the node stores each once (its idempotency key);
 *  - `drain`: a new connection after `afterMs`, to `reconnectTo` when
 *    given (never from wss:// to ws://: that one is refused, told as the
 *    error `downgrade_refused`, and the move goes to a configured URL), the
 *    old one closed only once the new one is welcomed; the target is then
 *    the URL the client is on, and a later reconnect goes to another of the
 *    configured URLs than it;
 *  - (1.1) subscribe and unsubscribe on a live connection, a refused
 *    subscribe or a `rate_limited` frame tried again after the hint, and
 *    the token refreshed at 75..85 % of its lifetime when the application
 *    can give new ones (a `token` action), and fetched again after
 *    `token_expired`;
 *  - (1.2) the clientId in every hello, presence reads, presence events and
 *    signals;
 *  - an `unavailable` that keeps the connection open (a sharded cluster's
 *    node whose shard of that conversation is down, docs/protocol.md 2.3,
 *    4.3, 4.5) retried on it after the hint: a refused hello entry or
 *    subscribe is subscribed again (it stays in the set, not live
 *    meanwhile; the others go on), a refused send is sent again with its
 *    id; the hint is also a reconnect's floor (an older node closes with
 *    1013 after it; the send then goes once on the next connection).
 *
 * Nothing here touches a socket or a clock: the transport (client.ts) runs
 * the actions and feeds the events, with `now` in ms on one monotonic
 * clock; tests feed them by hand with a fake one.
 */
import { Backoff, BackoffOptions } from "./backoff.js";
import { Random, randomRange } from "./random.js";

export const CONNECT_TIMEOUT_MS = 15000;
export const DEFAULT_HEARTBEAT_MS = 25000;

export type Action =
  | { type: "connect"; id: number; url: string }
  | { type: "send"; id: number; text: string }
  | { type: "close"; id: number; code: number; reason: string }
  /** Ask the application for a token; answer with `setToken` or `tokenFailed`. */
  | { type: "token"; reason: "start" | "refresh" | "expired" };

export type State = "idle" | "connecting" | "connected" | "waiting" | "stopped";

export interface StateEvent {
  state: State;
  node?: string;
  /** connected during a drain: the move begins in this many ms; waiting: the reconnect does */
  delayMs?: number;
  reason?: string;
}

export interface Message {
  conv: string;
  seq: number;
  id: string;
  sender: string;
  body: unknown;
  ts: string;
  epoch?: string;
}

/** A subscription's answer from the node (a `welcome` entry or `subscribed`). */
export interface Subscribed {
  conv: string;
  head: number;
  epoch: string;
  presence: boolean;
  reset: boolean;
}

/** The watermark was not in the conversation's history (protocol section 3.1). */
export interface Reset {
  conv: string;
  /** the watermark the client had (null: none yet) */
  watermark: number | null;
  /** the head the subscription continues from */
  head: number;
  epoch: string;
}

export interface PresenceChange {
  conv: string;
  user: string;
  client: string;
}

export interface Signal {
  conv: string;
  sender: string;
  ts: number;
  body: unknown;
}

export interface PresencePage {
  conv: string;
  count: number;
  members?: { user: string; clients: number; since: number }[];
  cursor?: string | null;
  truncated?: boolean;
}

export interface PresenceQuery {
  limit?: number;
  cursor?: string | null;
  members?: boolean;
}

/** `true` or "users": a user's first client in and last out; "clients": every client. */
export type PresenceEvents = boolean | "users" | "clients";

export interface SubscribeOptions {
  /** the last seq the application has (0: everything; null or absent: from the head) */
  watermark?: number | null;
  /** the epoch that watermark was taken in */
  epoch?: string;
  presenceEvents?: PresenceEvents;
  /**
   * Deliver the last `history` messages first (a chat's recent history):
   * the first answer's head minus `history`, or the watermark when that is
   * earlier. Once per subscription: a reconnect resumes from the watermark.
   */
  history?: number;
}

export interface CoreEvents {
  message?(m: Message): void;
  synced?(conv: string, head: number): void;
  subscribed?(s: Subscribed): void;
  /** the subscription ended: asked for (`reason` "unsubscribed") or the node's (an error code) */
  unsubscribed?(conv: string, reason: string): void;
  reset?(r: Reset): void;
  join?(p: PresenceChange): void;
  leave?(p: PresenceChange): void;
  signal?(s: Signal): void;
  refreshed?(expiresInMs: number): void;
  state?(s: StateEvent): void;
  error?(code: string, message: string, conv?: string): void;
}

export interface CoreOptions {
  /** absolute ws:// or wss:// URLs (the scheme in any case), all of one scheme */
  urls: string[];
  /** the first token; may be absent when `refreshable` (a `token` action asks for it) */
  token?: string;
  /** the application can give new tokens (getToken): refresh, and fetch one after token_expired */
  refreshable?: boolean;
  backoff?: BackoffOptions;
  random?: Random;
  clientId?: string;
  connectTimeoutMs?: number;
  /** the `client` field of hello: the software, for the node's logs */
  clientName?: string;
}

/** What a page reload needs to resume: storage.ts keeps it. */
export interface Snapshot {
  clientId: string;
  subs: Record<string, { watermark: number | null; epoch: string }>;
  sends: { conv: string; id: string; body: unknown }[];
}

export interface Stats {
  attempts: number;
  welcomes: number;
  duplicatesDropped: number;
  gapsFilled: number;
  unavailable: number;
  migrations: number;
  resets: number;
  refreshes: number;
  rateLimited: number;
  /** ms without a welcomed connection after one was lost (the first connect not counted), the current stretch included */
  offlineMs: number;
  /** the node of the connection in use, or "" */
  node: string;
}

export type SendResult = { seq: number; id: string } | { error: string; message?: string };

interface Sub {
  conv: string;
  watermark: number | null; // the last seq delivered; null: start at the head
  epoch: string;
  presenceEvents: PresenceEvents;
  history: number; // the first grant starts this many messages before the head; 0 none or done
  subscribing: number; // the transport a `subscribe` for it went out on; 0: none
  resumeEpoch: string; // the epoch the last hello entry or subscribe named
  syncEpoch: string; // the epoch the last sync named
  live: boolean; // granted on the active connection
  syncing: boolean; // a sync for a gap is out
  syncAt: number; // replay_unavailable or rate_limited: sync then; -1 none
  subAt: number; // a refused subscribe: subscribe again then; -1 none
  left: Set<string>; // epochs a reset left: their late frames are dropped
  lastError: string; // the error code that comes before the node's `unsubscribed`
}

interface Transport {
  id: number;
  url: string;
  st: "opening" | "hello" | "welcomed" | "closing";
  deadline: number; // the connect timeout, or (welcomed) two heartbeats after the last frame
  pingAt: number; // welcomed: a ping then, one heartbeat after the last frame; -1 sent
  heartbeatMs: number;
  node: string;
  move: boolean; // opened for a drain move
  helloConvs: Set<string>; // the subscriptions its hello carried
  expired: boolean; // error token_expired came on it
  unauthorized: boolean; // error unauthorized came on it
  unavailable: boolean; // error unavailable came on it
  refused: Map<string, number>; // hello entries refused with unavailable (a shard down): conv -> subscribe again then, once welcomed
  hintUntil: number; // an answer that kept it open (a shard's unavailable) said "not before": a reconnect's floor after its loss; 0 none
}

interface PendingSend {
  conv: string;
  id: string;
  body: unknown;
  frame: string;
  sentOn: number; // the transport it was last written on; 0: none
  retryAt: number; // rate_limited: write it again then; -1 none
  done(result: SendResult): void;
}

interface PendingPresence {
  conv: string;
  frame: string;
  sentOn: number;
  retryAt: number;
  done(result: PresencePage | { error: string; message?: string; retryAfterMs?: number }): void;
}

const ENDS_A_SUBSCRIBE = new Set(["forbidden", "not_found", "channel_inactive", "too_many_subscriptions"]);
const FAILS_A_SEND = new Set(["forbidden", "not_found", "channel_inactive", "too_large", "bad_request"]);

export class Core {
  private readonly urls: string[];
  private token: string;
  private readonly refreshable: boolean;
  private readonly random: Random;
  private readonly backoff: Backoff;
  private readonly connectTimeoutMs: number;
  private readonly clientName: string | undefined;
  readonly clientId: string;
  private readonly subs = new Map<string, Sub>();
  private readonly transports = new Map<number, Transport>();
  private readonly sends = new Map<string, PendingSend>(); // by conv + "\n" + id
  private readonly presenceQueue: PendingPresence[] = [];
  private readonly unsubDue = new Map<string, Map<number, number>>(); // conv: transport -> a retry time (-1 none): its answer is due
  private actions: Action[] = [];
  private nextId = 0;
  private active = 0; // the welcomed transport in use; 0: none
  private state: State = "idle";
  private retryAt = -1; // a reconnect is due then
  private moveAt = -1; // a drain move is due then
  private moveTo: string | null = null;
  private moveDeadline = -1; // the draining node closes what is left then
  private hintMs = 0; // the node's last retry hint, for the next delay
  private lastUrl = "";
  private refreshAt = -1; // ask for a fresh token then
  private refreshAnswerAt = -1; // a rate_limited refresh: send it again then
  private tokenFailures = 0;
  private tokenWanted: "" | "start" | "refresh" | "expired" = ""; // a token action is out
  private needToken = false; // the next hello needs a new token
  private freshToken = false; // the token was fetched since the last unauthorized
  private offlineSince = -1;
  private offlineMs = 0;
  private dirty = false;
  private readonly counters = {
    attempts: 0, welcomes: 0, duplicatesDropped: 0, gapsFilled: 0, unavailable: 0,
    migrations: 0, resets: 0, refreshes: 0, rateLimited: 0,
  };

  /**
   * @param options the URLs (one at least) and the token, or `refreshable`
   *   for one asked of the application at start
   * @param events the application's callbacks, called from the methods below
   * @throws TypeError without a URL, with one that is not an absolute ws://
   *   or wss:// URL (the scheme in any case: https:// and relative URLs are
   *   refused), with a mix of ws:// and wss://, or without a token when not
   *   refreshable
   */
  constructor(options: CoreOptions, private readonly events: CoreEvents = {}) {
    if (!options.urls || options.urls.length === 0) throw new TypeError("at least one URL is needed");
    // Only ws: and wss:, in any case, as the C library (client/wsurl.c): a
    // WebSocket also takes https: (and, in a browser, a relative URL on an
    // https page) as TLS, which would pass here for plaintext.
    for (const u of options.urls)
      if (!wsScheme(u)) throw new TypeError(`not a WebSocket URL (ws:// or wss://, absolute): ${u}`);
    // a client on wss never moves to ws (docs/protocol.md 8): one list, one scheme
    if (options.urls.some((u) => wsScheme(u) !== wsScheme(options.urls[0])))
      throw new TypeError("the URLs mix ws:// and wss://: give all of one (a client on wss never moves to ws)");
    if (!options.token && !options.refreshable) throw new TypeError("a token (or getToken) is needed");
    this.urls = [...options.urls];
    this.token = options.token ?? "";
    this.refreshable = !!options.refreshable;
    this.random = options.random ?? Math.random;
    this.backoff = new Backoff(options.backoff, this.random);
    this.connectTimeoutMs = options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    this.clientName = options.clientName;
    this.clientId = options.clientId ?? randomId(this.random);
  }

  /** The actions to run now, in order (the list is emptied). */
  takeActions(): Action[] {
    const a = this.actions;
    this.actions = [];
    return a;
  }

  /** Whether the snapshot changed since the last call (storage writes it then). */
  takeDirty(): boolean {
    const d = this.dirty;
    this.dirty = false;
    return d;
  }

  /** The watermarks and unacknowledged sends, for storage. */
  snapshot(): Snapshot {
    const subs: Snapshot["subs"] = {};
    for (const s of this.subs.values()) subs[s.conv] = { watermark: s.watermark, epoch: s.epoch };
    const sends = [...this.sends.values()].map((p) => ({ conv: p.conv, id: p.id, body: p.body }));
    return { clientId: this.clientId, subs, sends };
  }

  /** The next time `tick` must be called, or -1 for none. */
  nextTimer(): number {
    let t = -1;
    const earlier = (x: number) => {
      if (x >= 0 && (t < 0 || x < t)) t = x;
    };
    earlier(this.retryAt);
    earlier(this.moveAt);
    if (!this.tokenWanted && !this.needToken) earlier(this.refreshAt);
    earlier(this.refreshAnswerAt);
    for (const tr of this.transports.values()) {
      if (tr.st === "closing") continue;
      earlier(tr.deadline);
      earlier(tr.pingAt);
    }
    if (this.activeTransport()) {
      for (const s of this.subs.values()) {
        earlier(s.syncAt);
        earlier(s.subAt);
      }
      for (const p of this.sends.values()) earlier(p.retryAt);
      for (const q of this.presenceQueue) earlier(q.retryAt);
      for (const due of this.unsubDue.values()) for (const at of due.values()) earlier(at);
    }
    return t;
  }

  stats(now: number): Stats {
    const off = this.offlineMs + (this.offlineSince >= 0 ? now - this.offlineSince : 0);
    return { ...this.counters, offlineMs: off, node: this.activeTransport()?.node ?? "" };
  }

  get current(): State {
    return this.state;
  }

  /**
   * Subscribe to `conv`. Before start the first hello carries it; on a
   * live connection a `subscribe` frame goes out. A second call for the
   * same conversation only updates presenceEvents.
   */
  subscribe(conv: string, options: SubscribeOptions = {}): void {
    const old = this.subs.get(conv);
    const presenceEvents = options.presenceEvents ?? false;
    if (old) {
      if (old.presenceEvents === presenceEvents) return;
      old.presenceEvents = presenceEvents; // a subscribe of one that exists sets them anew
      const t = this.activeTransport();
      if (t && old.live) this.writeSubscribe(old, t);
      return;
    }
    const s: Sub = {
      conv, watermark: options.watermark ?? null, epoch: options.epoch ?? "", presenceEvents,
      history: Math.max(0, Math.floor(options.history ?? 0)), subscribing: 0, resumeEpoch: "", syncEpoch: "", live: false, syncing: false, syncAt: -1, subAt: -1, left: new Set(), lastError: "",
    };
    this.subs.set(conv, s);
    this.dirty = true;
    const t = this.activeTransport();
    if (t) this.writeSubscribe(s, t);
  }

  /** End the subscription of `conv`: no message of it is delivered after this call. */
  unsubscribe(conv: string): void {
    const s = this.subs.get(conv);
    if (!s) return;
    this.subs.delete(conv);
    this.dirty = true;
    this.failPresence(conv, "unsubscribed");
    // on every connection that has it or may have it (a drain move's new
    // one carried it in its hello)
    for (const t of this.transports.values()) {
      if (t.st !== "welcomed" && !(t.st === "hello" && t.helloConvs.has(conv))) continue;
      this.write(t, { type: "unsubscribe", conv });
      let due = this.unsubDue.get(conv);
      if (!due) this.unsubDue.set(conv, (due = new Map()));
      due.set(t.id, -1);
    }
    this.events.unsubscribed?.(conv, "unsubscribed");
  }

  /** The watermark of `conv` (null before anything was delivered from the head). */
  watermark(conv: string): number | null {
    return this.subs.get(conv)?.watermark ?? null;
  }

  /** The epoch of `conv`'s watermark ("" when not known yet). */
  epoch(conv: string): string {
    return this.subs.get(conv)?.epoch ?? "";
  }

  subscribed(conv: string): boolean {
    return this.subs.has(conv);
  }

  /** Ids of the sends not yet acknowledged. */
  pendingSends(): { conv: string; id: string; body: unknown }[] {
    return this.snapshot().sends;
  }

  /**
   * Send `body` to `conv` with idempotency key `id`; `done` is called once:
   * with the seq when committed, or with the error code of a refusal (or
   * "stopped"). The same id twice is one send.
   */
  send(conv: string, id: string, body: unknown, done: PendingSend["done"]): void {
    const key = conv + "\n" + id;
    if (this.sends.has(key)) {
      const first = this.sends.get(key)!;
      const prev = first.done;
      first.done = (r) => {
        prev(r);
        done(r);
      };
      return;
    }
    if (this.state === "stopped") return done({ error: "stopped" });
    const p: PendingSend = {
      conv, id, body, frame: JSON.stringify({ type: "send", conv, id, body }), sentOn: 0, retryAt: -1, done,
    };
    this.sends.set(key, p);
    this.dirty = true;
    const t = this.activeTransport();
    if (t) this.transmit(p, t);
  }

  /**
   * Read the presence of `conv` (protocol 1.2 section 4.9): `done` gets the
   * page, or an error code (not_subscribed, presence_disabled, unavailable
   * with retryAfterMs, "stopped"). Asked again on the next connection when
   * the answer did not come on this one.
   */
  presence(conv: string, query: PresenceQuery, done: PendingPresence["done"]): void {
    if (this.state === "stopped") return done({ error: "stopped" });
    if (!this.subs.has(conv)) return done({ error: "not_subscribed", message: "subscribe first" });
    const f: Record<string, unknown> = { type: "presence", conv };
    if (query.limit !== undefined) f.limit = query.limit;
    if (query.cursor !== undefined && query.cursor !== null) f.cursor = query.cursor;
    if (query.members === false) f.members = false;
    const q: PendingPresence = { conv, frame: JSON.stringify(f), sentOn: 0, retryAt: -1, done };
    this.presenceQueue.push(q);
    const t = this.activeTransport();
    if (t && this.subs.get(conv)!.live) this.transmitPresence(q, t);
  }

  /**
   * Send a signal (protocol 1.2 section 4.10). At most once: true when it
   * was written to a welcomed connection, false when there is none now (it
   * is not kept). Refusals come as `error` events with `conv`.
   */
  signal(conv: string, body: unknown): boolean {
    const t = this.activeTransport();
    const s = this.subs.get(conv);
    if (!t || !s || !s.live) return false;
    this.write(t, { type: "signal", conv, body });
    return true;
  }

  start(now: number): void {
    if (this.state !== "idle") return;
    if (!this.token) {
      this.askToken("start");
      this.setState("connecting", { reason: "getting a token" });
      return;
    }
    this.connect(now, this.pickUrl());
  }

  /** Close everything; pending sends and presence reads fail with "stopped". */
  stop(now = -1): void {
    if (this.state === "stopped") return;
    for (const t of [...this.transports.values()]) this.closeTransport(t, 1000, "closed by the application");
    const sends = [...this.sends.values()];
    this.sends.clear(); // storage keeps them (snapshot before stop) for the next start
    for (const p of sends) p.done({ error: "stopped" });
    for (const q of this.presenceQueue.splice(0)) q.done({ error: "stopped" });
    this.retryAt = this.moveAt = this.refreshAt = this.refreshAnswerAt = -1;
    if (now >= 0 && this.offlineSince >= 0) this.offlineMs += now - this.offlineSince;
    this.offlineSince = -1;
    this.setState("stopped", { reason: "closed by the application" });
  }

  /** The application's answer to a `token` action. */
  setToken(token: string, now: number): void {
    const why = this.tokenWanted;
    this.tokenWanted = "";
    if (this.state === "stopped") return;
    if (!token) return this.tokenFailed(now, "getToken gave an empty token");
    this.token = token;
    this.tokenFailures = 0;
    this.freshToken = true;
    if (why === "refresh" && !this.needToken) {
      const t = this.activeTransport();
      if (t) this.write(t, { type: "refresh", token });
      return;
    }
    // at start, or the next hello's (also a refresh's answer that came
    // after the node closed with token_expired)
    this.needToken = false;
    if (this.liveCount() === 0 && (this.retryAt < 0 || why !== "expired")) {
      this.retryAt = -1;
      this.connect(now, this.pickUrl());
    }
  }

  /** getToken failed (or gave nothing): asked again after 1, 2, 4 .. 30 s, jittered. */
  tokenFailed(now: number, why: string): void {
    const wanted = this.tokenWanted || "refresh";
    this.tokenWanted = "";
    if (this.state === "stopped") return;
    const n = Math.min(this.tokenFailures++, 5);
    const cap = Math.min(1000 * 2 ** n, 30000);
    const delay = randomRange(this.random, cap / 2, cap);
    this.events.error?.("token_unavailable", `getToken failed: ${why}`);
    if (wanted === "refresh" && !this.needToken) {
      this.refreshAt = now + delay;
    } else {
      this.needToken = true;
      this.retryAt = now + delay;
      this.setState("waiting", { delayMs: delay, reason: `no token yet (${why})` });
    }
  }

  opened(id: number, now: number): void {
    const t = this.transports.get(id);
    if (!t || t.st !== "opening") return;
    t.st = "hello";
    const subs = [...this.subs.values()].map((s) => {
      t.helloConvs.add(s.conv);
      s.resumeEpoch = s.epoch;
      if (!s.live) s.subAt = -1; // this hello asks for it again
      return this.subEntry(s);
    });
    const hello: Record<string, unknown> = { type: "hello", token: this.token, clientId: this.clientId, subs };
    if (this.clientName) hello.client = this.clientName;
    this.write(t, hello);
    void now;
  }

  text(id: number, data: string, now: number): void {
    const t = this.transports.get(id);
    if (!t || t.st === "opening" || t.st === "closing") return;
    this.heard(t, now);
    let f: Record<string, unknown>;
    try {
      f = JSON.parse(data);
    } catch {
      return;
    }
    if (!f || typeof f !== "object") return;
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
        return this.onError(t, f, now);
      case "drain":
        return this.onDrain(t, f, now);
      case "subscribed":
        return this.onSubscribed(t, f);
      case "unsubscribed":
        return this.onUnsubscribed(t, f);
      case "refreshed":
        return this.onRefreshed(f, now);
      case "presence":
        return this.onPresence(t, f);
      case "join":
      case "leave":
        return this.onPresenceChange(t, f);
      case "signal":
        return this.onSignal(t, f);
    }
  }

  /** A WebSocket ping or other bytes came on `id` (the heartbeat counts them). */
  alive(id: number, now: number): void {
    const t = this.transports.get(id);
    if (t) this.heard(t, now);
  }

  closed(id: number, code: number, reason: string, now: number): void {
    const t = this.transports.get(id);
    if (!t) return; // unknown, or one the core closed itself (its loss is handled)
    this.transports.delete(id);
    this.lose(t, code, reason, now);
  }

  /** Transport `t`, out of the map, is gone: reconnect, keep the old one of a move, or stop. */
  private lose(t: Transport, code: number, reason: string, now: number): void {
    const id = t.id;
    for (const [conv, due] of this.unsubDue) {
      due.delete(id); // its answers will not come
      if (due.size === 0) this.unsubDue.delete(conv);
    }
    if (code === 1009) this.failLargestSend(id);
    if (this.state === "stopped") return;
    // the hint of an answer that kept the connection open counts from that
    // answer: what is left of it (docs/protocol.md 4.3)
    const hint = Math.max(hintOf(reason), t.hintUntil - now);
    if (hint > this.hintMs) this.hintMs = hint;
    if (code === 1013 && !t.unavailable) this.counters.unavailable++;
    const wasActive = this.active === id;
    if (wasActive) {
      this.active = 0;
      this.offlineSince = now;
      this.moveAt = -1; // a move not begun becomes a reconnect, after the backoff and the hint
      this.moveTo = null;
      for (const s of this.subs.values()) s.live = false;
    }
    const why = `connection closed (${code}${reason ? " " + reason : ""})`;
    const expired = t.expired || (code === 1008 && reason === "token_expired");
    const keepOld = t.move && this.activeTransport() !== undefined; // a failed move keeps the old one
    if (!keepOld && (expired || t.unauthorized)) {
      if (!this.refreshable) {
        return this.fail(expired ? "token_expired" : "unauthorized",
          expired ? "the token expired and no getToken can give another" : "the node refused the token (unauthorized)");
      }
      if (t.unauthorized && this.freshToken && !expired) {
        // a token getToken had just given was refused too: do not loop
        return this.fail("unauthorized", "the node refused the token getToken gave (unauthorized)");
      }
      this.needToken = true;
      this.freshToken = false;
    }
    if (keepOld) {
      // Keep the draining connection; try the move again (to a random node)
      // after the backoff if that is before the node closes what is left.
      const delay = this.backoff.next(this.hintMs);
      this.hintMs = 0;
      const old = this.activeTransport()!;
      if (this.moveDeadline >= 0 && now + delay < this.moveDeadline) {
        this.moveAt = now + delay;
        this.moveTo = null;
        this.setState("connected", { node: old.node, delayMs: delay, reason: `drain: moving (the last try failed: ${why})` });
      } else {
        this.setState("connected", { node: old.node, reason: `drain: the node closes this connection soon (the move failed: ${why})` });
      }
      return;
    }
    if (this.activeTransport()) return; // an old connection after a move
    if (this.liveCount() > 0) {
      this.setState("connecting", { reason: `${why}; waiting for the new connection` });
      return; // a move's new connection is on its way
    }
    this.scheduleRetry(now, why);
  }

  tick(now: number): void {
    if (this.state === "stopped") return;
    for (const t of [...this.transports.values()]) {
      if (t.st === "closing") continue;
      if (t.deadline >= 0 && now >= t.deadline) {
        const why = t.st === "welcomed" ? "heartbeat timeout" : "connect timeout";
        this.closeTransport(t, 4000, why);
        this.lose(t, 1006, why, now);
        continue;
      }
      if (t.pingAt >= 0 && now >= t.pingAt) {
        t.pingAt = -1; // one ping; its pong (or any frame) re-arms it
        this.write(t, { type: "ping" });
      }
    }
    if (this.moveAt >= 0 && now >= this.moveAt) {
      this.moveAt = -1;
      const to = this.moveTo ?? this.pickUrl();
      this.moveTo = null;
      this.connect(now, to, true);
      const t = this.activeTransport();
      this.setState("connected", { ...(t ? { node: t.node } : {}), reason: "drain: connecting to another node" });
    }
    if (this.retryAt >= 0 && now >= this.retryAt) {
      this.retryAt = -1;
      if (this.needToken) {
        this.askToken("expired");
        this.setState("connecting", { reason: "getting a new token" });
      } else if (this.liveCount() === 0) {
        this.connect(now, this.pickUrl());
      }
    }
    if (this.refreshAt >= 0 && now >= this.refreshAt && !this.tokenWanted && !this.needToken) {
      this.refreshAt = -1;
      this.askToken("refresh");
    }
    const t = this.activeTransport();
    if (!t) return;
    if (this.refreshAnswerAt >= 0 && now >= this.refreshAnswerAt) {
      this.refreshAnswerAt = -1;
      this.write(t, { type: "refresh", token: this.token });
    }
    for (const s of this.subs.values()) {
      if (s.subAt >= 0 && now >= s.subAt) this.writeSubscribe(s, t);
      if (s.syncAt >= 0 && now >= s.syncAt && s.live) {
        s.syncAt = -1;
        this.writeSync(s, t);
      }
    }
    for (const p of this.sends.values()) if (p.retryAt >= 0 && now >= p.retryAt) this.transmit(p, t);
    for (const q of this.presenceQueue) if (q.retryAt >= 0 && now >= q.retryAt) this.transmitPresence(q, t);
    for (const [conv, due] of this.unsubDue) {
      for (const [id, at] of due) {
        const on = this.transports.get(id);
        if (at < 0 || now < at || !on) continue;
        due.set(id, -1);
        this.write(on, { type: "unsubscribe", conv });
      }
    }
  }

  // ---- frames ---------------------------------------------------------------

  private onWelcome(t: Transport, f: Record<string, unknown>, now: number): void {
    if (t.st !== "hello") return;
    t.st = "welcomed";
    t.heartbeatMs = clampMs(f.heartbeatMs) || DEFAULT_HEARTBEAT_MS;
    this.heard(t, now);
    t.node = typeof f.node === "string" ? f.node : "";
    const old = this.activeTransport();
    this.active = t.id;
    this.counters.welcomes++;
    this.backoff.reset();
    this.hintMs = 0;
    this.freshToken = false;
    if (this.offlineSince >= 0) {
      this.offlineMs += now - this.offlineSince;
      this.offlineSince = -1;
    }
    if (old && old !== t) {
      this.counters.migrations++;
      // the move's target is the URL we are on now: a reconnect after its
      // loss goes to another than it (a target not in the list: another
      // than the one we left, as before the move)
      if (this.urls.includes(t.url)) this.lastUrl = t.url;
      this.closeTransport(old, 1000, "moved"); // make-before-break: only now
    }
    this.moveAt = -1;
    this.moveTo = null;
    this.moveDeadline = -1;
    if (typeof f.expiresInMs === "number") this.scheduleRefresh(f.expiresInMs, now);
    this.setState("connected", t.node ? { node: t.node } : {});
    for (const s of this.subs.values()) s.live = false;
    for (const e of Array.isArray(f.subs) ? f.subs : []) {
      const s = e && typeof e.conv === "string" ? this.subs.get(e.conv) : undefined;
      if (!s || !t.helloConvs.has(s.conv)) continue;
      this.granted(s, e, s.resumeEpoch);
    }
    // A hello entry the welcome leaves out is not live (its error came, or
    // comes, with its conv) and stays in the set. One refused for now
    // (unavailable: its shard is down, docs/protocol.md 2.3) is subscribed
    // again on this connection after that answer's hint.
    for (const [conv, at] of t.refused) {
      const s = this.subs.get(conv);
      if (s && !s.live) s.subAt = at;
    }
    t.refused.clear();
    for (const s of [...this.subs.values()]) {
      // subscribed since that hello went out: subscribe on this connection
      if (this.subs.get(s.conv) === s && !t.helloConvs.has(s.conv) && !s.live) this.writeSubscribe(s, t);
    }
    for (const p of this.sends.values()) if (p.sentOn !== t.id) this.transmit(p, t);
    for (const q of this.presenceQueue) if (q.sentOn !== t.id) this.transmitPresence(q, t);
  }

  /** A hello entry or a `subscribed`: the subscription is live on the active connection. */
  private granted(s: Sub, e: Record<string, unknown>, sentEpoch: string): void {
    s.subscribing = 0;
    s.live = true;
    s.syncing = false;
    s.syncAt = -1;
    const head = typeof e.head === "number" ? e.head : 0;
    const epoch = typeof e.epoch === "string" ? e.epoch : "";
    if (e.reset && resetAlreadyMade(s, sentEpoch, epoch)) {
      // the other connection of a drain move brought the new epoch since
      // this resume went out: the watermark stays (a gap, if any, is filled)
    } else if (e.reset) {
      this.reset(s, head, epoch);
    } else {
      if (s.watermark === null) s.watermark = head; // a start at the head: live from it
      if (epoch && s.epoch !== epoch) s.epoch = epoch;
      this.dirty = true;
    }
    const t = this.activeTransport();
    if (s.history > 0 && t) {
      // the recent history first: a sync from further back (the replay of
      // the hello, if any, is dropped as a gap meanwhile and comes again)
      const from = Math.max(0, head - s.history);
      s.history = 0;
      if (s.watermark !== null && from < s.watermark) {
        s.watermark = from;
        this.writeSync(s, t);
      }
    }
    this.events.subscribed?.({ conv: s.conv, head, epoch, presence: !!e.presence, reset: !!e.reset });
    for (const q of this.presenceQueue) {
      const t = this.activeTransport();
      if (t && q.conv === s.conv && q.sentOn !== t.id) this.transmitPresence(q, t);
    }
  }

  private reset(s: Sub, head: number, epoch: string): void {
    const old = s.watermark;
    if (s.epoch && s.epoch !== epoch) s.left.add(s.epoch);
    s.watermark = head;
    s.epoch = epoch;
    s.syncing = false;
    this.counters.resets++;
    this.dirty = true;
    this.events.reset?.({ conv: s.conv, watermark: old, head, epoch });
  }

  private onMsg(t: Transport, m: Message): void {
    if (t.id !== this.active) return; // the old connection of a move: the new one delivers
    const s = this.subs.get(m.conv);
    if (!s || !s.live || typeof m.seq !== "number") return;
    if (m.epoch && s.epoch && m.epoch !== s.epoch) {
      if (s.left.has(m.epoch)) return; // a late frame of a history a reset left
      this.reset(s, m.seq - 1, m.epoch); // the history changed under a live connection
    }
    if (s.watermark !== null && m.seq <= s.watermark) {
      this.counters.duplicatesDropped++;
      return;
    }
    if (s.watermark !== null && m.seq > s.watermark + 1) {
      // a gap: one sync from the watermark; the replay brings the rest in order
      if (!s.syncing && s.syncAt < 0) {
        this.counters.gapsFilled++;
        this.writeSync(s, t);
      }
      return;
    }
    s.watermark = m.seq;
    if (m.epoch && !s.epoch) s.epoch = m.epoch;
    this.dirty = true;
    this.events.message?.(m);
  }

  private onSynced(t: Transport, f: Record<string, unknown>): void {
    const s = this.subs.get(f.conv as string);
    if (!s || t.id !== this.active || typeof f.head !== "number") return;
    s.syncing = false;
    const epoch = typeof f.epoch === "string" ? f.epoch : "";
    if (f.reset && !resetAlreadyMade(s, s.syncEpoch, epoch)) {
      this.reset(s, f.head, epoch);
    } else if (epoch && !s.epoch) {
      s.epoch = epoch;
    }
    if (s.watermark === null) s.watermark = f.head;
    this.events.synced?.(s.conv, f.head);
  }

  private onSubscribed(t: Transport, f: Record<string, unknown>): void {
    const s = this.subs.get(f.conv as string);
    if (!s || t.id !== this.active) return;
    if (f.already) {
      // one that exists (presenceEvents set anew): it stays as it is
      s.subscribing = 0;
      s.live = true;
      return;
    }
    this.granted(s, f, s.resumeEpoch);
  }

  private onUnsubscribed(t: Transport, f: Record<string, unknown>): void {
    const conv = f.conv as string;
    const due = this.unsubDue.get(conv);
    if (due?.has(t.id)) {
      due.delete(t.id); // the answer to ours
      if (due.size === 0) this.unsubDue.delete(conv);
      return;
    }
    const s = this.subs.get(conv);
    if (!s || t.id !== this.active) return;
    this.endSub(s, s.lastError || "unsubscribed by the node");
  }

  private onRefreshed(f: Record<string, unknown>, now: number): void {
    if (typeof f.expiresInMs !== "number") return;
    this.counters.refreshes++;
    this.scheduleRefresh(f.expiresInMs, now);
    this.events.refreshed?.(f.expiresInMs);
  }

  private onSent(f: Record<string, unknown>): void {
    const p = this.sends.get(`${f.conv}\n${f.id}`);
    if (!p || typeof f.seq !== "number") return; // the answer to a resend of one completed
    this.sends.delete(`${p.conv}\n${p.id}`);
    this.dirty = true;
    p.done({ seq: f.seq, id: p.id });
  }

  private onPresence(t: Transport, f: Record<string, unknown>): void {
    const i = this.presenceQueue.findIndex((q) => q.conv === f.conv && q.sentOn === t.id);
    if (i < 0) return;
    const [q] = this.presenceQueue.splice(i, 1);
    const page: PresencePage = { conv: q.conv, count: typeof f.count === "number" ? f.count : 0 };
    if (Array.isArray(f.members)) page.members = f.members;
    if ("cursor" in f) page.cursor = (f.cursor as string | null) ?? null;
    if (f.truncated) page.truncated = true;
    q.done(page);
  }

  private onPresenceChange(t: Transport, f: Record<string, unknown>): void {
    if (t.id !== this.active || !this.subs.get(f.conv as string)?.live) return;
    const p = { conv: f.conv as string, user: String(f.user ?? ""), client: String(f.client ?? "") };
    if (f.type === "join") this.events.join?.(p);
    else this.events.leave?.(p);
  }

  private onSignal(t: Transport, f: Record<string, unknown>): void {
    if (t.id !== this.active || !this.subs.get(f.conv as string)?.live) return;
    this.events.signal?.({ conv: f.conv as string, sender: String(f.sender ?? ""), ts: Number(f.ts ?? 0), body: f.body });
  }

  private onError(t: Transport, f: Record<string, unknown>, now: number): void {
    const code = String(f.code ?? "");
    const message = String(f.message ?? "");
    const conv = typeof f.conv === "string" ? f.conv : undefined;
    const hint = clampMs(f.retryAfterMs);
    const at = now + (hint || this.backoff.baseMs);
    const details = (f.details && typeof f.details === "object" ? f.details : {}) as Record<string, unknown>;
    const frame = typeof details.frame === "string" ? details.frame : "";
    const sendId = typeof details.id === "string" ? details.id : undefined;
    const s = conv ? this.subs.get(conv) : undefined;
    const send = sendId && conv ? this.sends.get(conv + "\n" + sendId) : undefined;
    const query = conv ? this.presenceQueue.find((q) => q.conv === conv && q.sentOn === t.id) : undefined;
    if (code === "cancelled" && conv && this.unsubDue.get(conv)?.has(t.id)) {
      // the answer to a subscribe our own unsubscribe overtook (protocol 4.6): that
      // Subscription ended at the unsubscribe call ("unsubscribed"), and one of the same
      // conversation made since is not the one cancelled; the `unsubscribed` that follows
      // is the unsubscribe's answer
      return;
    }
    if (code === "rate_limited") this.counters.rateLimited++;
    if (code === "rate_limited" && frame !== "signal") {
      // not acted on: the same frame again after the hint
      // (the bucket "subscribe" is shared by subscribe, unsubscribe, sync
      // and presence: each of them that may be the refused one goes again;
      // all of them are safe to repeat)
      const due = conv ? this.unsubDue.get(conv) : undefined;
      if (send) send.retryAt = at;
      else if (frame === "refresh") this.refreshAnswerAt = at;
      else {
        if (due?.has(t.id) && !s) due.set(t.id, at);
        if (s && s.subscribing === t.id) {
          s.subscribing = 0;
          s.subAt = at;
        }
        if (s && s.syncing) {
          s.syncing = false;
          s.syncAt = at;
        }
        if (query) query.retryAt = at;
      }
      return; // retried: not the application's concern
    }
    if (frame === "presence" || frame === "signal") {
      // a presence read's refusal answers the oldest one out; a signal's is told, not retried
      if (frame === "presence" && query) {
        this.presenceQueue.splice(this.presenceQueue.indexOf(query), 1);
        query.done({ error: code, message, ...(hint ? { retryAfterMs: hint } : {}) });
        return;
      }
    } else if (send && FAILS_A_SEND.has(code)) {
      this.sends.delete(conv + "\n" + sendId);
      this.dirty = true;
      send.done({ error: code, message });
    } else if (sendId && code === "unavailable") {
      // A send the node could not take now (docs/protocol.md 4.3). A
      // sharded cluster's node whose shard of this conversation is down
      // keeps the connection: the same frame (the same id: idempotent) goes
      // again after the hint, on this connection. An older node closes with
      // 1013 next; then the send goes again after the reconnect's welcome,
      // once (its transmit there clears this retry), and the hint is the
      // reconnect's floor. (client_core.c, on_error: the same rule)
      if (send && send.sentOn === t.id) send.retryAt = at; // else sent again since
      if (now + hint > t.hintUntil) t.hintUntil = now + hint;
      this.counters.unavailable++;
      t.unavailable = true; // that 1013 is not counted again
    } else if (!sendId && s && code === "unavailable" &&
               (s.subscribing === t.id || (t.helloConvs.has(s.conv) && (t.st === "hello" || (t.id === this.active && !s.live))))) {
      // A subscribe (docs/protocol.md 4.5) or a hello entry (2.3) the node
      // could not take now (a sharded cluster's node whose shard of it is
      // down): the connection stays, the subscription stays in the set;
      // subscribe again after the hint, once this connection is welcomed
      // (onWelcome) for a hello entry. The hint is also a reconnect's floor.
      if (now + hint > t.hintUntil) t.hintUntil = now + hint;
      if (t.st === "hello") {
        t.refused.set(s.conv, at);
      } else {
        s.subscribing = 0;
        s.subAt = at;
      }
      return;
    } else if (!sendId && s && s.subscribing === t.id && code === "cancelled") {
      // an operator's unsubscribe overtook our subscribe: its `unsubscribed` follows
      s.subscribing = 0;
      s.lastError = code;
    } else if (!sendId && s && code === "replay_unavailable") {
      s.syncing = false;
      s.syncAt = at;
      return;
    } else if (!sendId && s && ENDS_A_SUBSCRIBE.has(code)) {
      if (s.subscribing === t.id || (t.st === "hello" && t.helloConvs.has(s.conv)) || !s.live) this.endSub(s, code);
      else s.lastError = code; // the node's `unsubscribed` follows
    } else if (code === "token_expired") {
      t.expired = true; // its 1008 close follows: a new token before the next hello
    } else if (code === "unauthorized") {
      t.unauthorized = true;
    } else if (code === "unavailable") {
      // its close (1013) follows: the hint is the floor of the next attempt, and
      // an unacknowledged send goes again on the next connection
      if (hint > this.hintMs) this.hintMs = hint;
      if (!t.unavailable) this.counters.unavailable++;
      t.unavailable = true;
    }
    this.events.error?.(code, message, conv);
  }

  private onDrain(t: Transport, f: Record<string, unknown>, now: number): void {
    if (t.id !== this.active) return;
    if (this.liveCount() > 1) return; // a move's connection is open already
    const after = clampMs(f.afterMs);
    if (this.moveAt >= 0) {
      this.moveAt = Math.min(this.moveAt, now + after); // a second drain may only hurry the move
      return;
    }
    this.moveAt = now + after;
    let to = typeof f.reconnectTo === "string" && wsScheme(f.reconnectTo) ? f.reconnectTo : null;
    if (to && wsScheme(t.url) === "wss" && wsScheme(to) !== "wss") {
      // A connection over TLS never moves to plaintext (docs/protocol.md
      // 5.6): the move goes to one of the configured URLs instead.
      this.events.error?.("downgrade_refused", "drain: reconnectTo is ws:// but this connection is wss://; moving to a configured URL instead");
      to = null;
    }
    this.moveTo = to;
    this.moveDeadline = typeof f.deadlineMs === "number" ? now + f.deadlineMs : -1;
    this.setState("connected", { ...(t.node ? { node: t.node } : {}), delayMs: after, reason: "drain: moving" });
  }

  // ---- helpers --------------------------------------------------------------

  private activeTransport(): Transport | undefined {
    const t = this.transports.get(this.active);
    return t && t.st === "welcomed" ? t : undefined;
  }

  private heard(t: Transport, now: number): void {
    if (t.st !== "welcomed") return;
    t.deadline = now + 2 * t.heartbeatMs;
    t.pingAt = now + t.heartbeatMs;
  }

  private endSub(s: Sub, reason: string): void {
    this.subs.delete(s.conv); // ended: not in later hellos
    this.dirty = true;
    this.failPresence(s.conv, reason);
    this.events.unsubscribed?.(s.conv, reason);
  }

  private failPresence(conv: string, why: string): void {
    for (let i = this.presenceQueue.length - 1; i >= 0; i--) {
      if (this.presenceQueue[i].conv !== conv) continue;
      const [q] = this.presenceQueue.splice(i, 1);
      q.done({ error: "not_subscribed", message: why });
    }
  }

  private fail(code: string, why: string): void {
    for (const t of [...this.transports.values()]) this.closeTransport(t, 1000, why);
    this.events.error?.(code, why);
    const sends = [...this.sends.values()];
    this.sends.clear();
    for (const p of sends) p.done({ error: code, message: why });
    for (const q of this.presenceQueue.splice(0)) q.done({ error: code, message: why });
    this.retryAt = this.moveAt = this.refreshAt = -1;
    this.setState("stopped", { reason: why });
  }

  private askToken(reason: "start" | "refresh" | "expired"): void {
    if (this.tokenWanted) return;
    this.tokenWanted = reason;
    this.actions.push({ type: "token", reason });
  }

  /** A refresh at 75..85 % of the lifetime, so that clients given tokens at one moment do not refresh at one moment. */
  private scheduleRefresh(lifetimeMs: number, now: number): void {
    if (!this.refreshable || lifetimeMs <= 0) return;
    this.refreshAt = now + randomRange(this.random, Math.floor(lifetimeMs * 0.75), Math.floor(lifetimeMs * 0.85));
  }

  /** A random URL, another than the last one (the one we were on) when there are several. */
  private pickUrl(): string {
    if (this.urls.length === 1) return this.urls[0];
    const others = this.urls.filter((u) => u !== this.lastUrl);
    return others[randomRange(this.random, 0, others.length - 1)];
  }

  private connect(now: number, url: string, move = false): void {
    const id = ++this.nextId;
    this.transports.set(id, {
      id, url, st: "opening", deadline: now + this.connectTimeoutMs, pingAt: -1, heartbeatMs: DEFAULT_HEARTBEAT_MS,
      node: "", move, helloConvs: new Set(), expired: false, unauthorized: false, unavailable: false,
      refused: new Map(), hintUntil: 0,
    });
    this.counters.attempts++;
    if (!move) this.lastUrl = url; // a move's target: once it is welcomed (onWelcome)
    this.actions.push({ type: "connect", id, url }); // before the state: a listener may stop()
    if (!move) this.setState("connecting", { reason: url });
  }

  private scheduleRetry(now: number, why: string): void {
    const delay = this.backoff.next(this.hintMs);
    this.hintMs = 0;
    this.retryAt = now + delay;
    this.setState("waiting", { delayMs: delay, reason: why });
  }

  private subEntry(s: Sub): Record<string, unknown> {
    const e: Record<string, unknown> = { conv: s.conv, watermark: s.watermark };
    if (s.epoch && s.watermark !== null) e.epoch = s.epoch;
    if (s.presenceEvents) e.presenceEvents = s.presenceEvents;
    return e;
  }

  private writeSubscribe(s: Sub, t: Transport): void {
    s.subscribing = t.id;
    s.subAt = -1;
    s.resumeEpoch = s.epoch;
    this.write(t, { type: "subscribe", ...this.subEntry(s) });
  }

  private writeSync(s: Sub, t: Transport): void {
    s.syncing = true;
    s.syncEpoch = s.epoch;
    this.write(t, { type: "sync", conv: s.conv, watermark: s.watermark ?? 0, ...(s.epoch ? { epoch: s.epoch } : {}) });
  }

  private transmit(p: PendingSend, t: Transport): void {
    p.sentOn = t.id;
    p.retryAt = -1;
    this.actions.push({ type: "send", id: t.id, text: p.frame });
  }

  private transmitPresence(q: PendingPresence, t: Transport): void {
    q.sentOn = t.id;
    q.retryAt = -1;
    this.actions.push({ type: "send", id: t.id, text: q.frame });
  }

  private write(t: Transport, frame: unknown): void {
    this.actions.push({ type: "send", id: t.id, text: JSON.stringify(frame) });
  }

  /** Close `t` and forget it: its late frames and its close event are ignored (the caller handles the loss, if any). */
  private closeTransport(t: Transport, code: number, reason: string): void {
    if (t.st === "closing") return;
    t.st = "closing";
    this.transports.delete(t.id);
    this.actions.push({ type: "close", id: t.id, code, reason });
  }

  /** Connections that are opening, saying hello or welcomed. */
  private liveCount(): number {
    return this.transports.size; // closed ones leave the map at once
  }

  /** A 1009 close: the largest send that went out on it is too large; the others go again. */
  private failLargestSend(id: number): void {
    let big: PendingSend | undefined;
    for (const p of this.sends.values()) if (p.sentOn === id && (!big || p.frame.length > big.frame.length)) big = p;
    if (!big) return;
    this.sends.delete(`${big.conv}\n${big.id}`);
    this.dirty = true;
    big.done({ error: "too_large", message: "the node closed with 1009 (Message Too Big)" });
  }

  private setState(state: State, more: Omit<StateEvent, "state">): void {
    this.state = state;
    this.events.state?.({ state, ...more });
  }
}

/** retryAfterMs of a close reason that is JSON ({"retryAfterMs": n}), else 0. */
export function hintOf(reason: string): number {
  if (!reason || reason[0] !== "{") return 0;
  try {
    const r = JSON.parse(reason);
    return clampMs(r.retryAfterMs);
  } catch {
    return 0;
  }
}

/** A duration from the node in ms: 0 unless a positive number, at most one hour. */
export function clampMs(v: unknown): number {
  return typeof v === "number" && v > 0 ? Math.min(Math.floor(v), 3600000) : 0;
}

/**
 * Whether a reset the node reports (a welcome entry or `subscribed`, or a
 * `synced`) was already made by the client: the resume named epoch `sent`,
 * and since it went out the other connection of a drain move moved the
 * subscription into the reported epoch. (client_core.c, reset_already_made)
 */
function resetAlreadyMade(s: { epoch: string }, sent: string, epoch: string): boolean {
  return !!epoch && !!s.epoch && sent !== s.epoch && epoch === s.epoch;
}

/** A random version-4 UUID from `random` (the clientId and the default send ids). */
export function randomId(random: Random): string {
  let s = "";
  for (let i = 0; i < 32; i++) s += "0123456789abcdef"[randomRange(random, 0, 15)];
  return `${s.slice(0, 8)}-${s.slice(8, 12)}-4${s.slice(13, 16)}-8${s.slice(17, 20)}-${s.slice(20, 32)}`;
}

/**
 * The scheme of an absolute WebSocket URL as a WebSocket reads it (the
 * WHATWG URL parser, which Node's ws and browsers use; the scheme in any
 * case, RFC 3986 section 3.1): "wss" (TLS) or "ws", or "" for anything
 * else (another scheme such as https:, a relative URL, no host, not a URL).
 * The one scheme test of this client: the mix rule and the downgrade rule
 * (docs/protocol.md 8) compare two of these.
 */
function wsScheme(url: string): "ws" | "wss" | "" {
  let p: URL;
  try {
    p = new URL(url);
  } catch {
    return "";
  }
  return p.protocol === "wss:" ? "wss" : p.protocol === "ws:" ? "ws" : "";
}
