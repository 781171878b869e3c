/*
 * users: how many WebSocket connections each user (a token's `sub`) holds
 * on this node, for CONVERGER_MAX_CONNS_PER_USER (docs/protocol.md 4.8).
 * A chained hash table of user -> count; a user's entry goes when its
 * count reaches 0. Loop thread only.
 */
#ifndef CONVERGER_GATE_USERS_H
#define CONVERGER_GATE_USERS_H

typedef struct users_s users_t;

/* An empty table, or NULL on OOM. */
users_t *users_new(void);
/* Free it (NULL: no-op). */
void users_free(users_t *u);

/* The connections `sub` holds now (0 when none). */
int users_count(const users_t *u, const char *sub);
/* One more connection of `sub`: its new count, or -CV_ENOMEM. */
int users_add(users_t *u, const char *sub);
/* One fewer (a call without its users_add is a no-op). */
void users_remove(users_t *u, const char *sub);

#endif
