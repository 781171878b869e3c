/*
 * token.c: the token's life on a connection (session_int.h; docs/protocol.md
 * 4.7 and 11): its expiry on the monotonic clock, a `refresh` that replaces
 * it for the same user, and the close once exp (plus the leeway for clock
 * skew) passes without one. A refresh whose token no longer covers a
 * subscription ends that subscription (`error forbidden`, `unsubscribed`).
 * Loop thread only.
 */
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "core/log.h"
#include "core/metrics.h"
#include "net/ws.h"
#include "proto/session_int.h"

void session_token_set(session_t *s, auth_token_t *t) {
  auth_token_clear(&s->token);
  s->token = *t;
  memset(t, 0, sizeof *t);
  /* exp is wall-clock; the check runs on the monotonic clock, so that a
   * clock step after the hello neither ends nor extends a session. */
  int64_t left = s->token.exp_s * 1000 - util_now_ms();
  uint64_t now = util_mono_ms();
  s->expires_at = left > 0 ? now + (uint64_t)left : now;
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
  if (strcmp(t.sub, s->token.sub) != 0) {
    char msg[STORE_ID_MAX * 2 + 64];
    snprintf(msg, sizeof msg, "the new token is for %s, this connection is %s's", t.sub,
             s->token.sub);
    auth_token_clear(&t);
    metrics_add(s->ss->metrics, "converger_token_refreshes_total", "result=\"forbidden\"", 1);
    session_send_error(c, "forbidden", msg, NULL, 0, NULL);
    return;
  }
  session_token_set(s, &t);
  metrics_add(s->ss->metrics, "converger_token_refreshes_total", "result=\"ok\"", 1);
  session_send_owned(c, frame_refreshed(session_token_expires_in(s, util_mono_ms())));
  /* The new scope applies at once. */
  sub_t *sub = s->subs;
  while (sub) {
    sub_t *next = sub->next;
    if (!s->token.can_read || !auth_token_allows(&s->token, sub->conv)) {
      char conv[STORE_ID_MAX + 1];
      strcpy(conv, sub->conv);
      session_send_error(c, "forbidden", "the refreshed token does not cover this conversation",
                         conv, 0, NULL);
      sub_remove(s, sub);
      session_send_owned(c, frame_unsubscribed(conv));
    }
    sub = next;
  }
}
