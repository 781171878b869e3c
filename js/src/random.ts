/**
 * The random source of the client: a function that returns a float in
 * [0, 1), as Math.random does. The core takes one so that tests can make
 * every jittered delay reproducible (the C library's jitter_rng_t plays the
 * same part).
 */
export type Random = () => number;

/** A uniform integer in [lo, hi] (lo when hi <= lo), from `random`. */
export function randomRange(random: Random, lo: number, hi: number): number {
  if (hi <= lo) return lo;
  const span = hi - lo + 1;
  let r = random();
  if (!(r >= 0 && r < 1)) r = 0; // a broken source must not make NaN delays
  return lo + Math.floor(r * span);
}

/**
 * A small seeded generator (mulberry32) for tests and reproducible
 * experiments; not for anything that needs unpredictability.
 */
export function seededRandom(seed: number): Random {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
