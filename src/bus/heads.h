/*
 * heads: the check of conversations against the store, for a bus that may
 * have missed messages (a LISTEN connection or a bus instance that was
 * down, a publish lost between a COMMIT and its PUBLISH, a bus
 * subscription made after the head was read).
 *
 * One pool job reads the head and channel state of every conversation
 * given, in one read section (one snapshot per database); back on the
 * loop, each conversation with a subscriber gets a head hint (bus.h): a
 * live subscriber that is behind fills the gap from the store, one that is
 * up to date ignores it. A conversation whose channel was deactivated, and
 * no change of the channel was heard since the job was submitted, ends
 * (bus_channel_changed). Loop thread.
 */
#ifndef CONVERGER_BUS_HEADS_H
#define CONVERGER_BUS_HEADS_H

#include <stddef.h>

#include "bus/bus.h"
#include "store/pool.h"

/* The check is over. `canceled`: the pool was closing and nothing was
 * read. Otherwise `failed` (heap array of heap strings, taken by the
 * callee: store_strings_free) holds the `nfailed` conversations the store
 * could not read (their hints were not published: check them again
 * later), out of `n`; `inactive` of them had an inactive channel. Loop
 * thread. */
typedef void (*heads_done_cb)(void *ud, int canceled, char **failed, size_t nfailed, size_t n,
                              size_t inactive);

/* Check the `n` conversations of `convs` (a heap array of heap strings,
 * taken in every case) on `pool`; `no_drop`: the job may not be dropped by
 * the queue-delay rule (pool.h). `done` runs once, later, on the loop.
 * Returns 0, or -CV_ENOMEM (convs freed, `done` never runs). */
int heads_check(bus_t *bus, pool_t *pool, char **convs, size_t n, int no_drop, heads_done_cb done,
                void *ud);

#endif
