/*
 * presence: who is present in which conversation on this node
 * (docs/protocol.md 4.9), a data structure without I/O.
 *
 * A client instance (the hello's clientId) of a user (the token's sub; a
 * client is always its user's: two users naming one clientId are two) is
 * present in a conversation while at least one of its subscriptions to it
 * is announced on this node, and for `grace_ms` after the last one ends:
 * a drain move (the new connection is welcomed before the old one
 * closes), a reconnect after a restart and a blip shorter than the grace
 * therefore never make it leave. The reconnect-storm post-mortem's lesson
 * applied to presence: a restart must not look like everyone leaving.
 *
 * On one node (SQLite) this table is the whole truth: its answers say
 * when a client joins or leaves and who is listed. In a cluster
 * (PostgreSQL) it holds this node's clients only, for their connection
 * counts and their grace; the store's table decides across nodes
 * (store.h, "Presence across nodes").
 *
 * Memory: one entry per (conversation, client) and one per (conversation,
 * user), each a malloc of its header and its ids; docs/benchmarks/presence
 * has the measured figure. Loop thread only.
 */
#ifndef CONVERGER_PROTO_PRESENCE_H
#define CONVERGER_PROTO_PRESENCE_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

typedef struct presence_s presence_t;

/* presence_add's answer, bits. */
#define PRESENCE_JOINED 1 /* the client was not present (nor within its grace) */
#define PRESENCE_FIRST  2 /* ... and it is its user's first client here */

/* An empty table whose clients stay `grace_ms` (>= 0) after their last
 * connection. NULL on OOM. */
presence_t *presence_new(int grace_ms);
/* Free it and every entry (NULL: no-op). */
void presence_free(presence_t *p);

/* One more connection of client `client` of `user` in `conv` (ids, each
 * at most STORE_ID_MAX bytes), at wall time `now_ms` (its `since` when it
 * joins). A client in its grace is simply present again. Returns
 * PRESENCE_* bits (0: it was present already), or -CV_ENOMEM. */
int presence_add(presence_t *p, const char *conv, const char *user, const char *client,
                 int64_t now_ms);

/* One fewer (a call without its presence_add is a no-op). When it was the
 * client's last, the client leaves at `now + grace_ms` (monotonic ms)
 * unless it connects again before. */
void presence_remove(presence_t *p, const char *conv, const char *user, const char *client,
                     uint64_t now);

/* A client of before a restart (its row in the store), or one whose row a
 * store job wrote: present without a connection, in its grace from `now`;
 * nothing when it is present already. 1 when it was made, 0 when it was
 * there, or -CV_ENOMEM. */
int presence_add_idle(presence_t *p, const char *conv, const char *user, const char *client,
                      int64_t now_ms, uint64_t now);

/* Called by presence_expire for each client whose grace ended: `last` is 1
 * when its user has no other client in `conv`. The strings are valid
 * during the call only. */
typedef void (*presence_leave_cb)(void *ud, const char *conv, const char *user, const char *client,
                                  int last);

/* Remove every client whose grace ended by `now`, oldest first, each
 * reported to `cb`. */
void presence_expire(presence_t *p, uint64_t now, presence_leave_cb cb, void *ud);

/* The users present in `conv`, in byte order of their ids, after `after`
 * ("" or NULL: from the first), at most `limit`, counting only the first
 * `max` users of that order (0: no bound): heap array in *out (free()),
 * *n of them; *count is every user present; *more is 1 when users listed
 * within `max` follow this page. 0 or -CV_ENOMEM. */
int presence_list(const presence_t *p, const char *conv, const char *after, int limit, int max,
                  store_member_t **out, size_t *n, int64_t *count, int *more);

/* Called by presence_each for every client in the table, connected or in
 * its grace; the strings are valid during the call. */
typedef void (*presence_each_cb)(void *ud, const char *conv, const char *user, const char *client);
/* Every client, in no order (the table must not change meanwhile). */
void presence_each(const presence_t *p, presence_each_cb cb, void *ud);

/* 1 when client `client` of `user` is present in `conv` (connected or in
 * its grace). */
int presence_has(const presence_t *p, const char *conv, const char *user, const char *client);

/* Entries held (clients + users), for converger_presence_entries. */
size_t presence_entries(const presence_t *p);

#endif
