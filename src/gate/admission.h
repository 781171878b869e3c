/*
 * admission: the per-node admission queue for handshake and sync store work
 * (the admission-queue decision record, seed 000, option 1).
 *
 * `slots` callers may hold a slot at once; the others wait in arrival
 * order. A waiter still waiting after `queue_ms`, or arriving while
 * `queue_max` callers already wait, is refused (overloaded). A slot belongs
 * to its caller's waiter struct until admission_release: the owner releases
 * it when its store job returns or fails, and when its connection closes,
 * whether it is still waiting or already holding.
 *
 * No per-waiter timer: in FIFO order the oldest waiter expires first, so
 * the queue asks for one timer at the oldest waiter's deadline through the
 * `arm` hook, and admission_expire() refuses every waiter past its time.
 * The clock is the caller's (monotonic ms), so tests run on a fake one.
 *
 * Waiters are embedded in the caller's struct (intrusive list): acquire and
 * release allocate nothing and cost O(1).
 *
 * Loop thread only.
 */
#ifndef CONVERGER_GATE_ADMISSION_H
#define CONVERGER_GATE_ADMISSION_H

#include <stdint.h>

typedef struct admission_s admission_t;
typedef struct admission_waiter_s admission_waiter_t;

/* A queued waiter's outcome: status 0 with a slot held (release it later),
 * or -CV_EBUSY (overloaded: waited queue_ms) with nothing held. `waited_ms`
 * is the time spent in the queue. */
typedef void (*admission_cb)(admission_waiter_t *w, int status, uint64_t waited_ms);

typedef enum { ADMISSION_IDLE = 0, ADMISSION_WAITING, ADMISSION_HOLDING } admission_state_t;

struct admission_waiter_s {
  admission_waiter_t *next, *prev; /* in the wait queue */
  admission_cb cb;
  uint64_t since_ms; /* when it started waiting */
  uint8_t state;     /* admission_state_t */
};

/* The outcomes of admission_acquire. */
#define ADMISSION_GRANTED 0 /* a slot is held now; no callback */
#define ADMISSION_QUEUED  1 /* waiting: `cb` runs once, unless released first */

/* Asks the owner to call admission_expire at `at_ms` (monotonic ms; -1:
 * no timer needed). Replaces the previous request. */
typedef void (*admission_arm_cb)(void *ud, int64_t at_ms);

/* A queue of `slots` (>= 1) slots; waiters expire after `queue_ms` (> 0);
 * at most `queue_max` (>= 0) wait. `arm` (may be NULL) with `ud` is called
 * when the oldest waiter's deadline changes. Returns NULL when out of
 * memory. */
admission_t *admission_new(int slots, uint64_t queue_ms, int queue_max, admission_arm_cb arm,
                           void *ud);
/* Free the queue. No waiter may be waiting or holding any more. */
void admission_free(admission_t *a);

/* Take a slot for `w` (ADMISSION_IDLE) at `now_ms`: ADMISSION_GRANTED,
 * ADMISSION_QUEUED (then `cb` runs exactly once, from admission_release of
 * another waiter or from admission_expire, unless `w` is released first),
 * or -CV_EBUSY when queue_max waiters already wait (cb not called; `w`
 * stays idle). -CV_EINVAL when `w` is not idle. */
int admission_acquire(admission_t *a, admission_waiter_t *w, uint64_t now_ms, admission_cb cb);

/* Give back what `w` has: a held slot goes to the oldest waiter (whose
 * callback runs before this returns), a waiting `w` leaves the queue
 * without its callback. No-op for an idle `w`. `w` is idle afterwards. */
void admission_release(admission_t *a, admission_waiter_t *w, uint64_t now_ms);

/* Refuse every waiter that has waited queue_ms or longer at `now_ms`
 * (their callbacks run with -CV_EBUSY), then re-arm. */
void admission_expire(admission_t *a, uint64_t now_ms);

/* Slots held and callers waiting. */
int admission_in_use(const admission_t *a);
int admission_waiting(const admission_t *a);

/* The number of slots: `configured` when > 0, else half of `pool_size`, at
 * least 1 (the decision record's default, handshake_concurrency = 0). */
int admission_default_slots(int configured, int pool_size);

#endif
