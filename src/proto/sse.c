/*
 * sse.c: a Server-Sent Events stream as a session (session.h,
 * docs/protocol.md 12). GET /v1/sse is a hello that came over HTTP: its
 * token, its conversations and, in Last-Event-ID, its watermarks. From
 * there it is the same session as a WebSocket's (admission, the welcome,
 * replay, live delivery, presence, signals, drain, token expiry); only the
 * encoding differs (net/ws.c: ws_start_sse), and the events' id, which
 * says every subscription's watermark so that the browser's automatic
 * reconnect resumes all of them: on every msg, and on the welcome, each
 * synced, a drain and a close, so that a stream that had no msg yet
 * resumes where it began, not at a later head.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/errors.h"
#include "net/ws.h"
#include "proto/session_int.h"

/* The id buffer: scratch, filled and read within one call, one per
 * thread (so two nodes on two loops share none), grown as needed and kept
 * for the thread's life, as client_uv.c's read buffer is. */
static _Thread_local struct {
  char *p;
  size_t cap;
} sse_ids;

const char *session_sse_id(session_t *s) {
  size_t need = 1;
  for (sub_t *sub = s->subs; sub; sub = sub->next)
    if (sub->announced) need += strlen(sub->conv) + 1 + 20 + 1 + strlen(sub->epoch) + 1;
  if (need > sse_ids.cap) {
    char *p = realloc(sse_ids.p, need * 2);
    if (!p) return NULL;
    sse_ids.p = p;
    sse_ids.cap = need * 2;
  }
  size_t len = 0;
  sse_ids.p[0] = '\0';
  for (sub_t *sub = s->subs; sub; sub = sub->next) {
    if (!sub->announced) continue;
    len += (size_t)snprintf(sse_ids.p + len, sse_ids.cap - len, "%s%s %lld%s%s", len ? "," : "",
                            sub->conv, (long long)sub->delivered, sub->epoch[0] ? " " : "",
                            sub->epoch);
  }
  return sse_ids.p;
}

/* One entry of a Last-Event-ID, `len` bytes at `p`: "CONV SEQ" or "CONV
 * SEQ EPOCH", one space apart, SEQ decimal digits that fit an int64_t.
 * 0, or -1 when it is not of that form. */
static int parse_entry(const char *p, size_t len, char id[STORE_ID_MAX + 1], int64_t *seq,
                       char epoch[STORE_EPOCH_MAX + 1]) {
  const char *end = p + len, *sp = memchr(p, ' ', len);
  if (!sp || sp == p || (size_t)(sp - p) > STORE_ID_MAX) return -1;
  memcpy(id, p, (size_t)(sp - p));
  id[sp - p] = '\0';
  const char *d = sp + 1, *q = d;
  int64_t v = 0;
  for (; q < end && *q >= '0' && *q <= '9'; q++) {
    if (v > (INT64_MAX - (*q - '0')) / 10) return -1; /* past the largest seq */
    v = v * 10 + (*q - '0');
  }
  if (q == d || !util_id_valid(id)) return -1;
  epoch[0] = '\0';
  if (q < end) {
    size_t n = (size_t)(end - q - 1);
    if (*q != ' ' || n == 0 || n > STORE_EPOCH_MAX) return -1;
    memcpy(epoch, q + 1, n);
    epoch[n] = '\0';
    if (!util_id_valid(epoch)) return -1;
  }
  *seq = v;
  return 0;
}

/* An entry's conversation id: where it starts and its length. */
typedef struct {
  const char *p;
  size_t len;
} id_span_t;

static int span_cmp(const void *a, const void *b) {
  const id_span_t *x = a, *y = b;
  int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

int session_sse_watermark(const char *last_event_id, const char *conv, int64_t *watermark,
                          char epoch[STORE_EPOCH_MAX + 1]) {
  *watermark = FRAME_WATERMARK_NONE;
  epoch[0] = '\0';
  if (!last_event_id || !*last_event_id) return 0;
  size_t n = 1, k = 0;
  for (const char *p = last_event_id; (p = strchr(p, ',')) != NULL; p++) n++;
  /* Every entry's id, sorted, so that one named twice is found in
   * O(n log n): an id is at most 16 KiB (rest.c), a stream asks once per
   * conversation. */
  id_span_t *ids = malloc(n * sizeof *ids);
  if (!ids) return -CV_ENOMEM;
  int rc = 0;
  for (const char *p = last_event_id;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char id[STORE_ID_MAX + 1], ep[STORE_EPOCH_MAX + 1];
    int64_t seq;
    if (parse_entry(p, len, id, &seq, ep) != 0) {
      rc = -1;
      break;
    }
    ids[k++] = (id_span_t){p, strlen(id)};
    if (strcmp(id, conv) == 0) {
      *watermark = seq;
      strcpy(epoch, ep);
    }
    if (!end) break;
    p = end + 1;
  }
  if (rc == 0) {
    qsort(ids, k, sizeof *ids, span_cmp);
    for (size_t i = 1; i < k && rc == 0; i++)
      if (span_cmp(&ids[i - 1], &ids[i]) == 0) rc = -1; /* a conversation named twice */
  }
  free(ids);
  if (rc != 0) {
    *watermark = FRAME_WATERMARK_NONE;
    epoch[0] = '\0';
  }
  return rc;
}

int session_sse_begin(conn_t *c, const char *token, const char *client_id, const char *const *convs,
                      size_t n, const char *last_event_id, int presence_events) {
  session_t *s = c->session;
  frame_client_t f = {.type = FRAME_HELLO, .token = token, .client_id = client_id, .nsubs = n};
  if (!s) return -CV_ENOMEM;
  f.subs = calloc(n ? n : 1, sizeof *f.subs);
  if (!f.subs) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return -CV_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    snprintf(f.subs[i].conv, sizeof f.subs[i].conv, "%s", convs[i]);
    f.subs[i].presence_events = presence_events;
    if (session_sse_watermark(last_event_id, convs[i], &f.subs[i].watermark, f.subs[i].epoch) != 0)
      f.subs[i].watermark = FRAME_WATERMARK_NONE; /* checked by the caller: not reached */
  }
  session_handle_hello(s, &f); /* no other frame comes: the request was the hello */
  free(f.subs);
  return 0;
}
