/**
 * converger-client: the JavaScript/TypeScript client of converger
 * (docs/protocol.md), for browsers and Node 20 or later.
 *
 *   Client        the client over a WebSocket (client.ts)
 *   Core          its sans-I/O core: events in, actions out (core.ts)
 *   Backoff       the reconnect delay (backoff.ts)
 *   MemoryStorage, browserStorage   where watermarks and sends are kept
 */
export { Client, ConvergerError, Subscription, SUBPROTOCOL } from "./client.js";
export type {
  ClientEvents, ClientOptions, ErrorEvent, SentEvent, SubscriptionEvents, TokenReason, WebSocketConstructor,
  WebSocketLike,
} from "./client.js";
export { Core, CONNECT_TIMEOUT_MS, DEFAULT_HEARTBEAT_MS, hintOf, randomId } from "./core.js";
export type {
  Action, CoreEvents, CoreOptions, Message, PresenceChange, PresenceEvents, PresencePage, PresenceQuery, Reset,
  SendResult, Signal, Snapshot, State, StateEvent, Stats, SubscribeOptions, Subscribed,
} from "./core.js";
export { MemoryStorage, browserStorage } from "./storage.js";
export type { StorageLike } from "./storage.js";
export { Backoff, BACKOFF_DEFAULTS, expCeiling } from "./backoff.js";
export type { BackoffOptions, BackoffStrategy } from "./backoff.js";
export { randomRange, seededRandom } from "./random.js";
export type { Random } from "./random.js";
