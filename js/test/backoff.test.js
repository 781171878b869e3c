// The backoff's rules, with a seeded random source: the same bounds and
// defaults as the C library's (client/backoff.h, tests/unit/test_backoff.c).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Backoff, expCeiling, seededRandom, randomRange } from "../dist/index.js";

const RUNS = 2000;

test("defaults: decorrelated, 250 ms to 10 s", () => {
  const b = new Backoff();
  assert.equal(b.strategy, "decorrelated");
  assert.equal(b.baseMs, 250);
  assert.equal(b.capMs, 10000);
});

test("the exponential ceiling doubles from base and stops at cap", () => {
  assert.deepEqual([0, 1, 2, 3, 6, 7, 60].map((n) => expCeiling(250, 10000, n)),
                   [250, 500, 1000, 2000, 10000, 10000, 10000]);
});

test("full jitter: in [0, c) for every attempt", () => {
  for (let seed = 1; seed <= 20; seed++) {
    const b = new Backoff({ strategy: "full" }, seededRandom(seed));
    for (let n = 0; n < 12; n++) {
      const d = b.next();
      assert.ok(d >= 0 && d < expCeiling(250, 10000, n), `attempt ${n}: ${d}`);
    }
  }
});

test("equal jitter: in [c/2, c]", () => {
  const b = new Backoff({ strategy: "equal" }, seededRandom(7));
  for (let n = 0; n < 12; n++) {
    const c = expCeiling(250, 10000, n);
    const d = b.next();
    assert.ok(d >= c / 2 && d <= c, `attempt ${n}: ${d} not in [${c / 2}, ${c}]`);
  }
});

test("decorrelated jitter: in [base, min(cap, 3 * previous)], and it spreads", () => {
  const random = seededRandom(42);
  const firsts = new Set();
  for (let run = 0; run < RUNS / 10; run++) {
    const b = new Backoff({}, random);
    let prev = 250;
    for (let n = 0; n < 15; n++) {
      const d = b.next();
      assert.ok(d >= 250 && d <= Math.min(10000, 3 * prev), `attempt ${n}: ${d} after ${prev}`);
      if (n === 0) firsts.add(d);
      prev = Math.max(d, 250);
    }
  }
  assert.ok(firsts.size > 50, "first delays are spread, not synchronised");
});

// Issue 31: 10 000 clients with one seeded source, every attempt 1..30. The
// old decorrelated jitter, min(cap, random in [base, 3 * previous]), put 31 %
// of them on the cap's one millisecond at attempt 10 and 36 % at attempt 30.
const CLIENTS = 10000;
const ATTEMPTS = 30;

/** The mean of each attempt 1..30 of min(cap, ...) over 100 000 clients, the defaults. */
function oldMeans() {
  const random = seededRandom(31);
  const prev = new Array(100000).fill(250);
  const means = [0];
  for (let a = 1; a <= ATTEMPTS; a++) {
    let sum = 0;
    for (let i = 0; i < prev.length; i++) {
      prev[i] = Math.min(randomRange(random, 250, 3 * Math.max(prev[i], 250)), 10000);
      sum += prev[i];
    }
    means.push(sum / prev.length);
  }
  return means;
}

// At every attempt: within the strategy's bounds; no 1 ms bucket over 1 % of
// the clients (or over 1.5 times a uniform share where the attempt's range
// has fewer than 150 values: equal jitter's first is 126 ms wide); for
// decorrelated, the mean within 5 % of min(cap, ...)'s (the C library's test
// is the same: tests/unit/test_backoff.c).
function checkPopulation(strategy) {
  const random = seededRandom(2025);
  const clients = Array.from({ length: CLIENTS }, () => new Backoff({ strategy }, random));
  const old = strategy === "decorrelated" ? oldMeans() : null;
  const prev = new Array(CLIENTS).fill(250);
  for (let a = 1; a <= ATTEMPTS; a++) {
    const c = expCeiling(250, 10000, a - 1);
    const [lo, hi] = strategy === "full" ? [0, c - 1] : strategy === "equal" ? [Math.floor(c / 2), c] : [250, 10000];
    const bucket = new Map();
    let sum = 0;
    for (let i = 0; i < CLIENTS; i++) {
      const d = clients[i].next();
      assert.ok(Number.isInteger(d) && d >= lo && d <= hi, `${strategy} attempt ${a}: ${d} not in [${lo}, ${hi}]`);
      if (strategy === "decorrelated") assert.ok(d <= 3 * prev[i], `attempt ${a}: ${d} after ${prev[i]}`);
      prev[i] = d;
      bucket.set(d, (bucket.get(d) ?? 0) + 1);
      sum += d;
    }
    const span = hi - lo + 1;
    const limit = span >= 150 ? CLIENTS / 100 : Math.floor((CLIENTS * 3) / (2 * span));
    const [at, most] = [...bucket].reduce((m, e) => (e[1] > m[1] ? e : m));
    assert.ok(most <= limit, `${strategy} attempt ${a}: ${most} of ${CLIENTS} clients at ${at} ms`);
    if (old) {
      const mean = sum / CLIENTS;
      assert.ok(Math.abs(mean - old[a]) <= 0.05 * old[a], `attempt ${a}: mean ${mean}, min(cap, ...)'s ${old[a]}`);
    }
  }
}

test("decorrelated jitter over 10 000 clients: no millisecond holds 1 %, the mean stays close", () => {
  checkPopulation("decorrelated");
});

test("full and equal jitter over 10 000 clients: no millisecond holds 1 %", () => {
  checkPopulation("full");
  checkPopulation("equal");
});

test("decorrelated: a draw above the cap lands in the band below it", () => {
  const b = new Backoff({ baseMs: 100, capMs: 2100 }, () => 0.999999); // every draw at its top
  assert.equal(b.next(), 300);
  assert.equal(b.next(), 900);
  assert.equal(b.next(), 2100); // 2700 > cap: the band [2100 - 100, 2100], at its top
  let n = 0;
  const low = new Backoff({ baseMs: 100, capMs: 2100 }, () => (n++ < 3 ? 0.999999 : 0)); // then the band's bottom
  low.next();
  low.next();
  assert.equal(low.next(), 2000); // cap - floor((cap - base) / 20)
});

test("a retry hint is a floor, never lowered by jitter", () => {
  const b = new Backoff({ strategy: "full" }, seededRandom(3));
  for (let i = 0; i < 50; i++) assert.ok(b.next(4321) >= 4321);
  const c = new Backoff({}, () => 0.999999);
  c.next();
  assert.equal(c.next(60000), 60000); // a hint above the cap is kept
});

test("reset after a welcome starts from the first attempt again", () => {
  const b = new Backoff({ strategy: "equal" }, () => 0.5);
  for (let i = 0; i < 8; i++) b.next();
  b.reset();
  const d = b.next();
  assert.ok(d >= 125 && d <= 250, `${d}`);
});

test("custom bounds, and bad options refused", () => {
  const b = new Backoff({ strategy: "full", baseMs: 100, capMs: 400 }, seededRandom(9));
  for (let i = 0; i < 30; i++) assert.ok(b.next() < 400);
  assert.equal(new Backoff({ baseMs: 500, capMs: 100 }).capMs, 500); // cap at least base
  assert.throws(() => new Backoff({ strategy: "linear" }), /decorrelated, full or equal/);
  assert.throws(() => new Backoff({ baseMs: 0 }), /positive/);
  assert.throws(() => new Backoff({ capMs: -1 }), /positive/);
});

test("randomRange stays in range, even with a broken source", () => {
  const r = seededRandom(11);
  for (let i = 0; i < RUNS; i++) {
    const v = randomRange(r, 3, 9);
    assert.ok(Number.isInteger(v) && v >= 3 && v <= 9);
  }
  assert.equal(randomRange(() => NaN, 5, 10), 5);
  assert.equal(randomRange(() => 1, 5, 10), 5);
  assert.equal(randomRange(r, 7, 7), 7);
});
