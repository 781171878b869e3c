/*
 * admission.c: slots and a FIFO of waiters (see gate/admission.h).
 *
 * Invariants: in_use <= slots; a waiter is in the list iff its state is
 * WAITING; the list is in arrival order, so its head is the oldest and the
 * first to expire; waiters wait only while every slot is held (a released
 * slot goes to the head at once).
 */
#include "gate/admission.h"

#include <stdlib.h>

#include "core/errors.h"

struct admission_s {
  int slots, in_use, waiting, queue_max;
  uint64_t queue_ms;
  admission_waiter_t *head, *tail;
  admission_arm_cb arm;
  void *ud;
  int64_t armed_at; /* last deadline given to `arm`, -1 none */
};

admission_t *admission_new(int slots, uint64_t queue_ms, int queue_max, admission_arm_cb arm,
                           void *ud) {
  admission_t *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->slots = slots > 0 ? slots : 1;
  a->queue_ms = queue_ms > 0 ? queue_ms : 1;
  a->queue_max = queue_max > 0 ? queue_max : 0;
  a->arm = arm;
  a->ud = ud;
  a->armed_at = -1;
  return a;
}

void admission_free(admission_t *a) { free(a); }

static void rearm(admission_t *a) {
  int64_t at = a->head ? (int64_t)(a->head->since_ms + a->queue_ms) : -1;
  if (at == a->armed_at) return;
  a->armed_at = at;
  if (a->arm) a->arm(a->ud, at);
}

static void unlink_waiter(admission_t *a, admission_waiter_t *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    a->head = w->next;
  if (w->next)
    w->next->prev = w->prev;
  else
    a->tail = w->prev;
  w->next = w->prev = NULL;
  a->waiting--;
}

int admission_acquire(admission_t *a, admission_waiter_t *w, uint64_t now_ms, admission_cb cb) {
  if (w->state != ADMISSION_IDLE) return -CV_EINVAL;
  if (a->in_use < a->slots) {
    a->in_use++;
    w->state = ADMISSION_HOLDING;
    return ADMISSION_GRANTED;
  }
  if (a->waiting >= a->queue_max) return -CV_EBUSY;
  w->cb = cb;
  w->since_ms = now_ms;
  w->state = ADMISSION_WAITING;
  w->next = NULL;
  w->prev = a->tail;
  if (a->tail)
    a->tail->next = w;
  else
    a->head = w;
  a->tail = w;
  a->waiting++;
  rearm(a);
  return ADMISSION_QUEUED;
}

void admission_release(admission_t *a, admission_waiter_t *w, uint64_t now_ms) {
  if (w->state == ADMISSION_WAITING) {
    unlink_waiter(a, w);
    w->state = ADMISSION_IDLE;
    rearm(a);
    return;
  }
  if (w->state != ADMISSION_HOLDING) return;
  w->state = ADMISSION_IDLE;
  admission_waiter_t *next = a->head;
  if (!next) {
    a->in_use--;
    return;
  }
  /* The slot passes to the oldest waiter; in_use does not change. */
  unlink_waiter(a, next);
  next->state = ADMISSION_HOLDING;
  rearm(a);
  next->cb(next, 0, now_ms > next->since_ms ? now_ms - next->since_ms : 0);
}

void admission_expire(admission_t *a, uint64_t now_ms) {
  a->armed_at = -1; /* the timer fired */
  while (a->head && now_ms >= a->head->since_ms + a->queue_ms) {
    admission_waiter_t *w = a->head;
    unlink_waiter(a, w);
    w->state = ADMISSION_IDLE;
    w->cb(w, -CV_EBUSY, now_ms - w->since_ms);
  }
  rearm(a);
}

int admission_in_use(const admission_t *a) { return a->in_use; }

int admission_waiting(const admission_t *a) { return a->waiting; }

int admission_default_slots(int configured, int pool_size) {
  if (configured > 0) return configured;
  return pool_size / 2 > 0 ? pool_size / 2 : 1;
}
