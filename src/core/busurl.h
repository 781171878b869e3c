/*
 * busurl: the list of a sharded cluster's bus instances (CONVERGER_BUS),
 * comma-separated "redis://HOST:PORT" (HOST a name or an IPv4 address, no
 * user information or path), below the bus so that configuration can
 * check it. Pure functions, any thread.
 */
#ifndef CONVERGER_CORE_BUSURL_H
#define CONVERGER_CORE_BUSURL_H

#include <stddef.h>

#define BUSURL_MAX      16  /* instances in one list */
#define BUSURL_HOST_MAX 255 /* bytes of a HOST */

typedef struct {
  char host[BUSURL_HOST_MAX + 1];
  int port;
} busurl_t;

/* Parse `urls` into out[0..*n) (out may be NULL: check only). 0, or -1
 * with what is wrong in `why` (`cap` bytes). */
int busurl_parse(const char *urls, busurl_t out[BUSURL_MAX], int *n, char *why, size_t cap);

#endif
