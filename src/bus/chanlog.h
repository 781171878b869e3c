/*
 * chanlog: the node's memory of recent channel state changes (activated,
 * deactivated), so that a handshake or a head read whose store read came
 * before a deactivation still ends its subscription, and one that came
 * before a reactivation does not. A ring of the last CHANLOG_RING changes,
 * embedded in the bus (bus_channel_changed). Loop thread only.
 */
#ifndef CONVERGER_BUS_CHANLOG_H
#define CONVERGER_BUS_CHANLOG_H

#include <stdint.h>

#include "store/store.h"

#define CHANLOG_RING 256 /* changes remembered */

typedef struct {
  struct {
    char channel[STORE_ID_MAX + 1];
    int active;
  } ring[CHANLOG_RING];
  uint64_t gen; /* changes so far; change g is ring[g % CHANLOG_RING] */
} chanlog_t;

/* Remember that `channel` was activated (active 1) or deactivated (0). */
void chanlog_record(chanlog_t *l, const char *channel, int active);

/* The last change of `channel` since generation `gen` among those
 * remembered: 1 activated, 0 deactivated, -1 none. */
int chanlog_last_change_since(const chanlog_t *l, uint64_t gen, const char *channel);

/* 1 when `channel` changed state after generation `gen`, or when too many
 * changes came since to tell; else 0. */
int chanlog_changed_since(const chanlog_t *l, uint64_t gen, const char *channel);

#endif
