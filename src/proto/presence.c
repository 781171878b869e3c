/*
 * presence.c: the table of presence.h.
 *
 * Three chained hash tables of fixed size: conversations (each with the
 * list of its users), users of a conversation (with their count of
 * clients) and clients of a conversation (with their count of connections
 * and, at 0, the end of their grace). Clients in their grace are also in
 * one FIFO: the grace is the same for all, so the order they entered it is
 * the order they leave.
 */
#include "proto/presence.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

#define BUCKETS 16384 /* per table; a power of two */

typedef struct pconv_s pconv_t;

typedef struct puser_s {
  struct puser_s *next;          /* hash chain */
  struct puser_s *cnext, *cprev; /* its conversation's list */
  pconv_t *conv;
  int64_t clients; /* its clients present here (connected or in grace) */
  int64_t since_ms;
  char user[]; /* NUL-terminated */
} puser_t;

typedef struct pclient_s {
  struct pclient_s *next;          /* hash chain */
  struct pclient_s *gnext, *gprev; /* the grace FIFO, while conns == 0 */
  puser_t *user;
  int conns;
  uint64_t leave_at; /* conns == 0: monotonic ms its grace ends */
  char client[];     /* NUL-terminated */
} pclient_t;

struct pconv_s {
  pconv_t *next; /* hash chain */
  puser_t *users;
  int64_t nusers;
  char conv[];
};

struct presence_s {
  int grace_ms;
  size_t entries;
  pclient_t *grace_head, *grace_tail;
  pconv_t *convs[BUCKETS];
  puser_t *users[BUCKETS];
  pclient_t *clients[BUCKETS];
};

/* FNV-1a over "a\0b" */
static size_t hash2(const char *a, const char *b) {
  uint32_t h = 2166136261u;
  for (; *a; a++) h = (h ^ (unsigned char)*a) * 16777619u;
  h = h * 16777619u;
  for (; b && *b; b++) h = (h ^ (unsigned char)*b) * 16777619u;
  return h & (BUCKETS - 1);
}

presence_t *presence_new(int grace_ms) {
  if (grace_ms < 0) return NULL;
  presence_t *p = calloc(1, sizeof *p);
  if (p) p->grace_ms = grace_ms;
  return p;
}

void presence_free(presence_t *p) {
  if (!p) return;
  for (size_t i = 0; i < BUCKETS; i++) {
    for (pclient_t *e = p->clients[i], *next; e; e = next) {
      next = e->next;
      free(e);
    }
    for (puser_t *e = p->users[i], *next; e; e = next) {
      next = e->next;
      free(e);
    }
    for (pconv_t *e = p->convs[i], *next; e; e = next) {
      next = e->next;
      free(e);
    }
  }
  free(p);
}

static pconv_t **conv_slot(presence_t *p, const char *conv) {
  pconv_t **e = &p->convs[hash2(conv, NULL)];
  while (*e && strcmp((*e)->conv, conv) != 0) e = &(*e)->next;
  return e;
}

static puser_t **user_slot(presence_t *p, const char *conv, const char *user) {
  puser_t **e = &p->users[hash2(conv, user)];
  while (*e && (strcmp((*e)->user, user) != 0 || strcmp((*e)->conv->conv, conv) != 0))
    e = &(*e)->next;
  return e;
}

/* A client is its user's: two users that name the same clientId are two
 * clients. */
static pclient_t **client_slot(presence_t *p, const char *conv, const char *user,
                               const char *client) {
  pclient_t **e = &p->clients[hash2(conv, client)];
  while (*e && (strcmp((*e)->client, client) != 0 || strcmp((*e)->user->user, user) != 0 ||
                strcmp((*e)->user->conv->conv, conv) != 0))
    e = &(*e)->next;
  return e;
}

static void grace_unlink(presence_t *p, pclient_t *c) {
  if (c->gprev)
    c->gprev->gnext = c->gnext;
  else if (p->grace_head == c)
    p->grace_head = c->gnext;
  if (c->gnext)
    c->gnext->gprev = c->gprev;
  else if (p->grace_tail == c)
    p->grace_tail = c->gprev;
  c->gnext = c->gprev = NULL;
}

static void grace_append(presence_t *p, pclient_t *c, uint64_t now) {
  c->leave_at = now + (uint64_t)p->grace_ms;
  c->gprev = p->grace_tail;
  c->gnext = NULL;
  if (p->grace_tail)
    p->grace_tail->gnext = c;
  else
    p->grace_head = c;
  p->grace_tail = c;
}

/* A new client entry (its user and conversation made as needed), with no
 * connection yet. NULL on OOM; *bits gets PRESENCE_FIRST when its user is
 * new here. */
static pclient_t *client_new(presence_t *p, const char *conv, const char *user, const char *client,
                             int64_t now_ms, int *bits) {
  size_t clen = strlen(client) + 1;
  pclient_t *c = calloc(1, sizeof *c + clen);
  if (!c) return NULL;
  memcpy(c->client, client, clen);
  pconv_t **cs = conv_slot(p, conv);
  pconv_t *cv = *cs;
  if (!cv) {
    size_t len = strlen(conv) + 1;
    if (!(cv = calloc(1, sizeof *cv + len))) goto oom;
    memcpy(cv->conv, conv, len);
    *cs = cv;
  }
  puser_t **us = user_slot(p, conv, user);
  puser_t *u = *us;
  if (!u) {
    size_t len = strlen(user) + 1;
    if (!(u = calloc(1, sizeof *u + len))) {
      if (cv->nusers == 0) { /* made for this call */
        *conv_slot(p, conv) = cv->next;
        free(cv);
      }
      goto oom;
    }
    memcpy(u->user, user, len);
    u->conv = cv;
    u->since_ms = now_ms;
    u->cnext = cv->users;
    if (cv->users) cv->users->cprev = u;
    cv->users = u;
    cv->nusers++;
    *us = u;
    p->entries++;
  }
  c->user = u;
  if (u->clients++ == 0) *bits |= PRESENCE_FIRST;
  *client_slot(p, conv, user, client) = c;
  p->entries++;
  return c;
oom:
  free(c);
  return NULL;
}

/* Free a client entry, and its user and conversation when they hold no
 * other. Returns 1 when the user went (it was the user's last client). */
static int client_free(presence_t *p, pclient_t *c) {
  puser_t *u = c->user;
  pconv_t *cv = u->conv;
  grace_unlink(p, c);
  pclient_t **cs = client_slot(p, cv->conv, u->user, c->client);
  *cs = c->next;
  free(c);
  p->entries--;
  if (--u->clients > 0) return 0;
  puser_t **us = user_slot(p, cv->conv, u->user);
  *us = u->next;
  if (u->cprev)
    u->cprev->cnext = u->cnext;
  else
    cv->users = u->cnext;
  if (u->cnext) u->cnext->cprev = u->cprev;
  free(u);
  p->entries--;
  if (--cv->nusers == 0) {
    *conv_slot(p, cv->conv) = cv->next;
    free(cv);
  }
  return 1;
}

int presence_add(presence_t *p, const char *conv, const char *user, const char *client,
                 int64_t now_ms) {
  pclient_t *c = *client_slot(p, conv, user, client);
  int bits = 0;
  if (!c) {
    bits = PRESENCE_JOINED;
    if (!(c = client_new(p, conv, user, client, now_ms, &bits))) return -CV_ENOMEM;
  }
  if (c->conns++ == 0) grace_unlink(p, c); /* back within its grace: it never left */
  return bits;
}

int presence_add_idle(presence_t *p, const char *conv, const char *user, const char *client,
                      int64_t now_ms, uint64_t now) {
  if (*client_slot(p, conv, user, client)) return 0;
  int bits = 0;
  pclient_t *c = client_new(p, conv, user, client, now_ms, &bits);
  if (!c) return -CV_ENOMEM;
  grace_append(p, c, now);
  return 1;
}

void presence_remove(presence_t *p, const char *conv, const char *user, const char *client,
                     uint64_t now) {
  pclient_t *c = *client_slot(p, conv, user, client);
  if (!c || c->conns == 0) return;
  if (--c->conns == 0) grace_append(p, c, now);
}

void presence_each(const presence_t *p, presence_each_cb cb, void *ud) {
  for (size_t i = 0; i < BUCKETS; i++)
    for (pclient_t *c = p->clients[i]; c; c = c->next)
      cb(ud, c->user->conv->conv, c->user->user, c->client);
}

void presence_expire(presence_t *p, uint64_t now, presence_leave_cb cb, void *ud) {
  while (p->grace_head && p->grace_head->leave_at <= now) {
    pclient_t *c = p->grace_head;
    /* copies: the entry goes before the callback, which may add again */
    char conv[STORE_ID_MAX + 1], user[STORE_ID_MAX + 1], client[STORE_ID_MAX + 1];
    strcpy(conv, c->user->conv->conv);
    strcpy(user, c->user->user);
    strcpy(client, c->client);
    int last = client_free(p, c);
    cb(ud, conv, user, client, last);
  }
}

static int by_user(const void *a, const void *b) {
  return strcmp((*(puser_t *const *)a)->user, (*(puser_t *const *)b)->user);
}

int presence_list(const presence_t *p, const char *conv, const char *after, int limit, int max,
                  store_member_t **out, size_t *n, int64_t *count, int *more) {
  *out = NULL;
  *n = 0;
  *count = 0;
  *more = 0;
  pconv_t *cv = *conv_slot((presence_t *)p, conv);
  if (!cv) return 0;
  *count = cv->nusers;
  if (limit <= 0) return 0;
  puser_t **all = malloc((size_t)cv->nusers * sizeof *all);
  if (!all) return -CV_ENOMEM;
  size_t k = 0;
  for (puser_t *u = cv->users; u; u = u->cnext) all[k++] = u;
  qsort(all, k, sizeof *all, by_user);
  size_t listed = max > 0 && (size_t)max < k ? (size_t)max : k; /* past it: counted only */
  size_t from = 0;
  if (after && *after)
    while (from < listed && strcmp(all[from]->user, after) <= 0) from++;
  size_t take = listed - from < (size_t)limit ? listed - from : (size_t)limit;
  if (take > 0 && !(*out = calloc(take, sizeof **out))) {
    free(all);
    return -CV_ENOMEM;
  }
  for (size_t i = 0; i < take; i++) {
    strcpy((*out)[i].user, all[from + i]->user);
    (*out)[i].clients = all[from + i]->clients;
    (*out)[i].since_ms = all[from + i]->since_ms;
    (*out)[i].rank = (int64_t)(from + i + 1);
  }
  *n = take;
  *more = from + take < listed;
  free(all);
  return 0;
}

int presence_has(const presence_t *p, const char *conv, const char *user, const char *client) {
  return *client_slot((presence_t *)p, conv, user, client) != NULL;
}

size_t presence_entries(const presence_t *p) { return p->entries; }
