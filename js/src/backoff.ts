/**
 * The reconnect delay of the client, with the C library's rules and
 * defaults (client/backoff.h):
 *
 *  - n = attempts since the last welcome, c = min(cap, base * 2^n);
 *  - "full": random in [0, c); "equal": c/2 + random in [0, c/2];
 *    "decorrelated" (the default; the reconnect-storm post-mortem's first
 *    action item): random in [base, 3 * previous], and a draw above the
 *    cap drawn again in [cap - floor((cap - base) / 20), cap], so that the
 *    clients at the cap are spread, not all on its one millisecond
 *    (docs/protocol.md section 8; common/jitter.c);
 *  - base 250 ms, cap 10 000 ms (the admission-queue decision record
 *    lowered the cap from 30 s to 10 s);
 *  - a server's retry hint (retryAfterMs of an `error` frame, or of a
 *    1012/1013 close reason) is a floor: the delay is max(hint, backoff).
 */
import { Random, randomRange } from "./random.js";

export type BackoffStrategy = "decorrelated" | "full" | "equal";

export interface BackoffOptions {
  strategy?: BackoffStrategy;
  /** The first ceiling, ms (default 250). */
  baseMs?: number;
  /** The largest delay, ms (default 10 000). */
  capMs?: number;
}

export const BACKOFF_DEFAULTS = { strategy: "decorrelated", baseMs: 250, capMs: 10000 } as const;

/** A decorrelated draw above the cap is drawn again in [cap - floor((cap - base) / CAP_BAND_DIV), cap]. */
export const CAP_BAND_DIV = 20;

/** min(cap, base * 2^attempt), ms. */
export function expCeiling(baseMs: number, capMs: number, attempt: number): number {
  let d = baseMs;
  for (let i = 0; i < attempt && d < capMs; i++) d *= 2;
  return d < capMs ? d : capMs;
}

export class Backoff {
  readonly strategy: BackoffStrategy;
  readonly baseMs: number;
  readonly capMs: number;
  private attempt = 0;
  private prevMs: number;

  /**
   * @param random the random source (Math.random, or seededRandom in tests)
   * @throws TypeError for an unknown strategy or a bound that is not a
   *   positive number
   */
  constructor(options: BackoffOptions = {}, private readonly random: Random = Math.random) {
    const strategy = options.strategy ?? BACKOFF_DEFAULTS.strategy;
    if (strategy !== "decorrelated" && strategy !== "full" && strategy !== "equal")
      throw new TypeError(`backoff strategy must be decorrelated, full or equal, not ${strategy}`);
    const baseMs = options.baseMs ?? BACKOFF_DEFAULTS.baseMs;
    const capMs = options.capMs ?? BACKOFF_DEFAULTS.capMs;
    if (!(baseMs > 0) || !(capMs > 0))
      throw new TypeError("backoff baseMs and capMs must be positive numbers of ms");
    this.strategy = strategy;
    this.baseMs = Math.round(baseMs);
    this.capMs = Math.max(Math.round(capMs), this.baseMs);
    this.prevMs = this.baseMs;
  }

  /**
   * The delay before the next attempt, ms, and the attempt counted.
   * `hintMs` (0 or absent: none) is the server's retry hint, a floor.
   */
  next(hintMs = 0): number {
    const n = Math.min(this.attempt, 62);
    let d: number;
    if (this.strategy === "full") {
      const c = expCeiling(this.baseMs, this.capMs, n);
      d = randomRange(this.random, 0, c - 1);
    } else if (this.strategy === "equal") {
      const c = expCeiling(this.baseMs, this.capMs, n);
      d = Math.floor(c / 2) + randomRange(this.random, 0, c - Math.floor(c / 2));
    } else {
      const prev = Math.max(this.prevMs, this.baseMs);
      d = randomRange(this.random, this.baseMs, prev * 3);
      if (d > this.capMs) {
        // not min(cap, d): that would put every draw above the cap on one millisecond
        d = randomRange(this.random, this.capMs - Math.floor((this.capMs - this.baseMs) / CAP_BAND_DIV), this.capMs);
      }
    }
    this.prevMs = Math.max(d, this.baseMs);
    this.attempt++;
    return hintMs > d ? hintMs : d;
  }

  /** A welcome: the next delay starts again from the first attempt. */
  reset(): void {
    this.attempt = 0;
    this.prevMs = this.baseMs;
  }
}
