/*
 * send.c: a `send` frame of a session (session_int.h) and its store job:
 * `sent` once committed, an error with the frame's id otherwise.
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

/* ---- send ------------------------------------------------------------------- */

typedef struct {
  bus_append_job_t append; /* the group commit's job (bus.h); a.* point at the fields below */
  conn_t *conn;
  char conv[STORE_ID_MAX + 1];
  char id[STORE_ID_MAX + 1];
  char sender[STORE_ID_MAX + 1];
  char *body;
  int status;
} send_job_t;

static void send_done(pool_job_t *job) {
  send_job_t *j = container_of(job, send_job_t, append.job);
  j->status = pool_job_unrun(job) ? pool_job_unrun(job) : j->append.a.status;
  if (conn_unref(j->conn)) {
    conn_t *c = j->conn;
    json_t *details = json_pack("{s:s}", "id", j->id);
    switch (j->status) {
    case 0:
      json_decref(details);
      session_send_owned(c, frame_sent(j->conv, j->append.a.msg.id, j->append.a.msg.seq));
      break;
    case -CV_ENOTFOUND:
    case -CV_EINACTIVE:
      session_send_conv_error(c, j->status, j->conv, details);
      break;
    case -CV_ESHARD:
      /* A sharded cluster's instance of this conversation only: the
       * connection stays for the others; the client sends again with the
       * same id after the hint (docs/protocol.md, 4.3). */
      log_warn("send to %s failed: %s", j->conv, cv_strerror(j->status));
      session_send_error(
          c, "unavailable", "the conversation's shard is unavailable; send again after the hint",
          j->conv, config_retry_hint(c->session->ss->cfg, c->session->ss->rng), details);
      break;
    default:
      /* The client reconnects after the hint and sends again with the same
       * id (docs/protocol.md: unavailable is followed by 1013). */
      log_warn("send to %s failed: %s", j->conv, cv_strerror(j->status));
      session_refuse_unavailable(c, "store unavailable; send again later", j->conv, details);
      break;
    }
  }
  store_msg_clear(&j->append.a.msg);
  free(j->body);
  free(j);
}

void session_handle_send(session_t *s, frame_client_t *f) {
  conn_t *c = s->conn;
  json_t *details = json_pack("{s:s}", "id", f->id);
  if (!session_may_write(s, f->conv)) {
    session_send_error(c, "forbidden", "the token may not send to this conversation", f->conv, 0,
                       details);
    return;
  }
  json_decref(details);
  send_job_t *j = calloc(1, sizeof *j);
  if (!j || !(j->body = frame_dump(f->body))) {
    free(j);
    ws_close(c, WS_CLOSE_INTERNAL_ERROR, "out of memory");
    return;
  }
  j->conn = c;
  strcpy(j->conv, f->conv);
  strcpy(j->id, f->id);
  strcpy(j->sender, s->user);
  j->append.a =
      (store_append_t){.conv = j->conv, .id = j->id, .sender = j->sender, .body = j->body};
  j->append.job.kind = "ws_send";
  j->append.job.deadline_ms = config_store_deadline(s->ss->cfg);
  conn_ref(c);
  bus_append_submit(s->ss->bus, *s->ss->pool, &j->append, send_done);
}
