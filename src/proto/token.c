/*
 * token.c: the token's life on a connection (session_int.h; docs/protocol.md
 * 4.7 and 11): its expiry on the monotonic clock, a `refresh` that replaces
 * it for the same user, and the close once exp (plus the leeway for clock
 * skew) passes without one. A refresh whose token no longer covers a
 * subscription ends that subscription (`error forbidden`, `unsubscribed`).
 * The session keeps a compact copy of the token it took (its strings and
 * scope in one block with the client id; session_int.h), not the
 * auth_token_t, whose fixed arrays and JSON would be most of an idle
 * connection's memory. Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/metrics.h"
#include "net/ws.h"
#include "proto/session_int.h"

int session_token_set(session_t *s, auth_token_t *t, const char *client_id) {
  /* One block, every string at its own length: an idle connection holds
   * tens of bytes here, not an auth_token_t's fixed arrays and its JSON. */
  size_t cid = strlen(client_id) + 1, user = strlen(t->sub) + 1, jti = strlen(t->jti) + 1;
  size_t len = cid + user + jti, i;
  json_t *v;
  json_array_foreach(t->convs, i, v) len += strlen(json_string_value(v)) + 1;
  char *ids = malloc(len);
  if (!ids) {
    auth_token_clear(t);
    return -CV_ENOMEM;
  }
  char *p = ids;
  memcpy(p, client_id, cid);
  memcpy(p += cid, t->sub, user);
  memcpy(p += user, t->jti, jti);
  p += jti;
  const char *convs = p;
  json_array_foreach(t->convs, i, v) {
    size_t n = strlen(json_string_value(v)) + 1;
    memcpy(p, json_string_value(v), n);
    p += n;
  }
  free(s->ids); /* client_id may have pointed into it: copied above */
  s->ids = ids;
  s->client_id = ids;
  s->user = ids + cid;
  s->jti = s->user + user;
  s->convs = convs;
  s->nconvs = (uint32_t)json_array_size(t->convs);
  s->all_convs = t->all_convs != 0;
  s->can_read = t->can_read != 0;
  s->can_write = t->can_write != 0;
  /* exp is wall-clock; the check runs on the monotonic clock, so that a
   * clock step after the hello neither ends nor extends a session. */
  int64_t left = t->exp_s * 1000 - util_now_ms();
  uint64_t now = util_mono_ms();
  s->expires_at = left > 0 ? now + (uint64_t)left : now;
  auth_token_clear(t);
  return 0;
}

/* The token's convs cover `conv` (auth_token_allows over the copy). */
static int covers(const session_t *s, const char *conv) {
  if (s->all_convs) return 1;
  const char *c = s->convs;
  for (uint32_t i = 0; i < s->nconvs; i++, c += strlen(c) + 1)
    if (strcmp(c, conv) == 0) return 1;
  return 0;
}

int session_may_read(const session_t *s, const char *conv) {
  return s->can_read && covers(s, conv);
}

int session_may_write(const session_t *s, const char *conv) {
  return s->can_write && covers(s, conv);
}

int64_t session_token_expires_in(const session_t *s, uint64_t now) {
  return (int64_t)s->expires_at - (int64_t)now;
}

int session_check_expiry(session_t *s, uint64_t now) {
  if (!s->hello_seen || now < s->expires_at + (uint64_t)s->ss->cfg->token_leeway_ms) return 0;
  metrics_add(s->ss->metrics, "converger_token_expired_total", NULL, 1);
  session_send_error(s->conn, "token_expired", "the token expired; connect again with a new one",
                     NULL, 0, NULL);
  ws_close(s->conn, WS_CLOSE_POLICY_VIOLATION, "token_expired");
  return 1;
}

void session_handle_refresh(session_t *s, frame_client_t *f) {
  conn_t *c = s->conn;
  auth_token_t t = {0};
  const char *why = NULL;
  if (auth_verify(s->ss->auth, f->token, util_now_ms() / 1000, &t, &why) != 0 ||
      auth_is_revoked(s->ss->auth, t.jti)) {
    if (!why) why = "token revoked";
    auth_token_clear(&t);
    metrics_add(s->ss->metrics, "converger_token_refreshes_total", "result=\"unauthorized\"", 1);
    session_send_error(c, "unauthorized", why, NULL, 0, NULL);
    ws_close(c, WS_CLOSE_POLICY_VIOLATION, "unauthorized");
    return;
  }
  if (strcmp(t.sub, s->user) != 0) {
    char msg[STORE_ID_MAX * 2 + 64];
    snprintf(msg, sizeof msg, "the new token is for %s, this connection is %s's", t.sub, s->user);
    auth_token_clear(&t);
    metrics_add(s->ss->metrics, "converger_token_refreshes_total", "result=\"forbidden\"", 1);
    session_send_error(c, "forbidden", msg, NULL, 0, NULL);
    return;
  }
  /* The same user: its count in ss->users (user_counted) stays as it is. */
  if (session_token_set(s, &t, s->client_id) != 0) {
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  metrics_add(s->ss->metrics, "converger_token_refreshes_total", "result=\"ok\"", 1);
  session_send_owned(c, frame_refreshed(session_token_expires_in(s, util_mono_ms())));
  /* The new scope applies at once. */
  sub_t *sub = s->subs;
  while (sub) {
    sub_t *next = sub->next;
    if (!session_may_read(s, sub->conv))
      sub_end(sub, "forbidden", "the refreshed token does not cover this conversation", 1);
    sub = next;
  }
}
