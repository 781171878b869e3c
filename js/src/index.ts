/**
 * converger-client: the JavaScript/TypeScript client of converger
 * (docs/protocol.md). This first part holds the reconnect backoff and the
 * random source the sans-I/O core builds on.
 */
export { Backoff, BACKOFF_DEFAULTS, expCeiling } from "./backoff.js";
export type { BackoffOptions, BackoffStrategy } from "./backoff.js";
export { randomRange, seededRandom } from "./random.js";
export type { Random } from "./random.js";
