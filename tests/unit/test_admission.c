/* Unit tests for the admission queue (src/gate/admission.c), on a fake
 * clock: the slot limit, FIFO order, expiry after queue_ms, a full queue,
 * release after a failed job and on a connection closed while waiting or
 * holding, the one timer at the oldest deadline, and no slot leak after
 * 100 000 random acquire/release/expire steps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/errors.h"
#include "common/jitter.h"
#include "gate/admission.h"

typedef struct {
  admission_waiter_t w;
  int id;
  int calls;  /* callback runs */
  int status; /* last callback status */
  uint64_t waited;
} caller_t;

static int order[64], norder;
static int64_t armed = -2;

static void on_arm(void *ud, int64_t at) { armed = at; }

static void on_admit(admission_waiter_t *w, int status, uint64_t waited_ms) {
  caller_t *c = (caller_t *)w; /* w is the first member */
  c->calls++;
  c->status = status;
  c->waited = waited_ms;
  if (status == 0 && norder < 64) order[norder++] = c->id;
}

static void test_limit_and_fifo_order(void **state) {
  admission_t *a = admission_new(2, 10000, 100, on_arm, NULL);
  caller_t c[6];
  memset(c, 0, sizeof c);
  norder = 0;
  for (int i = 0; i < 6; i++) c[i].id = i;
  assert_int_equal(admission_acquire(a, &c[0].w, 0, on_admit), ADMISSION_GRANTED);
  assert_int_equal(admission_acquire(a, &c[1].w, 0, on_admit), ADMISSION_GRANTED);
  for (int i = 2; i < 6; i++)
    assert_int_equal(admission_acquire(a, &c[i].w, (uint64_t)i, on_admit), ADMISSION_QUEUED);
  assert_int_equal(admission_in_use(a), 2);
  assert_int_equal(admission_waiting(a), 4);
  assert_int_equal(armed, 2 + 10000); /* the oldest waiter's deadline */
  assert_int_equal(admission_acquire(a, &c[2].w, 7, on_admit), -CV_EINVAL); /* not idle */
  admission_release(a, &c[1].w, 100);
  assert_int_equal(c[2].calls, 1);
  assert_int_equal(c[2].status, 0);
  assert_int_equal(c[2].waited, 98);
  assert_int_equal(armed, 3 + 10000);
  admission_release(a, &c[0].w, 101);
  admission_release(a, &c[2].w, 102);
  assert_int_equal(norder, 3);
  assert_int_equal(order[0], 2);
  assert_int_equal(order[1], 3);
  assert_int_equal(order[2], 4);
  assert_int_equal(admission_waiting(a), 1);
  admission_release(a, &c[3].w, 103);
  assert_int_equal(order[3], 5);
  admission_release(a, &c[4].w, 104);
  assert_int_equal(admission_in_use(a), 1); /* c[5] still holds */
  admission_release(a, &c[5].w, 106);
  assert_int_equal(admission_in_use(a), 0);
  assert_int_equal(armed, -1);
  admission_release(a, &c[5].w, 107); /* idle: no-op */
  assert_int_equal(admission_in_use(a), 0);
  admission_free(a);
}

static void test_expiry_refuses_the_oldest_first(void **state) {
  admission_t *a = admission_new(1, 1000, 100, on_arm, NULL);
  caller_t c[4];
  memset(c, 0, sizeof c);
  assert_int_equal(admission_acquire(a, &c[0].w, 0, on_admit), ADMISSION_GRANTED);
  assert_int_equal(admission_acquire(a, &c[1].w, 10, on_admit), ADMISSION_QUEUED);
  assert_int_equal(admission_acquire(a, &c[2].w, 500, on_admit), ADMISSION_QUEUED);
  assert_int_equal(admission_acquire(a, &c[3].w, 900, on_admit), ADMISSION_QUEUED);
  assert_int_equal(armed, 1010);
  admission_expire(a, 1009); /* early: nothing */
  assert_int_equal(c[1].calls, 0);
  assert_int_equal(armed, 1010);
  admission_expire(a, 1500);
  assert_int_equal(c[1].calls, 1);
  assert_int_equal(c[1].status, -CV_EBUSY);
  assert_int_equal(c[1].waited, 1490);
  assert_int_equal(c[2].calls, 1);
  assert_int_equal(c[2].status, -CV_EBUSY);
  assert_int_equal(c[3].calls, 0);
  assert_int_equal(armed, 1900);
  assert_int_equal(admission_waiting(a), 1);
  /* refused waiters are idle again and may retry */
  assert_int_equal(c[1].w.state, ADMISSION_IDLE);
  admission_release(a, &c[0].w, 1600);
  assert_int_equal(c[3].status, 0);
  admission_release(a, &c[3].w, 1601);
  assert_int_equal(admission_in_use(a), 0);
  admission_free(a);
}

static void test_full_queue_is_refused_at_once(void **state) {
  admission_t *a = admission_new(1, 1000, 2, NULL, NULL);
  caller_t c[4];
  memset(c, 0, sizeof c);
  assert_int_equal(admission_acquire(a, &c[0].w, 0, on_admit), ADMISSION_GRANTED);
  assert_int_equal(admission_acquire(a, &c[1].w, 0, on_admit), ADMISSION_QUEUED);
  assert_int_equal(admission_acquire(a, &c[2].w, 0, on_admit), ADMISSION_QUEUED);
  assert_int_equal(admission_acquire(a, &c[3].w, 0, on_admit), -CV_EBUSY);
  assert_int_equal(c[3].w.state, ADMISSION_IDLE);
  assert_int_equal(c[3].calls, 0);
  admission_t *none = admission_new(1, 1000, 0, NULL, NULL); /* queue_max 0: no waiting */
  caller_t d[2];
  memset(d, 0, sizeof d);
  assert_int_equal(admission_acquire(none, &d[0].w, 0, on_admit), ADMISSION_GRANTED);
  assert_int_equal(admission_acquire(none, &d[1].w, 0, on_admit), -CV_EBUSY);
  admission_release(none, &d[0].w, 1);
  admission_free(none);
  for (int i = 0; i < 3; i++) admission_release(a, &c[i].w, 5);
  assert_int_equal(admission_in_use(a), 0);
  assert_int_equal(admission_waiting(a), 0);
  admission_free(a);
}

static void test_release_on_failure_and_on_close(void **state) {
  admission_t *a = admission_new(1, 1000, 10, on_arm, NULL);
  caller_t c[3];
  memset(c, 0, sizeof c);
  assert_int_equal(admission_acquire(a, &c[0].w, 0, on_admit), ADMISSION_GRANTED);
  assert_int_equal(admission_acquire(a, &c[1].w, 1, on_admit), ADMISSION_QUEUED);
  assert_int_equal(admission_acquire(a, &c[2].w, 2, on_admit), ADMISSION_QUEUED);
  /* c[1]'s connection closes while it waits: it leaves without a callback */
  admission_release(a, &c[1].w, 3);
  assert_int_equal(c[1].calls, 0);
  assert_int_equal(admission_waiting(a), 1);
  assert_int_equal(armed, 2 + 1000);
  /* c[0]'s job fails: the slot goes to c[2] */
  admission_release(a, &c[0].w, 4);
  assert_int_equal(c[2].calls, 1);
  assert_int_equal(c[2].status, 0);
  /* c[2]'s connection closes while its job runs */
  admission_release(a, &c[2].w, 5);
  assert_int_equal(admission_in_use(a), 0);
  assert_int_equal(armed, -1);
  admission_free(a);
}

static void test_default_slots(void **state) {
  assert_int_equal(admission_default_slots(0, 20), 10);
  assert_int_equal(admission_default_slots(0, 1), 1);
  assert_int_equal(admission_default_slots(0, 2), 1);
  assert_int_equal(admission_default_slots(7, 20), 7);
}

/* ---- random sequences ---------------------------------------------------------------- */

#define N 64

static admission_t *ra;
static caller_t rc[N];
static int granted_by_cb;

static void on_random(admission_waiter_t *w, int status, uint64_t waited_ms) {
  caller_t *c = (caller_t *)w;
  c->calls++;
  c->status = status;
  assert_true(status == 0 ? w->state == ADMISSION_HOLDING : w->state == ADMISSION_IDLE);
  if (status == 0) granted_by_cb++;
}

static void check_invariants(int slots) {
  int holding = 0, waiting = 0;
  for (int i = 0; i < N; i++) {
    holding += rc[i].w.state == ADMISSION_HOLDING;
    waiting += rc[i].w.state == ADMISSION_WAITING;
  }
  assert_int_equal(holding, admission_in_use(ra));
  assert_int_equal(waiting, admission_waiting(ra));
  assert_true(holding <= slots);
  assert_true(waiting == 0 || holding == slots); /* nobody waits beside a free slot */
}

static void test_random_sequences_leak_no_slot(void **state) {
  jitter_rng_t rng;
  jitter_seed(&rng, 2026);
  const int slots = 5;
  ra = admission_new(slots, 50, 20, NULL, NULL);
  memset(rc, 0, sizeof rc);
  uint64_t now = 0;
  for (int step = 0; step < 100000; step++) {
    caller_t *c = &rc[jitter_range(&rng, 0, N - 1)];
    now += (uint64_t)jitter_range(&rng, 0, 3);
    switch (jitter_range(&rng, 0, 3)) {
    case 0:
    case 1: /* a hello or a sync arrives */
      if (c->w.state == ADMISSION_IDLE) {
        int r = admission_acquire(ra, &c->w, now, on_random);
        assert_true(r == ADMISSION_GRANTED || r == ADMISSION_QUEUED || r == -CV_EBUSY);
      }
      break;
    case 2: /* its job returns or fails, or its connection closes */
      admission_release(ra, &c->w, now);
      break;
    case 3:
      admission_expire(ra, now);
      break;
    }
    check_invariants(slots);
  }
  for (int i = 0; i < N; i++) admission_release(ra, &rc[i].w, now);
  /* releasing holders hands slots to waiters, which are released in turn */
  for (int i = 0; i < N; i++) admission_release(ra, &rc[i].w, now);
  assert_int_equal(admission_in_use(ra), 0);
  assert_int_equal(admission_waiting(ra), 0);
  assert_true(granted_by_cb > 0);
  admission_free(ra);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_limit_and_fifo_order),
      cmocka_unit_test(test_expiry_refuses_the_oldest_first),
      cmocka_unit_test(test_full_queue_is_refused_at_once),
      cmocka_unit_test(test_release_on_failure_and_on_close),
      cmocka_unit_test(test_default_slots),
      cmocka_unit_test(test_random_sequences_leak_no_slot),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
