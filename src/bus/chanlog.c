#include "bus/chanlog.h"

#include <stdio.h>
#include <string.h>

void chanlog_record(chanlog_t *l, const char *channel, int active) {
  snprintf(l->ring[l->gen % CHANLOG_RING].channel, sizeof l->ring[0].channel, "%s", channel);
  l->ring[l->gen % CHANLOG_RING].active = active;
  l->gen++;
}

int chanlog_last_change_since(const chanlog_t *l, uint64_t gen, const char *channel) {
  uint64_t first = l->gen - gen > CHANLOG_RING ? l->gen - CHANLOG_RING : gen;
  for (uint64_t g = l->gen; g-- > first;)
    if (strcmp(l->ring[g % CHANLOG_RING].channel, channel) == 0)
      return l->ring[g % CHANLOG_RING].active;
  return -1;
}

int chanlog_changed_since(const chanlog_t *l, uint64_t gen, const char *channel) {
  return l->gen - gen > CHANLOG_RING || chanlog_last_change_since(l, gen, channel) >= 0;
}
