/**
 * The client over a WebSocket: core.ts's actions run on real sockets and
 * timers, its events become the application's, and its snapshot goes to
 * storage. Everything here runs on the caller's event loop (a browser page,
 * a worker, Node); nothing blocks.
 *
 * The WebSocket is the browser's, Node 22's global one, or one the caller
 * passes (the `ws` package in Node 20): anything with the WHATWG
 * constructor `new WebSocket(url, protocol)`, `onopen`, `onmessage`,
 * `onclose`, `onerror`, `send` and `close(code, reason)`.
 */
import { BackoffOptions, BackoffStrategy } from "./backoff.js";
import {
  Core, Message, PresenceChange, PresencePage, PresenceQuery, Reset, SendResult, Signal, Snapshot, StateEvent,
  Stats, SubscribeOptions, Subscribed, randomId,
} from "./core.js";
import { Random } from "./random.js";
import { MemoryStorage, StorageLike } from "./storage.js";

/** The WebSocket subprotocol of converger (docs/protocol.md section 2.1). */
export const SUBPROTOCOL = "converger.v1";

/** What the client needs of a WebSocket object. */
export interface WebSocketLike {
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  /** the `ws` package: WebSocket pings count as life (browsers cannot see them) */
  on?(event: string, listener: () => void): unknown;
}

export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

export type TokenReason = "start" | "refresh" | "expired";

export interface ClientOptions {
  /** node WebSocket URLs, absolute, all ws:// or all wss:// (scheme in any case); reconnects go to a random other one */
  urls: string[];
  /** the token; or getToken */
  token?: string;
  /**
   * Gives a token: at start when `token` is absent, at about 80 % of each
   * token's lifetime (a `refresh` on the open connection), and after the
   * node said `token_expired` or refused a token. A rejection is tried
   * again after 1, 2, 4 .. 30 s.
   */
  getToken?: (reason: TokenReason) => Promise<string> | string;
  /** a WebSocket constructor; the global one by default (browsers, Node 22) */
  WebSocket?: WebSocketConstructor;
  /** the reconnect backoff: a strategy name, or one with its bounds (ms) */
  backoff?: BackoffStrategy | BackoffOptions;
  /** keeps the clientId, watermarks and unacknowledged sends; MemoryStorage by default */
  storage?: StorageLike;
  /** the key in `storage` (default "converger-client") */
  storageKey?: string;
  /** this client instance's id for presence; kept in storage, else a random UUID */
  clientId?: string;
  /** the `client` field of hello, for the node's logs */
  clientName?: string;
  /** the random source of the jitter (Math.random) */
  random?: Random;
  /** a monotonic clock in ms (performance.now) */
  now?: () => number;
  connectTimeoutMs?: number;
}

/** An error the node or the client gave: `code` is a stable code of docs/protocol.md section 6. */
export class ConvergerError extends Error {
  constructor(readonly code: string, message: string, readonly retryAfterMs?: number) {
    super(message ? `${code}: ${message}` : code);
    this.name = "ConvergerError";
  }
}

type Listener<T> = (value: T) => void;

/** A small event emitter: `on` returns a function that removes the listener. */
class Emitter<E extends object> {
  private readonly listeners = new Map<keyof E, Set<Listener<never>>>();

  on<K extends keyof E>(event: K, fn: Listener<E[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(fn as Listener<never>);
    return () => this.off(event, fn);
  }

  off<K extends keyof E>(event: K, fn: Listener<E[K]>): void {
    this.listeners.get(event)?.delete(fn as Listener<never>);
  }

  protected emit<K extends keyof E>(event: K, value: E[K]): void {
    for (const fn of [...(this.listeners.get(event) ?? [])]) {
      try {
        (fn as Listener<E[K]>)(value);
      } catch (e) {
        // a listener's exception must not break the client's bookkeeping
        setTimeout(() => {
          throw e;
        }, 0);
      }
    }
  }
}

export interface ErrorEvent {
  code: string;
  message: string;
  conv?: string;
}

export interface SentEvent {
  conv: string;
  id: string;
  seq?: number;
  error?: string;
}

export interface SubscriptionEvents {
  message: Message;
  synced: number;
  subscribed: Subscribed;
  unsubscribed: string;
  reset: Reset;
  join: PresenceChange;
  leave: PresenceChange;
  signal: Signal;
  error: ErrorEvent;
}

export interface ClientEvents {
  state: StateEvent;
  error: ErrorEvent;
  message: Message;
  reset: Reset;
  refreshed: number;
  /** every send's end, those resumed from storage included */
  sent: SentEvent;
}

/** One conversation's subscription: Client.subscribe makes it. */
export class Subscription extends Emitter<SubscriptionEvents> {
  /** @internal */
  constructor(private readonly client: Client, readonly conv: string) {
    super();
  }

  /** The last seq delivered (null before anything, from the head). */
  get watermark(): number | null {
    return this.client.core.watermark(this.conv);
  }

  get epoch(): string {
    return this.client.core.epoch(this.conv);
  }

  /** Whether it is still a subscription of the client (not unsubscribed, not ended by the node). */
  get active(): boolean {
    return this.client.core.subscribed(this.conv);
  }

  /** End it: no message of the conversation is delivered after this call. */
  unsubscribe(): void {
    this.client.unsubscribe(this.conv);
  }

  /**
   * Who is here (protocol 1.2, section 4.9): one page of members in byte
   * order of their user ids, and the count of every user present.
   * @throws ConvergerError not_subscribed, presence_disabled, unavailable (retryAfterMs), stopped
   */
  presence(query: PresenceQuery = {}): Promise<PresencePage> {
    return this.client.presence(this.conv, query);
  }

  /**
   * An ephemeral signal such as {typing: true} to whoever is subscribed now
   * (protocol 1.2, section 4.10): true when written to the connection,
   * false when the client has none now (signals are at most once).
   */
  signal(body: unknown): boolean {
    return this.client.signal(this.conv, body);
  }

  /** @internal */
  dispatch<K extends keyof SubscriptionEvents>(event: K, value: SubscriptionEvents[K]): void {
    this.emit(event, value);
  }
}

export class Client extends Emitter<ClientEvents> {
  /** @internal */
  readonly core: Core;
  private readonly WS: WebSocketConstructor;
  private readonly getToken?: ClientOptions["getToken"];
  private readonly storage: StorageLike;
  private readonly storageKey: string;
  private readonly now: () => number;
  private readonly sockets = new Map<number, WebSocketLike>();
  private readonly subs = new Map<string, Subscription>();
  private readonly saved: Snapshot; // what storage had at construction, kept up to date
  private timer: ReturnType<typeof setTimeout> | undefined;
  private timerAt = -1;
  private running = false;
  private started = false;
  private closing: (() => void)[] = [];

  /**
   * @throws TypeError without URLs, with one that is not an absolute ws://
   *   or wss:// URL (scheme in any case) or a mix of the two (Core's
   *   constructor), without a token or getToken, or without a WebSocket
   *   (Node 20: pass the `ws` package's)
   */
  constructor(options: ClientOptions) {
    super();
    const WS = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!WS) throw new TypeError("no WebSocket here: pass one as the WebSocket option (in Node 20, the ws package's)");
    this.WS = WS;
    this.getToken = options.getToken;
    this.storage = options.storage ?? new MemoryStorage();
    this.storageKey = options.storageKey ?? "converger-client";
    const perf = (globalThis as { performance?: { now(): number } }).performance;
    this.now = options.now ?? (perf ? () => perf.now() : () => Date.now());
    this.saved = load(this.storage, this.storageKey);
    const random = options.random ?? Math.random;
    const backoff = typeof options.backoff === "string" ? { strategy: options.backoff } : options.backoff;
    this.core = new Core(
      {
        urls: options.urls, token: options.token, refreshable: !!options.getToken, backoff, random,
        clientId: options.clientId ?? (this.saved.clientId || randomId(random)),
        connectTimeoutMs: options.connectTimeoutMs, clientName: options.clientName ?? "converger-client/js",
      },
      {
        message: (m) => {
          this.subs.get(m.conv)?.dispatch("message", m);
          this.emit("message", m);
        },
        synced: (conv, head) => this.subs.get(conv)?.dispatch("synced", head),
        subscribed: (s) => this.subs.get(s.conv)?.dispatch("subscribed", s),
        unsubscribed: (conv, reason) => {
          const sub = this.subs.get(conv);
          this.subs.delete(conv);
          delete this.saved.subs[conv];
          sub?.dispatch("unsubscribed", reason);
        },
        reset: (r) => {
          this.subs.get(r.conv)?.dispatch("reset", r);
          this.emit("reset", r);
        },
        join: (p) => this.subs.get(p.conv)?.dispatch("join", p),
        leave: (p) => this.subs.get(p.conv)?.dispatch("leave", p),
        signal: (s) => this.subs.get(s.conv)?.dispatch("signal", s),
        refreshed: (ms) => this.emit("refreshed", ms),
        state: (s) => this.emit("state", s),
        error: (code, message, conv) => {
          if (conv) this.subs.get(conv)?.dispatch("error", { code, message, conv });
          this.emit("error", { code, message, ...(conv ? { conv } : {}) });
        },
      },
    );
    this.saved.clientId = this.core.clientId;
    // the sends an earlier run left unacknowledged: out again at the first welcome
    for (const p of this.saved.sends) this.core.send(p.conv, p.id, p.body, (r) => this.sentEvent(p.conv, p.id, r));
  }

  /** This client instance's id (presence tells its clients apart by it). */
  get clientId(): string {
    return this.core.clientId;
  }

  /** "idle" before start, then "connecting", "connected", "waiting" or "stopped". */
  get state(): string {
    return this.core.current;
  }

  /**
   * Subscribe to `conv`, before or after start. The watermark kept in
   * storage (with its epoch) wins over `options.watermark`, so that a
   * reload resumes where the last run stopped. Calling it again for the
   * same conversation returns the same Subscription.
   */
  subscribe(conv: string, options: SubscribeOptions = {}): Subscription {
    let sub = this.subs.get(conv);
    if (sub) {
      if (options.presenceEvents !== undefined) this.core.subscribe(conv, options);
      this.run();
      return sub;
    }
    sub = new Subscription(this, conv);
    this.subs.set(conv, sub);
    const kept = this.saved.subs[conv];
    const o = kept && kept.watermark !== null ? { ...options, watermark: kept.watermark, epoch: kept.epoch } : options;
    this.core.subscribe(conv, o);
    this.run();
    return sub;
  }

  /** End the subscription of `conv` (also Subscription.unsubscribe). */
  unsubscribe(conv: string): void {
    this.core.unsubscribe(conv);
    this.run();
  }

  /** The subscription of `conv`, if any. */
  subscription(conv: string): Subscription | undefined {
    return this.subs.get(conv);
  }

  /**
   * Send `body` (any JSON value) to `conv`; resolves with its seq once the
   * node has committed it. Kept, and sent again with the same id after a
   * reconnect (or a reload, with storage), until then: the node stores it
   * once. `id` is the idempotency key (a random UUID by default).
   * @throws ConvergerError forbidden, not_found, channel_inactive, too_large, stopped
   */
  send(conv: string, body: unknown, options: { id?: string } = {}): Promise<{ seq: number; id: string }> {
    const id = options.id ?? newId();
    return new Promise((resolve, reject) => {
      this.core.send(conv, id, body, (r) => {
        this.sentEvent(conv, id, r);
        if ("seq" in r) resolve(r);
        else reject(new ConvergerError(r.error, r.message ?? ""));
      });
      this.run();
    });
  }

  /** The sends not acknowledged yet (those resumed from storage included). */
  pending(): { conv: string; id: string; body: unknown }[] {
    return this.core.pendingSends();
  }

  /** @internal */
  presence(conv: string, query: PresenceQuery): Promise<PresencePage> {
    return new Promise((resolve, reject) => {
      this.core.presence(conv, query, (r) => {
        if ("error" in r) reject(new ConvergerError(r.error, r.message ?? "", (r as { retryAfterMs?: number }).retryAfterMs));
        else resolve(r);
      });
      this.run();
    });
  }

  /** @internal */
  signal(conv: string, body: unknown): boolean {
    const written = this.core.signal(conv, body);
    this.run();
    return written;
  }

  /** Connect; the sends storage kept from an earlier run go out again once welcomed. */
  start(): void {
    if (this.started) return;
    this.started = true;
    this.core.start(this.now());
    this.run();
  }

  /**
   * Close every connection with 1000. Resolves once they are closed (at
   * most 2 s). Sends not acknowledged fail with "stopped" and stay in
   * storage for the next run. A stopped client does not start again.
   */
  stop(): Promise<void> {
    this.persist(); // the sends not acknowledged, for the next run
    this.core.stop(this.now());
    this.started = true;
    this.run();
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.sockets.size === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const t = setTimeout(done, 2000);
      const self = this;
      function done() {
        clearTimeout(t);
        for (const [id, ws] of self.sockets) {
          detach(ws);
          self.sockets.delete(id);
        }
        resolve();
      }
      this.closing.push(done);
    });
  }

  /** Counters since construction, and the node in use. */
  stats(): Stats {
    return this.core.stats(this.now());
  }

  // ---- running the core's actions -----------------------------------------

  private sentEvent(conv: string, id: string, r: SendResult): void {
    this.emit("sent", "seq" in r ? { conv, id, seq: r.seq } : { conv, id, error: r.error });
  }

  private run(): void {
    if (this.running) return; // the outer call takes what this one would
    this.running = true;
    try {
      for (let a = this.core.takeActions(); a.length; a = this.core.takeActions()) {
        for (const x of a) {
          if (x.type === "connect") {
            if (this.core.current !== "stopped") this.open(x.id, x.url); // a listener may have stopped it
          }
          else if (x.type === "send") this.sockets.get(x.id)?.send(x.text);
          else if (x.type === "close") this.closeSocket(x.id, x.code, x.reason);
          else this.fetchToken(x.reason);
        }
      }
    } finally {
      this.running = false;
    }
    if (this.core.takeDirty()) this.persist();
    this.arm();
  }

  private open(id: number, url: string): void {
    let ws: WebSocketLike;
    try {
      ws = new this.WS(url, SUBPROTOCOL);
    } catch (e) {
      setTimeout(() => this.feed(() => this.core.closed(id, 1006, `cannot connect: ${errText(e)}`, this.now())), 0);
      return;
    }
    this.sockets.set(id, ws);
    ws.onopen = () => this.feed(() => this.core.opened(id, this.now()));
    ws.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        const data = ev.data;
        this.feed(() => this.core.text(id, data, this.now()));
      }
    };
    ws.onerror = () => {}; // a close follows
    ws.onclose = (ev) => {
      this.sockets.delete(id);
      this.feed(() => this.core.closed(id, ev.code, ev.reason ?? "", this.now()));
      if (this.sockets.size === 0) for (const done of this.closing.splice(0)) done();
    };
    if (typeof ws.on === "function") ws.on("ping", () => this.feed(() => this.core.alive(id, this.now())));
  }

  private closeSocket(id: number, code: number, reason: string): void {
    const ws = this.sockets.get(id);
    if (!ws) return;
    try {
      ws.close(code, reason.slice(0, 120));
    } catch {
      ws.close(); // an implementation that refuses the code
    }
  }

  private fetchToken(reason: TokenReason): void {
    const get = this.getToken;
    if (!get) return;
    Promise.resolve()
      .then(() => get(reason))
      .then(
        (t) => this.feed(() => this.core.setToken(typeof t === "string" ? t : "", this.now())),
        (e) => this.feed(() => this.core.tokenFailed(this.now(), errText(e))),
      );
  }

  private feed(f: () => void): void {
    f();
    this.run();
  }

  private arm(): void {
    const at = this.core.current === "stopped" ? -1 : this.core.nextTimer();
    if (at === this.timerAt && this.timer !== undefined) return;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = at;
    if (at < 0) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.timerAt = -1;
      this.feed(() => this.core.tick(this.now()));
    }, Math.min(Math.max(0, at - this.now()), 2147483647)); // setTimeout's largest delay; tick is harmless early
  }

  private persist(): void {
    const now = this.core.snapshot();
    for (const [conv, w] of Object.entries(now.subs)) this.saved.subs[conv] = w;
    // a stopped core has let its sends go ("stopped"): storage keeps them for the next run
    if (this.core.current !== "stopped") this.saved.sends = now.sends;
    try {
      this.storage.setItem(this.storageKey, JSON.stringify(this.saved));
    } catch (e) {
      this.emit("error", { code: "storage", message: `cannot write the storage: ${errText(e)}` });
    }
  }
}

function load(storage: StorageLike, key: string): Snapshot {
  const empty: Snapshot = { clientId: "", subs: {}, sends: [] };
  let raw: string | null = null;
  try {
    raw = storage.getItem(key);
  } catch {
    return empty;
  }
  if (!raw) return empty;
  try {
    const v = JSON.parse(raw);
    return {
      clientId: typeof v.clientId === "string" ? v.clientId : "",
      subs: v.subs && typeof v.subs === "object" ? v.subs : {},
      sends: Array.isArray(v.sends) ? v.sends.filter((s: { conv?: unknown; id?: unknown }) => typeof s?.conv === "string" && typeof s?.id === "string") : [],
    };
  } catch {
    return empty; // not ours, or damaged: start afresh rather than fail
  }
}

function detach(ws: WebSocketLike): void {
  ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
}

function errText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function newId(): string {
  const c = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  return c?.randomUUID ? c.randomUUID() : randomId(Math.random);
}
