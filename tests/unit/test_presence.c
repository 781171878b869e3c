/* Unit tests for proto/presence: the presence table of one node, a data
 * structure without I/O. The clock is the `now` each call is given: wall
 * ms for a join's `since`, monotonic ms for the grace. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/errors.h"
#include "proto/presence.h"

#define GRACE 5000
#define WALL  1800000000000LL /* a wall time for `since` */

/* ---- what presence_expire reported ------------------------------------------ */

#define LEFT_MAX 64

typedef struct {
  char conv[STORE_ID_MAX + 1], user[STORE_ID_MAX + 1], client[STORE_ID_MAX + 1];
  int last;
} left_t;

typedef struct {
  left_t left[LEFT_MAX];
  int n;
} leaves_t;

static void on_leave(void *ud, const char *conv, const char *user, const char *client, int last) {
  leaves_t *l = ud;
  assert_true(l->n < LEFT_MAX);
  left_t *e = &l->left[l->n++];
  snprintf(e->conv, sizeof e->conv, "%s", conv);
  snprintf(e->user, sizeof e->user, "%s", user);
  snprintf(e->client, sizeof e->client, "%s", client);
  e->last = last;
}

static void expect_left(const leaves_t *l, int i, const char *conv, const char *user,
                        const char *client, int last) {
  assert_true(i < l->n);
  assert_string_equal(l->left[i].conv, conv);
  assert_string_equal(l->left[i].user, user);
  assert_string_equal(l->left[i].client, client);
  assert_int_equal(l->left[i].last, last);
}

/* presence_list with every out argument, for the tests below. */
typedef struct {
  store_member_t *m;
  size_t n;
  int64_t count;
  int more;
} page_t;

static page_t list(const presence_t *p, const char *conv, const char *after, int limit, int max) {
  page_t pg;
  assert_int_equal(presence_list(p, conv, after, limit, max, &pg.m, &pg.n, &pg.count, &pg.more), 0);
  return pg;
}

/* ---- tests -------------------------------------------------------------------- */

static void test_new_and_free(void **state) {
  assert_null(presence_new(-1));
  presence_t *p = presence_new(0);
  assert_non_null(p);
  assert_int_equal(presence_entries(p), 0);
  assert_false(presence_has(p, "c", "alice", "x"));
  page_t pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.n, 0);
  assert_int_equal(pg.count, 0);
  assert_false(pg.more);
  assert_null(pg.m);
  presence_free(p);
  presence_free(NULL); /* a no-op */
  /* freed with entries in it, connected and in their grace (ASan: no leak) */
  p = presence_new(GRACE);
  assert_int_equal(presence_add(p, "c1", "alice", "a1", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_int_equal(presence_add(p, "c2", "bob", "b1", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  presence_remove(p, "c2", "bob", "b1", 100);
  assert_int_equal(presence_add_idle(p, "c3", "kim", "k1", WALL, 100), 1);
  presence_free(p);
}

/* The first client of a user joins with FIRST; a second client of the same
 * user joins without it; a second connection of a present client is no
 * join at all. Each client and user is one entry. */
static void test_add_bits(void **state) {
  presence_t *p = presence_new(GRACE);
  assert_int_equal(presence_add(p, "c", "alice", "a1", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_int_equal(presence_entries(p), 2); /* a1, alice */
  assert_true(presence_has(p, "c", "alice", "a1"));
  assert_int_equal(presence_add(p, "c", "alice", "a1", WALL + 1), 0); /* a second connection */
  assert_int_equal(presence_entries(p), 2);
  assert_int_equal(presence_add(p, "c", "alice", "a2", WALL + 2), PRESENCE_JOINED);
  assert_int_equal(presence_entries(p), 3);
  assert_int_equal(presence_add(p, "c", "bob", "b1", WALL + 3), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_int_equal(presence_entries(p), 5);
  assert_false(presence_has(p, "c", "bob", "b2"));
  assert_false(presence_has(p, "other", "alice", "a1"));
  page_t pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.count, 2);
  assert_int_equal(pg.n, 2);
  assert_string_equal(pg.m[0].user, "alice");
  assert_int_equal(pg.m[0].clients, 2);
  assert_int_equal(pg.m[0].since_ms, WALL); /* the user's first join */
  assert_string_equal(pg.m[1].user, "bob");
  assert_int_equal(pg.m[1].clients, 1);
  assert_int_equal(pg.m[1].since_ms, WALL + 3);
  free(pg.m);
  presence_free(p);
}

/* The last connection's end starts the grace: the client is still present
 * (listed, presence_has) until it ends, and leaves at now + grace, not a
 * millisecond before. A connection of two ending once is no grace yet. */
static void test_remove_starts_the_grace(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  presence_add(p, "c", "alice", "a1", WALL);
  presence_add(p, "c", "alice", "a1", WALL); /* two connections */
  presence_remove(p, "c", "alice", "a1", 1000);
  presence_expire(p, 1000 + GRACE * 10, on_leave, &l);
  assert_int_equal(l.n, 0); /* one connection is left: no grace */
  assert_true(presence_has(p, "c", "alice", "a1"));
  presence_remove(p, "c", "alice", "a1", 2000); /* the last: the grace ends at 7000 */
  assert_true(presence_has(p, "c", "alice", "a1"));
  page_t pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.count, 1);
  assert_int_equal(pg.n, 1);
  assert_int_equal(pg.m[0].clients, 1);
  free(pg.m);
  presence_expire(p, 2000 + GRACE - 1, on_leave, &l);
  assert_int_equal(l.n, 0);
  assert_true(presence_has(p, "c", "alice", "a1"));
  presence_expire(p, 2000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 1);
  expect_left(&l, 0, "c", "alice", "a1", 1);
  assert_false(presence_has(p, "c", "alice", "a1"));
  assert_int_equal(presence_entries(p), 0);
  pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.count, 0);
  assert_int_equal(pg.n, 0);
  /* a remove without its add, and a remove past zero, are no-ops */
  presence_remove(p, "c", "alice", "nobody", 3000);
  presence_remove(p, "c", "alice", "a1", 3000);
  presence_add(p, "c", "alice", "a1", WALL);
  presence_remove(p, "c", "bob", "a1", 3500); /* a1 is alice's: bob has none */
  presence_remove(p, "c", "alice", "a1", 4000);
  presence_remove(p, "c", "alice", "a1", 4500); /* already in its grace: it still ends at 9000 */
  presence_expire(p, 4000 + GRACE - 1, on_leave, &l);
  assert_int_equal(l.n, 1);
  presence_expire(p, 4000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 2);
  assert_int_equal(presence_entries(p), 0);
  presence_free(p);
}

/* Back within the grace is no join (a reconnect, a drain move), and the
 * grace it was in does not end it later; a second grace starts from its
 * own remove. After the grace, the same client joins again. */
static void test_add_within_grace_is_no_join(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  assert_int_equal(presence_add(p, "c", "alice", "a1", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  presence_remove(p, "c", "alice", "a1", 1000);
  assert_int_equal(presence_add(p, "c", "alice", "a1", WALL + 10), 0);
  presence_expire(p, 1000 + GRACE, on_leave, &l);
  presence_expire(p, 1000 + GRACE * 100, on_leave, &l);
  assert_int_equal(l.n, 0);
  assert_true(presence_has(p, "c", "alice", "a1"));
  page_t pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.n, 1);
  assert_int_equal(pg.m[0].since_ms, WALL); /* it never left: its first since */
  assert_int_equal(pg.m[0].clients, 1);
  free(pg.m);
  presence_remove(p, "c", "alice", "a1", 600000);
  presence_expire(p, 600000 + GRACE - 1, on_leave, &l);
  assert_int_equal(l.n, 0);
  presence_expire(p, 600000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 1);
  expect_left(&l, 0, "c", "alice", "a1", 1);
  assert_int_equal(presence_add(p, "c", "alice", "a1", WALL + 99),
                   PRESENCE_JOINED | PRESENCE_FIRST);
  presence_free(p);
}

/* With a grace of 0, a client leaves at the tick of its remove. */
static void test_zero_grace(void **state) {
  presence_t *p = presence_new(0);
  leaves_t l = {0};
  presence_add(p, "c", "alice", "a1", WALL);
  presence_remove(p, "c", "alice", "a1", 500);
  presence_expire(p, 499, on_leave, &l);
  assert_int_equal(l.n, 0);
  presence_expire(p, 500, on_leave, &l);
  assert_int_equal(l.n, 1);
  assert_int_equal(presence_entries(p), 0);
  presence_free(p);
}

/* Leaves come oldest first; `last` is 1 only for a user's last client
 * (one still connected, or still in its grace, keeps it 0); a user whose
 * client is connected never leaves. */
static void test_expire_order_and_last(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  presence_add(p, "c", "alice", "a1", WALL);
  presence_add(p, "c", "alice", "a2", WALL);
  presence_add(p, "c", "alice", "a3", WALL);
  presence_add(p, "c", "bob", "b1", WALL);
  presence_add(p, "c", "kim", "k1", WALL);
  assert_int_equal(presence_entries(p), 8);
  presence_remove(p, "c", "alice", "a2", 100);
  presence_remove(p, "c", "bob", "b1", 200);
  presence_remove(p, "c", "alice", "a1", 300);
  presence_remove(p, "c", "kim", "k1", 400);
  /* all four graces over at once: in the order they began */
  presence_expire(p, 400 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 4);
  expect_left(&l, 0, "c", "alice", "a2", 0); /* a1, a3 stay */
  expect_left(&l, 1, "c", "bob", "b1", 1);
  expect_left(&l, 2, "c", "alice", "a1", 0); /* a3 is connected */
  expect_left(&l, 3, "c", "kim", "k1", 1);
  assert_int_equal(presence_entries(p), 2); /* a3, alice */
  page_t pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.count, 1);
  assert_string_equal(pg.m[0].user, "alice");
  assert_int_equal(pg.m[0].clients, 1);
  free(pg.m);
  presence_remove(p, "c", "alice", "a3", 10000);
  presence_expire(p, 10000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 5);
  expect_left(&l, 4, "c", "alice", "a3", 1);
  assert_int_equal(presence_entries(p), 0);
  presence_free(p);
}

/* Two clients of one user both in their grace: the first to end is not
 * the last; one expire call may stop between them. */
static void test_expire_partial(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  presence_add(p, "c", "alice", "a1", WALL);
  presence_add(p, "c", "alice", "a2", WALL);
  presence_remove(p, "c", "alice", "a1", 1000);
  presence_remove(p, "c", "alice", "a2", 3000);
  presence_expire(p, 1000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 1);
  expect_left(&l, 0, "c", "alice", "a1", 0);
  assert_int_equal(presence_entries(p), 2);
  presence_expire(p, 3000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 2);
  expect_left(&l, 1, "c", "alice", "a2", 1);
  assert_int_equal(presence_entries(p), 0);
  presence_free(p);
}

/* The callback may add again (the entry is gone before it is called, and
 * its strings are copies). */
typedef struct {
  presence_t *p;
  int calls;
  int bits;
} readd_t;

static void on_leave_readd(void *ud, const char *conv, const char *user, const char *client,
                           int last) {
  readd_t *r = ud;
  r->calls++;
  assert_false(presence_has(r->p, conv, user, client));
  r->bits = presence_add(r->p, conv, user, client, WALL + 5);
}

static void test_expire_callback_may_add(void **state) {
  presence_t *p = presence_new(GRACE);
  readd_t r = {.p = p};
  presence_add(p, "c", "alice", "a1", WALL);
  presence_remove(p, "c", "alice", "a1", 0);
  presence_expire(p, GRACE, on_leave_readd, &r);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.bits, PRESENCE_JOINED | PRESENCE_FIRST);
  assert_true(presence_has(p, "c", "alice", "a1"));
  assert_int_equal(presence_entries(p), 2);
  presence_expire(p, GRACE * 10, on_leave_readd, &r); /* connected now: nothing */
  assert_int_equal(r.calls, 1);
  presence_free(p);
}

/* A client of before a restart: present without a connection (listed,
 * presence_has), in its grace from `now`; nothing when it is present
 * already; a connection in time keeps it, none makes it leave. */
static void test_add_idle(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  assert_int_equal(presence_add_idle(p, "c", "alice", "a1", WALL, 1000), 1);
  assert_int_equal(presence_add_idle(p, "c", "alice", "a2", WALL, 1000), 1);
  assert_true(presence_has(p, "c", "alice", "a1"));
  assert_int_equal(presence_entries(p), 3);
  page_t pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.count, 1);
  assert_int_equal(pg.m[0].clients, 2);
  assert_int_equal(pg.m[0].since_ms, WALL);
  free(pg.m);
  /* a1 reconnects in time: no join, and it stays */
  assert_int_equal(presence_add(p, "c", "alice", "a1", WALL + 1), 0);
  /* idle again for a present one: nothing, not even a grace */
  assert_int_equal(presence_add_idle(p, "c", "alice", "a1", WALL, 2000), 0);
  presence_expire(p, 1000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 1);
  expect_left(&l, 0, "c", "alice", "a2", 0); /* a1 stays */
  presence_expire(p, 2000 + GRACE * 10, on_leave, &l);
  assert_int_equal(l.n, 1);
  assert_true(presence_has(p, "c", "alice", "a1"));
  /* one connection, one remove: its grace, then its leave */
  presence_remove(p, "c", "alice", "a1", 100000);
  presence_expire(p, 100000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 2);
  expect_left(&l, 1, "c", "alice", "a1", 1);
  assert_int_equal(presence_entries(p), 0);
  /* an idle client in its grace: presence_remove does nothing to it */
  presence_add_idle(p, "c", "bob", "b1", WALL, 200000);
  presence_remove(p, "c", "bob", "b1", 201000);
  presence_expire(p, 200000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 3);
  expect_left(&l, 2, "c", "bob", "b1", 1);
  presence_free(p);
}

/* Pages in byte order of the users' ids (not the order they came in),
 * `after` a cursor (a user id, present or not), `limit` per page, `more`
 * when listed users follow, `rank` the place in that order; limit 0 is
 * the count alone. */
static void test_list_pages(void **state) {
  presence_t *p = presence_new(GRACE);
  /* byte order: "B" < "a" < "a0" < "b" < "c" */
  const char *users[] = {"c", "a0", "B", "b", "a"};
  for (size_t i = 0; i < 5; i++) {
    char client[16];
    snprintf(client, sizeof client, "cl-%zu", i);
    presence_add(p, "conv", users[i], client, WALL + (int64_t)i);
  }
  const char *order[] = {"B", "a", "a0", "b", "c"};
  page_t pg = list(p, "conv", NULL, 2, 0);
  assert_int_equal(pg.count, 5);
  assert_int_equal(pg.n, 2);
  assert_true(pg.more);
  assert_string_equal(pg.m[0].user, "B");
  assert_int_equal(pg.m[0].rank, 1);
  assert_int_equal(pg.m[0].since_ms, WALL + 2);
  assert_string_equal(pg.m[1].user, "a");
  assert_int_equal(pg.m[1].rank, 2);
  free(pg.m);
  pg = list(p, "conv", "a", 2, 0); /* the cursor of the page before */
  assert_int_equal(pg.n, 2);
  assert_true(pg.more);
  assert_string_equal(pg.m[0].user, "a0");
  assert_int_equal(pg.m[0].rank, 3);
  assert_string_equal(pg.m[1].user, "b");
  assert_int_equal(pg.m[1].rank, 4);
  free(pg.m);
  pg = list(p, "conv", "b", 2, 0);
  assert_int_equal(pg.n, 1);
  assert_false(pg.more); /* the last page */
  assert_string_equal(pg.m[0].user, "c");
  assert_int_equal(pg.m[0].rank, 5);
  assert_int_equal(pg.count, 5);
  free(pg.m);
  /* exactly a page's worth: no more */
  pg = list(p, "conv", "a", 3, 0);
  assert_int_equal(pg.n, 3);
  assert_false(pg.more);
  free(pg.m);
  /* all at once, in order; "" is the first page too */
  pg = list(p, "conv", "", 100, 0);
  assert_int_equal(pg.n, 5);
  assert_false(pg.more);
  for (size_t i = 0; i < 5; i++) {
    assert_string_equal(pg.m[i].user, order[i]);
    assert_int_equal(pg.m[i].rank, (int64_t)i + 1);
    assert_int_equal(pg.m[i].clients, 1);
  }
  free(pg.m);
  /* a cursor that is no user: the users after it */
  pg = list(p, "conv", "a00", 10, 0);
  assert_int_equal(pg.n, 2);
  assert_string_equal(pg.m[0].user, "b");
  assert_int_equal(pg.m[0].rank, 4);
  free(pg.m);
  pg = list(p, "conv", "zzz", 10, 0);
  assert_int_equal(pg.n, 0);
  assert_false(pg.more);
  assert_int_equal(pg.count, 5);
  /* limit 0: the count alone */
  pg = list(p, "conv", NULL, 0, 0);
  assert_int_equal(pg.n, 0);
  assert_null(pg.m);
  assert_int_equal(pg.count, 5);
  assert_false(pg.more);
  /* a conversation nobody is in */
  pg = list(p, "elsewhere", NULL, 10, 0);
  assert_int_equal(pg.n, 0);
  assert_int_equal(pg.count, 0);
  presence_free(p);
}

/* `max`: only the first max users of the order are listed; the others are
 * counted. `more` says whether listed users follow, never the counted. */
static void test_list_max(void **state) {
  presence_t *p = presence_new(GRACE);
  for (int i = 0; i < 10; i++) {
    char user[16], client[16];
    snprintf(user, sizeof user, "u%02d", i);
    snprintf(client, sizeof client, "c%02d", i);
    presence_add(p, "conv", user, client, WALL);
  }
  page_t pg = list(p, "conv", NULL, 100, 4);
  assert_int_equal(pg.count, 10);
  assert_int_equal(pg.n, 4);
  assert_false(pg.more); /* u04.. are past max: counted, not listed */
  assert_string_equal(pg.m[0].user, "u00");
  assert_string_equal(pg.m[3].user, "u03");
  assert_int_equal(pg.m[3].rank, 4);
  free(pg.m);
  pg = list(p, "conv", NULL, 3, 4);
  assert_int_equal(pg.n, 3);
  assert_true(pg.more); /* u03 is within max */
  free(pg.m);
  pg = list(p, "conv", "u02", 3, 4);
  assert_int_equal(pg.n, 1);
  assert_string_equal(pg.m[0].user, "u03");
  assert_int_equal(pg.m[0].rank, 4);
  assert_false(pg.more);
  free(pg.m);
  pg = list(p, "conv", "u03", 3, 4); /* the cursor at max: nothing more is listed */
  assert_int_equal(pg.n, 0);
  assert_false(pg.more);
  assert_int_equal(pg.count, 10);
  pg = list(p, "conv", "u05", 3, 4); /* a cursor past max (a user counted only) */
  assert_int_equal(pg.n, 0);
  assert_false(pg.more);
  /* max above the count: no bound */
  pg = list(p, "conv", NULL, 100, 50);
  assert_int_equal(pg.n, 10);
  assert_false(pg.more);
  free(pg.m);
  /* max counts users, not clients: a second client of u00 changes nothing */
  presence_add(p, "conv", "u00", "c00-b", WALL);
  pg = list(p, "conv", NULL, 100, 4);
  assert_int_equal(pg.count, 10);
  assert_int_equal(pg.n, 4);
  assert_int_equal(pg.m[0].clients, 2);
  assert_string_equal(pg.m[3].user, "u03");
  free(pg.m);
  presence_free(p);
}

/* Conversations are kept apart: the same user and the same client id in
 * two conversations are two entries each, with their own counts, graces,
 * pages and leaves. */
static void test_conversations_apart(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  assert_int_equal(presence_add(p, "c1", "alice", "tab", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_int_equal(presence_add(p, "c2", "alice", "tab", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_int_equal(presence_add(p, "c2", "bob", "b1", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_int_equal(presence_entries(p), 6);
  assert_true(presence_has(p, "c1", "alice", "tab"));
  assert_true(presence_has(p, "c2", "alice", "tab"));
  assert_false(presence_has(p, "c1", "bob", "b1"));
  page_t pg = list(p, "c1", NULL, 10, 0);
  assert_int_equal(pg.count, 1);
  assert_int_equal(pg.n, 1);
  assert_string_equal(pg.m[0].user, "alice");
  free(pg.m);
  pg = list(p, "c2", NULL, 10, 0);
  assert_int_equal(pg.count, 2);
  free(pg.m);
  /* the end of tab in c1 is not its end in c2 */
  presence_remove(p, "c1", "alice", "tab", 1000);
  presence_expire(p, 1000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 1);
  expect_left(&l, 0, "c1", "alice", "tab", 1); /* alice's last in c1, though present in c2 */
  assert_false(presence_has(p, "c1", "alice", "tab"));
  assert_true(presence_has(p, "c2", "alice", "tab"));
  pg = list(p, "c1", NULL, 10, 0);
  assert_int_equal(pg.count, 0);
  pg = list(p, "c2", NULL, 10, 0);
  assert_int_equal(pg.count, 2);
  assert_int_equal(pg.m[0].clients, 1);
  free(pg.m);
  assert_int_equal(presence_entries(p), 4);
  /* back in c1: a join there, as a user's first again */
  assert_int_equal(presence_add(p, "c1", "alice", "tab", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  presence_remove(p, "c1", "alice", "tab", 20000);
  presence_remove(p, "c2", "alice", "tab", 20000);
  presence_remove(p, "c2", "bob", "b1", 20000);
  presence_expire(p, 20000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 4);
  expect_left(&l, 1, "c1", "alice", "tab", 1);
  expect_left(&l, 2, "c2", "alice", "tab", 1);
  expect_left(&l, 3, "c2", "bob", "b1", 1);
  assert_int_equal(presence_entries(p), 0);
  presence_free(p);
}

/* A client is its user's: two users naming one clientId in one
 * conversation are two clients, each joining as its user's first, both
 * listed, each with its own connections, grace and leave (last=1 for its
 * own user, whatever the other's state). */
static void test_two_users_one_client_id(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  assert_int_equal(presence_add(p, "c", "alice", "tab", WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_true(presence_has(p, "c", "alice", "tab"));
  assert_false(presence_has(p, "c", "bob", "tab"));
  assert_int_equal(presence_add(p, "c", "bob", "tab", WALL + 1), PRESENCE_JOINED | PRESENCE_FIRST);
  assert_true(presence_has(p, "c", "alice", "tab"));
  assert_true(presence_has(p, "c", "bob", "tab"));
  assert_false(presence_has(p, "c", "kim", "tab"));
  assert_int_equal(presence_entries(p), 4); /* two clients, two users */
  page_t pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.count, 2);
  assert_int_equal(pg.n, 2);
  assert_string_equal(pg.m[0].user, "alice");
  assert_int_equal(pg.m[0].clients, 1);
  assert_int_equal(pg.m[0].since_ms, WALL);
  assert_string_equal(pg.m[1].user, "bob");
  assert_int_equal(pg.m[1].clients, 1);
  assert_int_equal(pg.m[1].since_ms, WALL + 1);
  free(pg.m);
  /* a second connection of bob's tab is bob's, not alice's */
  assert_int_equal(presence_add(p, "c", "bob", "tab", WALL + 2), 0);
  /* alice leaves: bob's tab, still connected, is untouched */
  presence_remove(p, "c", "alice", "tab", 1000);
  assert_true(presence_has(p, "c", "alice", "tab")); /* in its grace */
  presence_expire(p, 1000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 1);
  expect_left(&l, 0, "c", "alice", "tab", 1);
  assert_false(presence_has(p, "c", "alice", "tab"));
  assert_true(presence_has(p, "c", "bob", "tab"));
  assert_int_equal(presence_entries(p), 2);
  pg = list(p, "c", NULL, 10, 0);
  assert_int_equal(pg.count, 1);
  assert_int_equal(pg.n, 1);
  assert_string_equal(pg.m[0].user, "bob");
  free(pg.m);
  /* alice's removes after her leave do nothing to bob's two connections */
  presence_remove(p, "c", "alice", "tab", 2000);
  presence_remove(p, "c", "alice", "tab", 2000);
  presence_expire(p, 2000 + GRACE * 10, on_leave, &l);
  assert_int_equal(l.n, 1);
  assert_true(presence_has(p, "c", "bob", "tab"));
  /* bob's two connections end: then bob leaves, his own last */
  presence_remove(p, "c", "bob", "tab", 100000);
  presence_expire(p, 100000 + GRACE * 10, on_leave, &l);
  assert_int_equal(l.n, 1);
  presence_remove(p, "c", "bob", "tab", 200000);
  presence_expire(p, 200000 + GRACE - 1, on_leave, &l);
  assert_int_equal(l.n, 1);
  presence_expire(p, 200000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 2);
  expect_left(&l, 1, "c", "bob", "tab", 1);
  assert_int_equal(presence_entries(p), 0);
  /* both in their grace at once, each leaves separately, oldest first */
  presence_add(p, "c", "alice", "tab", WALL);
  presence_add(p, "c", "bob", "tab", WALL);
  presence_remove(p, "c", "bob", "tab", 300000);
  presence_remove(p, "c", "alice", "tab", 301000);
  presence_expire(p, 300000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 3);
  expect_left(&l, 2, "c", "bob", "tab", 1);
  assert_true(presence_has(p, "c", "alice", "tab"));
  presence_expire(p, 301000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 4);
  expect_left(&l, 3, "c", "alice", "tab", 1);
  assert_int_equal(presence_entries(p), 0);
  /* a restart's idle row of bob's tab is bob's even while alice's is present */
  presence_add(p, "c", "alice", "tab", WALL);
  assert_int_equal(presence_add_idle(p, "c", "bob", "tab", WALL, 400000), 1);
  assert_true(presence_has(p, "c", "bob", "tab"));
  assert_int_equal(presence_entries(p), 4);
  presence_expire(p, 400000 + GRACE, on_leave, &l);
  assert_int_equal(l.n, 5);
  expect_left(&l, 4, "c", "bob", "tab", 1);
  assert_true(presence_has(p, "c", "alice", "tab"));
  presence_free(p);
}

/* Many conversations, users and clients (chains in the hash tables), all
 * ending: every one is reported once, and the table is empty after. */
static void test_many_then_empty(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  int joins = 0, firsts = 0;
  for (int c = 0; c < 4; c++)
    for (int u = 0; u < 3; u++)
      for (int k = 0; k < 2; k++) {
        char conv[16], user[16], client[16];
        snprintf(conv, sizeof conv, "conv-%d", c);
        snprintf(user, sizeof user, "user-%d", u);
        snprintf(client, sizeof client, "cl-%d-%d", u, k);
        int bits = presence_add(p, conv, user, client, WALL);
        assert_true(bits > 0);
        joins += (bits & PRESENCE_JOINED) != 0;
        firsts += (bits & PRESENCE_FIRST) != 0;
      }
  assert_int_equal(joins, 24);
  assert_int_equal(firsts, 12);
  assert_int_equal(presence_entries(p), 24 + 12);
  for (int c = 0; c < 4; c++)
    for (int u = 0; u < 3; u++)
      for (int k = 0; k < 2; k++) {
        char conv[16], user[16], client[16];
        snprintf(conv, sizeof conv, "conv-%d", c);
        snprintf(user, sizeof user, "user-%d", u);
        snprintf(client, sizeof client, "cl-%d-%d", u, k);
        presence_remove(p, conv, user, client, 1000 + (uint64_t)(c * 6 + u * 2 + k));
      }
  presence_expire(p, 1000 + GRACE + 23, on_leave, &l);
  assert_int_equal(l.n, 24);
  int lasts = 0;
  for (int i = 0; i < l.n; i++) lasts += l.left[i].last;
  assert_int_equal(lasts, 12);       /* one per (conversation, user) */
  for (int i = 0; i < l.n; i += 2) { /* each user's first client, then its last */
    assert_int_equal(l.left[i].last, 0);
    assert_int_equal(l.left[i + 1].last, 1);
  }
  assert_int_equal(presence_entries(p), 0);
  page_t pg = list(p, "conv-0", NULL, 10, 0);
  assert_int_equal(pg.count, 0);
  presence_free(p);
}

/* Ids of STORE_ID_MAX bytes are kept whole and reported whole. */
static void test_longest_ids(void **state) {
  presence_t *p = presence_new(GRACE);
  leaves_t l = {0};
  char conv[STORE_ID_MAX + 1], user[STORE_ID_MAX + 1], client[STORE_ID_MAX + 1];
  memset(conv, 'c', STORE_ID_MAX);
  memset(user, 'u', STORE_ID_MAX);
  memset(client, 'k', STORE_ID_MAX);
  conv[STORE_ID_MAX] = user[STORE_ID_MAX] = client[STORE_ID_MAX] = '\0';
  assert_int_equal(presence_add(p, conv, user, client, WALL), PRESENCE_JOINED | PRESENCE_FIRST);
  page_t pg = list(p, conv, NULL, 10, 0);
  assert_int_equal(pg.n, 1);
  assert_string_equal(pg.m[0].user, user);
  free(pg.m);
  presence_remove(p, conv, user, client, 0);
  presence_expire(p, GRACE, on_leave, &l);
  assert_int_equal(l.n, 1);
  expect_left(&l, 0, conv, user, client, 1);
  presence_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_new_and_free),
      cmocka_unit_test(test_add_bits),
      cmocka_unit_test(test_remove_starts_the_grace),
      cmocka_unit_test(test_add_within_grace_is_no_join),
      cmocka_unit_test(test_zero_grace),
      cmocka_unit_test(test_expire_order_and_last),
      cmocka_unit_test(test_expire_partial),
      cmocka_unit_test(test_expire_callback_may_add),
      cmocka_unit_test(test_add_idle),
      cmocka_unit_test(test_list_pages),
      cmocka_unit_test(test_list_max),
      cmocka_unit_test(test_conversations_apart),
      cmocka_unit_test(test_two_users_one_client_id),
      cmocka_unit_test(test_many_then_empty),
      cmocka_unit_test(test_longest_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
