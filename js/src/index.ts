/**
 * converger-client: the JavaScript/TypeScript client of converger
 * (docs/protocol.md): so far the sans-I/O core (core.ts), its reconnect
 * backoff and its random source.
 */
export { Core, CONNECT_TIMEOUT_MS, hintOf } from "./core.js";
export type { Action, CoreEvents, CoreOptions, Message, State } from "./core.js";
export { Backoff, BACKOFF_DEFAULTS, expCeiling } from "./backoff.js";
export type { BackoffOptions, BackoffStrategy } from "./backoff.js";
export { randomRange, seededRandom } from "./random.js";
export type { Random } from "./random.js";
