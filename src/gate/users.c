#include "gate/users.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

#define USERS_BUCKETS 4096 /* a power of two */

typedef struct user_s {
  struct user_s *next;
  int n;
  char sub[]; /* NUL-terminated */
} user_t;

struct users_s {
  user_t *buckets[USERS_BUCKETS];
};

/* FNV-1a */
static size_t hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h & (USERS_BUCKETS - 1);
}

users_t *users_new(void) { return calloc(1, sizeof(users_t)); }

void users_free(users_t *u) {
  if (!u) return;
  for (size_t i = 0; i < USERS_BUCKETS; i++)
    for (user_t *e = u->buckets[i], *next; e; e = next) {
      next = e->next;
      free(e);
    }
  free(u);
}

static user_t **find(users_t *u, const char *sub) {
  user_t **p = &u->buckets[hash(sub)];
  while (*p && strcmp((*p)->sub, sub) != 0) p = &(*p)->next;
  return p;
}

int users_count(const users_t *u, const char *sub) {
  user_t *const *p = find((users_t *)u, sub);
  return *p ? (*p)->n : 0;
}

int users_add(users_t *u, const char *sub) {
  user_t **p = find(u, sub);
  if (!*p) {
    size_t len = strlen(sub);
    user_t *e = calloc(1, sizeof *e + len + 1);
    if (!e) return -CV_ENOMEM;
    memcpy(e->sub, sub, len + 1);
    *p = e;
  }
  return ++(*p)->n;
}

void users_remove(users_t *u, const char *sub) {
  user_t **p = find(u, sub);
  if (!*p) return;
  if (--(*p)->n > 0) return;
  user_t *e = *p;
  *p = e->next;
  free(e);
}
