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
