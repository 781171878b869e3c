/*
 * appender.c: closed-loop and paced REST appenders of `converger bench
 * store` (see bench/appender.h).
 *
 * One phase at a time owns a phase_t on the caller's stack: its sender
 * connections, and for the paced phase its two timers (pace: every 1 ms,
 * moves the messages that are due into a FIFO and writes them on idle
 * connections; giveup: --wait after the last write). The phase is complete
 * when done() says so; b->hold_until_ns is kept at UINT64_MAX so that
 * run_maybe_done, which the WebSocket subscriber calls, never ends it.
 */
#include "bench/appender.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/restc.h"
#include "common/util.h"

typedef struct phase_s phase_t;

/* One keep-alive REST connection (bench/restc.h) with at most one append
 * in flight. */
typedef struct {
  restc_t conn;
  phase_t *ph;
  int busy; /* an append is in flight */
  size_t conv_index;
  uint64_t k;       /* appends written (throughput: the key's counter) */
  uint64_t sent_ns; /* when the append in flight was first written */
  int refused;      /* the append in flight was refused (503) at least once */
  char key[48];     /* its Idempotency-Key */
  size_t msg;       /* paced: the message in flight */
} sender_t;

struct phase_s {
  bench_t *b;
  int paced;
  int loading; /* 0 while connecting */
  sender_t *snd;
  size_t nsnd, connected, active;
  const char *const *convs;
  /* throughput */
  uint64_t win_start, win_end;
  appender_tput_t *tput;
  size_t lat_cap;
  /* paced */
  appender_paced_t *pc;
  long long wait_ms;
  size_t next_sched, written, acked, received;
  size_t *queue, qhead, qtail;
  uv_timer_t pace, giveup;
  int timers; /* the two timers are initialized */
  int gave_up;
};

static char body_json[256]; /* {"sender":"bench","body":{...100 bytes...}} */
/* What a POST goes to, and the answer that acknowledges it (appender_route). */
static const char *route = "messages";
static int ack_status = 201;

void appender_route(const char *what) {
  int signals = what && strcmp(what, "signals") == 0;
  route = signals ? "signals" : "messages";
  ack_status = signals ? 202 : 201;
}
static size_t body_len;

static void body_init(void) {
  if (body_len) return;
  char text[APPENDER_BODY_BYTES - 11 + 1]; /* {"text":"..."} is 11 bytes + the text */
  memset(text, 'x', sizeof text - 1);
  text[sizeof text - 1] = '\0';
  body_len = (size_t)snprintf(body_json, sizeof body_json,
                              "{\"sender\":\"bench\",\"body\":{\"text\":\"%s\"}}", text);
}

/* The phase's want_* are ours: nothing of run_maybe_done's completes it. */
static void quiet(bench_t *b) {
  b->want_open = b->want_synced = b->want_rest_connected = b->want_rest_answers = 0;
  b->want_msgs = 0;
  b->hold_until_ns = UINT64_MAX;
}

static void done(phase_t *ph) {
  bench_t *b = ph->b;
  if (b->stopped || b->failed) return;
  b->done_ns = run_now_ns();
  b->stopped = 1;
  uv_stop(&b->loop);
}

/* Write the append c->key to `conv`; a retry (c->refused) keeps the time
 * of the first write. */
static void write_append(sender_t *c, const char *conv) {
  bench_t *b = c->ph->b;
  char req[1024];
  int n = snprintf(req, sizeof req,
                   "POST /v1/conversations/%s/%s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                   "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                   "Idempotency-Key: %s\r\nContent-Length: %zu\r\n\r\n%s",
                   conv, route, b->port, b->api_key, c->key, body_len, body_json);
  if (n < 0 || (size_t)n >= sizeof req) {
    run_fail(b, "%s: the append request to %s does not fit %zu bytes", b->phase, conv, sizeof req);
    return;
  }
  c->busy = 1;
  if (!c->refused) {
    c->k++;
    c->sent_ns = run_now_ns();
  }
  run_send(b, (uv_stream_t *)&c->conn.tcp, req, (size_t)n);
}

/* ---- throughput: closed-loop senders -------------------------------------------- */

static void tput_next(sender_t *c) {
  snprintf(c->key, sizeof c->key, "%zu-%llu", c->conn.index, (unsigned long long)c->k);
  write_append(c, c->ph->convs[c->conv_index]);
}

static void tput_answer(sender_t *c, uint64_t now) {
  phase_t *ph = c->ph;
  appender_tput_t *t = ph->tput;
  t->acks[c->conv_index]++;
  if (now >= ph->win_start && now <= ph->win_end) {
    if (t->nlat == ph->lat_cap) {
      size_t cap = ph->lat_cap ? ph->lat_cap * 2 : 4096;
      uint64_t *l = realloc(t->lat_ns, cap * sizeof *l);
      if (!l) {
        run_fail(ph->b, "out of memory");
        return;
      }
      t->lat_ns = l;
      ph->lat_cap = cap;
    }
    t->lat_ns[t->nlat++] = now - c->sent_ns;
    t->answered++;
    t->win[c->conv_index]++;
  }
  /* the next append goes to the next of this sender's conversations:
   * i, i + senders, i + 2 senders, ... (one each when there are as many
   * conversations as senders, all on one when there is one) */
  c->conv_index = (c->conv_index + ph->nsnd) % t->nconvs;
  if (now < ph->win_end)
    tput_next(c);
  else if (--ph->active == 0)
    done(ph);
}

/* ---- paced: scheduled messages, one subscriber ------------------------------------ */

static void paced_check(phase_t *ph) {
  if (ph->acked == ph->pc->n && (ph->received == ph->pc->n || ph->gave_up)) done(ph);
}

static void giveup_cb(uv_timer_t *t) {
  phase_t *ph = container_of(t, phase_t, giveup);
  ph->gave_up = 1;
  paced_check(ph);
}

/* Write queued messages on idle connections. */
static void dispatch(phase_t *ph) {
  appender_paced_t *p = ph->pc;
  for (size_t i = 0; i < ph->nsnd && ph->qhead < ph->qtail && !ph->b->failed; i++) {
    sender_t *c = &ph->snd[i];
    if (c->busy) continue;
    size_t m = ph->queue[ph->qhead++];
    c->msg = m;
    snprintf(c->key, sizeof c->key, "L%zu", m);
    write_append(c, ph->convs[0]);
    p->write_ns[m] = c->sent_ns;
    if (++ph->written == p->n) uv_timer_start(&ph->giveup, giveup_cb, (uint64_t)ph->wait_ms, 0);
  }
}

static void pace_cb(uv_timer_t *t) {
  phase_t *ph = container_of(t, phase_t, pace);
  appender_paced_t *p = ph->pc;
  uint64_t now = run_now_ns();
  while (ph->next_sched < p->n && p->sched_ns[ph->next_sched] <= now)
    ph->queue[ph->qtail++] = ph->next_sched++;
  dispatch(ph);
  if (ph->next_sched == p->n) uv_timer_stop(&ph->pace);
}

static void paced_answer(sender_t *c, uint64_t now) {
  phase_t *ph = c->ph;
  ph->pc->ack_ns[c->msg] = now;
  ph->acked++;
  dispatch(ph);
  paced_check(ph);
}

/* b->on_msg: note when message "L<i>" reached the subscriber. */
static void paced_on_msg(bench_t *b, int64_t seq, const char *frame, size_t len) {
  phase_t *ph = b->user;
  appender_paced_t *p = ph->pc;
  const char *k = memmem(frame, len, "\"id\":\"L", 7);
  if (!k) return;
  const char *q = k + 7, *end = frame + len;
  size_t i = 0;
  int any = 0;
  for (; q < end && *q >= '0' && *q <= '9'; q++, any = 1) i = i * 10 + (size_t)(*q - '0');
  if (!any || q >= end || *q != '"' || i >= p->n) return;
  if (p->recv_ns[i]) {
    p->dup++;
    return;
  }
  p->recv_ns[i] = run_now_ns();
  ph->received++;
  paced_check(ph);
}

/* ---- the connections ------------------------------------------------------------- */

/* restc_answer_cb: the answer to the append in flight. */
static void on_answer(restc_t *r, int st) {
  sender_t *c = container_of(r, sender_t, conn);
  phase_t *ph = c->ph;
  bench_t *b = ph->b;
  uint64_t now = run_now_ns();
  if (!c->busy) {
    run_fail(b, "%s: an answer (%d) with no append in flight", b->phase, st);
    return;
  }
  c->busy = 0;
  if (st == 503) { /* shed before it ran: the same append again */
    c->refused = 1;
    if (ph->paced)
      ph->pc->refused++;
    else
      ph->tput->refused++;
    if (!ph->paced && now >= ph->win_end) { /* nothing stored: this sender is done */
      c->refused = 0;
      if (--ph->active == 0) done(ph);
      return;
    }
    write_append(c, ph->convs[c->conv_index]);
    return;
  }
  if (st != ack_status && !(st == 200 && c->refused)) {
    run_fail(b, "%s: an append to %s (key %s) answered %d: %s", b->phase, ph->convs[c->conv_index],
             c->key, st, r->body);
    return;
  }
  if (st == 200) {
    if (ph->paced)
      ph->pc->retry_200++;
    else
      ph->tput->retry_200++;
  }
  c->refused = 0;
  if (ph->paced)
    paced_answer(c, now);
  else
    tput_answer(c, now);
}

/* restc_connected_cb: the phase's connecting step ends with the last one. */
static void on_connected(restc_t *r) {
  phase_t *ph = container_of(r, sender_t, conn)->ph;
  if (++ph->connected == ph->nsnd && !ph->loading) done(ph);
}

/* Connect ph->nsnd senders to b->port and run the loop until all are. */
static int senders_open(phase_t *ph) {
  bench_t *b = ph->b;
  if (!(ph->snd = calloc(ph->nsnd, sizeof *ph->snd))) {
    run_fail(b, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < ph->nsnd; i++) {
    ph->snd[i].ph = ph;
    if (restc_open(b, &ph->snd[i].conn, i, on_connected, on_answer) != 0) return -1;
  }
  quiet(b);
  return run_phase(b, ph->paced ? "latency: connecting" : "appends: connecting");
}

static void handle_close_cb(uv_handle_t *h) {
  bench_t *b = h->data;
  b->handles--;
}

/* Close the senders (RST) and the timers, and let the close callbacks run. */
static void phase_end(phase_t *ph) {
  bench_t *b = ph->b;
  b->closing = 1;
  size_t left = b->handles;
  for (size_t i = 0; ph->snd && i < ph->nsnd; i++) left -= (size_t)restc_close(&ph->snd[i].conn);
  if (ph->timers) {
    ph->timers = 0;
    left -= 2;
    uv_close((uv_handle_t *)&ph->pace, handle_close_cb);
    uv_close((uv_handle_t *)&ph->giveup, handle_close_cb);
  }
  run_drain_closes(b, left);
  free(ph->snd);
  ph->snd = NULL;
  free(ph->queue);
  ph->queue = NULL;
  b->closing = 0;
}

/* ---- the two phases -------------------------------------------------------------- */

int appender_throughput(bench_t *b, size_t nsenders, const char *const *convs, size_t nconvs,
                        uint64_t warmup_ms, uint64_t duration_ms, appender_tput_t *out) {
  memset(out, 0, sizeof *out);
  body_init();
  phase_t ph = {.b = b, .nsnd = nsenders, .convs = convs, .tput = out};
  out->acks = calloc(nconvs, sizeof *out->acks);
  out->win = calloc(nconvs, sizeof *out->win);
  if (!out->acks || !out->win) {
    run_fail(b, "out of memory");
    return -1;
  }
  out->nconvs = nconvs;
  int r = senders_open(&ph);
  if (r == 0) {
    ph.loading = 1;
    ph.active = nsenders;
    uint64_t t0 = run_now_ns();
    ph.win_start = t0 + warmup_ms * 1000000u;
    ph.win_end = ph.win_start + duration_ms * 1000000u;
    out->window_s = (double)duration_ms / 1000.0;
    for (size_t i = 0; i < nsenders && !b->failed; i++) {
      ph.snd[i].conv_index = i % nconvs;
      tput_next(&ph.snd[i]);
    }
    r = run_phase(b, "appends: sending");
  }
  phase_end(&ph);
  return r;
}

void appender_tput_free(appender_tput_t *t) {
  free(t->lat_ns);
  free(t->acks);
  free(t->win);
  memset(t, 0, sizeof *t);
}

int appender_paced(bench_t *b, size_t nconns, const char *conv, int sub_port, const char *sub_token,
                   long long rate, long long duration_ms, long long wait_ms,
                   appender_paced_t *out) {
  memset(out, 0, sizeof *out);
  body_init();
  size_t n = (size_t)(rate * duration_ms / 1000);
  if (n == 0) n = 1;
  const char *const convs[1] = {conv};
  phase_t ph = {.b = b, .paced = 1, .nsnd = nconns, .convs = convs, .pc = out, .wait_ms = wait_ms};
  out->n = n;
  out->sched_ns = calloc(n, sizeof *out->sched_ns);
  out->write_ns = calloc(n, sizeof *out->write_ns);
  out->ack_ns = calloc(n, sizeof *out->ack_ns);
  out->recv_ns = calloc(n, sizeof *out->recv_ns);
  ph.queue = calloc(n, sizeof *ph.queue);
  if (!out->sched_ns || !out->write_ns || !out->ack_ns || !out->recv_ns || !ph.queue) {
    free(ph.queue);
    run_fail(b, "out of memory");
    return -1;
  }
  uv_timer_init(&b->loop, &ph.pace);
  uv_timer_init(&b->loop, &ph.giveup);
  ph.pace.data = ph.giveup.data = b;
  ph.timers = 1;
  b->handles += 2;

  char *own_token = b->token;
  int r = senders_open(&ph);
  if (r == 0) {
    /* The subscriber: watermark null, so it starts live at the head. */
    b->token = (char *)sub_token;
    b->hello_conv = conv;
    b->ws_port = sub_port;
    if (wsc_set_begin(b, 1, 1, 0, -1) != 0) {
      r = -1;
    } else {
      b->want_open = b->want_synced = 1;
      wsc_open_more(b);
      r = run_phase(b, "latency: subscribing");
    }
  }
  if (r == 0) {
    quiet(b);
    b->on_msg = paced_on_msg;
    b->user = &ph;
    ph.loading = 1;
    uint64_t t0 = run_now_ns();
    for (size_t i = 0; i < n; i++) out->sched_ns[i] = t0 + (uint64_t)((double)i * 1e9 / rate);
    uv_timer_start(&ph.pace, pace_cb, 1, 1);
    pace_cb(&ph.pace);
    r = run_phase(b, "latency: sending");
    out->seq_errors = b->seq_errors;
  }
  b->on_msg = NULL;
  b->user = NULL;
  wsc_set_end(b);
  b->token = own_token;
  b->hello_conv = NULL;
  b->ws_port = 0;
  phase_end(&ph);
  return r;
}

void appender_paced_free(appender_paced_t *p) {
  free(p->sched_ns);
  free(p->write_ns);
  free(p->ack_ns);
  free(p->recv_ns);
  memset(p, 0, sizeof *p);
}
