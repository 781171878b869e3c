/*
 * rollw.c: a client worker of `converger bench roll` (bench/rollw.h).
 *
 * Owns its loop, its clients (one wcl_t each, the client's userdata) and
 * the records it writes at the end. Single thread: the forked child's.
 * Each client's on_state tells when it lost its welcomed connection (a
 * drop begins) and when it was welcomed again (an arrival; the drop ends);
 * on_message checks that seqs run 1, 2, 3 ... once each.
 */
#include "bench/rollw.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define LAT_BINS 60000 /* 1 ms bins up to 60 s; later ones land in the last */

typedef struct worker_s worker_t;

typedef struct {
  worker_t *w;
  cvg_client_t *c;
  size_t index; /* in the run */
  int conv;
  int64_t last;        /* last seq delivered */
  uint64_t dup, order; /* seqs at or below `last`; seqs beyond last + 1 */
  int node;            /* node index while welcomed, -1 otherwise */
  int welcomed;        /* welcomed at least once */
  int64_t drop_ms;     /* when the current drop began; -1: none */
  uint64_t since_ns;   /* when the current connection was welcomed, ns after t0 */
  uint64_t welcomes;   /* stats.welcomes at the last arrival counted */
  uint64_t replay_unavailable;
} wcl_t;

typedef struct {
  int64_t t;
  int node;
} arrival_t;

struct worker_s {
  const rollw_options_t *o;
  uv_loop_t loop;
  uv_timer_t tick;
  uv_pipe_t ctl;
  wcl_t *cl;
  size_t started, welcomed_once, closed;
  int ready_sent, heads_in, finishing;
  int64_t *heads;
  int64_t heads_deadline;
  char *line; /* one command line from the bench: the heads line is the longest */
  size_t line_cap;
  size_t line_len;
  /* records */
  arrival_t *arr;
  size_t narr, carr;
  int64_t *off;
  size_t noff, coff;
  uint32_t (*samples)[ROLLW_MAX_NODES];
  size_t nsamples;
  uint32_t *lat;          /* every delivery */
  uint32_t *live_lat;     /* live deliveries: sent after the current welcome */
  uint64_t joins, leaves; /* presence events its observers saw (rollw_options_t.presence) */
  FILE *out;
};

static int64_t now_ms(const worker_t *w) {
  return (int64_t)((uv_hrtime() - w->o->t0_ns) / 1000000u);
}

/* Parse one "roll-K" node id: K, or -1. */
static int rollw_node_index(const char *node_id) {
  int k;
  char tail;
  if (!node_id || sscanf(node_id, "roll-%d%c", &k, &tail) != 1) return -1;
  return k >= 0 && k < ROLLW_MAX_NODES ? k : -1;
}

static void push_arrival(worker_t *w, int64_t t, int node) {
  if (w->narr == w->carr) {
    size_t c = w->carr ? w->carr * 2 : 1024;
    arrival_t *a = realloc(w->arr, c * sizeof *a);
    if (!a) return;
    w->arr = a;
    w->carr = c;
  }
  w->arr[w->narr++] = (arrival_t){t, node};
}

static void push_offline(worker_t *w, int64_t ms) {
  if (w->noff == w->coff) {
    size_t c = w->coff ? w->coff * 2 : 1024;
    int64_t *a = realloc(w->off, c * sizeof *a);
    if (!a) return;
    w->off = a;
    w->coff = c;
  }
  w->off[w->noff++] = ms;
}

static void on_state(void *ud, cvg_state_t state, const char *detail) {
  (void)detail;
  wcl_t *c = ud;
  worker_t *w = c->w;
  if (w->finishing) return;
  int64_t t = now_ms(w);
  cvg_stats_t st;
  cvg_client_stats(c->c, &st);
  if (state == CVG_STATE_CONNECTED && st.welcomes > c->welcomes) {
    /* a welcome: a first one, the end of a drop, or a migration */
    c->welcomes = st.welcomes;
    c->since_ns = uv_hrtime() - w->o->t0_ns;
    c->node = rollw_node_index(st.node);
    push_arrival(w, t, c->node);
    if (!c->welcomed) {
      c->welcomed = 1;
      w->welcomed_once++;
    } else {
      push_offline(w, c->drop_ms >= 0 ? t - c->drop_ms : 0);
    }
    c->drop_ms = -1;
  } else if ((state == CVG_STATE_CONNECTING || state == CVG_STATE_WAITING) && c->welcomed &&
             c->drop_ms < 0) {
    c->drop_ms = t;
    c->node = -1;
  }
}

static void on_message(void *ud, const cvg_message_t *m) {
  wcl_t *c = ud;
  worker_t *w = c->w;
  if (m->seq <= c->last)
    c->dup++;
  else if (m->seq != c->last + 1)
    c->order++;
  if (m->seq > c->last) c->last = m->seq;
  const char *p = m->body ? strstr(m->body, "\"t\":") : NULL;
  if (p) {
    long long sent_ns = strtoll(p + 4, NULL, 10);
    uint64_t now = uv_hrtime() - w->o->t0_ns;
    if (sent_ns > 0 && now >= (uint64_t)sent_ns) {
      uint64_t ms = (now - (uint64_t)sent_ns) / 1000000u;
      size_t bin = ms < LAT_BINS ? ms : LAT_BINS - 1;
      w->lat[bin]++;
      /* live: sent after this connection's welcome (a replay was sent before) */
      if ((uint64_t)sent_ns >= c->since_ns) w->live_lat[bin]++;
    }
  }
}

static void on_error(void *ud, const char *code, const char *message, const char *conv) {
  (void)message;
  (void)conv;
  wcl_t *c = ud;
  if (code && strcmp(code, "replay_unavailable") == 0) c->replay_unavailable++;
}

/* --presence on: the first two clients of every conversation (client i is
 * in conversation i mod nconvs) watch its joins and leaves, so that a
 * leave anywhere is seen, an observer's own included (by the other one). */
static int observer(const rollw_options_t *o, const wcl_t *c) { return c->index < 2 * o->nconvs; }

static void on_presence(void *ud, const char *conv, int join, const char *user,
                        const char *client) {
  (void)conv;
  (void)user;
  (void)client;
  wcl_t *c = ud;
  if (c->w->finishing) return; /* the end closes every client: those leaves are not the roll's */
  if (join)
    c->w->joins++;
  else
    c->w->leaves++;
}

static void client_closed(void *ud) {
  worker_t *w = ud;
  w->closed++;
}

static int caught_up(const worker_t *w) {
  for (size_t i = 0; i < w->o->nclients; i++)
    if (w->cl[i].last < w->heads[w->cl[i].conv]) return 0;
  return 1;
}

static void write_records(worker_t *w) {
  FILE *f = w->out;
  for (size_t i = 0; i < w->narr; i++)
    fprintf(f, "A %lld %d\n", (long long)w->arr[i].t, w->arr[i].node);
  for (size_t i = 0; i < w->noff; i++) fprintf(f, "O %lld\n", (long long)w->off[i]);
  for (size_t i = 0; i < w->nsamples; i++) {
    fprintf(f, "S %zu", i);
    for (size_t k = 0; k < w->o->nnodes; k++) fprintf(f, " %u", w->samples[i][k]);
    fputc('\n', f);
  }
  for (size_t i = 0; i < LAT_BINS; i++) {
    if (w->lat[i]) fprintf(f, "L %zu %u\n", i, w->lat[i]);
    if (w->live_lat[i]) fprintf(f, "M %zu %u\n", i, w->live_lat[i]);
  }
  unsigned long long ok = 0, lost = 0, dup = 0, order = 0, sdkdup = 0, unav = 0, runav = 0,
                     attempts = 0, migrations = 0;
  for (size_t i = 0; i < w->o->nclients; i++) {
    wcl_t *c = &w->cl[i];
    int64_t head = w->heads[c->conv];
    cvg_stats_t st;
    cvg_client_stats(c->c, &st);
    sdkdup += st.duplicates;
    unav += st.unavailable;
    attempts += st.attempts;
    migrations += st.migrations;
    runav += c->replay_unavailable;
    dup += c->dup;
    order += c->order;
    if (c->last < head) lost += (unsigned long long)(head - c->last);
    if (c->last == head && !c->dup && !c->order)
      ok++;
    else
      fprintf(f, "X %zu %d %lld %lld %llu %llu\n", c->index, c->conv, (long long)c->last,
              (long long)head, (unsigned long long)c->dup, (unsigned long long)c->order);
  }
  if (w->o->presence)
    fprintf(f, "P %llu %llu\n", (unsigned long long)w->joins, (unsigned long long)w->leaves);
  fprintf(f, "V %llu %llu %llu %llu %llu %llu %llu %llu %llu\nE\n", ok, lost, dup, order, sdkdup,
          unav, runav, attempts, migrations);
  fflush(f);
}

static void finish(worker_t *w) {
  if (w->finishing) return;
  write_records(w); /* before closing: the stats need the clients */
  w->finishing = 1;
  uv_timer_stop(&w->tick);
  for (size_t i = 0; i < w->o->nclients; i++)
    if (w->cl[i].c) cvg_client_close(w->cl[i].c, client_closed, w);
  uv_close((uv_handle_t *)&w->tick, NULL);
  uv_close((uv_handle_t *)&w->ctl, NULL);
}

static void start_some(worker_t *w) {
  const rollw_options_t *o = w->o;
  size_t n = (size_t)o->start_per_100ms;
  for (; n > 0 && w->started < o->nclients; n--, w->started++) {
    wcl_t *c = &w->cl[w->started];
    cvg_sub_t sub = {.conv = o->convs[c->conv], .watermark = 0};
    cvg_options_t co;
    cvg_options_init(&co);
    co.urls = o->urls;
    co.nurls = o->nurls;
    co.token = o->token;
    co.subs = &sub;
    co.nsubs = 1;
    co.backoff = o->backoff;
    co.backoff_base_ms = o->backoff_base_ms;
    co.backoff_cap_ms = o->backoff_cap_ms;
    co.migrate_on_drain = o->migrate_on_drain;
    co.reconnect = o->reconnect;
    co.ignore_hints = o->ignore_hints;
    co.seed = o->seed ? o->seed * 1000003u + c->index + 1 : 0;
    co.cb.on_message = on_message;
    co.cb.on_state = on_state;
    co.cb.on_error = on_error;
    co.userdata = c;
    if (o->presence && observer(o, c)) { /* every client's join and leave of its conversation */
      co.presence_events = CVG_PRESENCE_CLIENTS;
      co.on_presence = on_presence;
    }
    char err[200];
    if (cvg_client_new(&w->loop, &co, &c->c, err, sizeof err) != 0 || cvg_client_start(c->c) != 0) {
      fprintf(stderr, "roll worker: client %zu: %s\n", c->index, err);
      exit(1);
    }
  }
}

static void tick_cb(uv_timer_t *t) {
  worker_t *w = t->data;
  start_some(w);
  /* one sample per 100 ms bucket since t0 (a late tick fills the gap) */
  size_t bucket = (size_t)(now_ms(w) / 100);
  if (bucket >= w->nsamples) {
    void *p = realloc(w->samples, (bucket + 1) * sizeof *w->samples);
    if (p) {
      w->samples = p;
      uint32_t row[ROLLW_MAX_NODES] = {0};
      for (size_t i = 0; i < w->started; i++)
        if (w->cl[i].node >= 0 && w->cl[i].drop_ms < 0 && w->cl[i].welcomed) row[w->cl[i].node]++;
      for (size_t b = w->nsamples; b <= bucket; b++) memcpy(w->samples[b], row, sizeof row);
      w->nsamples = bucket + 1;
    }
  }
  if (!w->ready_sent && w->welcomed_once == w->o->nclients) {
    w->ready_sent = 1;
    fprintf(w->out, "ready\n");
    fflush(w->out);
  }
  if (w->heads_in && (caught_up(w) || now_ms(w) >= w->heads_deadline)) finish(w);
}

static void ctl_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  worker_t *w = h->data;
  buf->base = w->line + w->line_len;
  buf->len = w->line_cap - 1 - w->line_len;
}

static void ctl_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  worker_t *w = s->data;
  if (n < 0) { /* the bench is gone */
    fprintf(stderr, "roll worker: the bench closed its socket (%s)\n", uv_strerror((int)n));
    exit(1);
  }
  w->line_len += (size_t)n;
  w->line[w->line_len] = '\0';
  char *nl = strchr(w->line, '\n');
  if (!nl) {
    if (w->line_len >= w->line_cap - 1) {
      fprintf(stderr, "roll worker: command line too long\n");
      exit(1);
    }
    return;
  }
  *nl = '\0';
  if (strncmp(w->line, "heads", 5) == 0 && !w->heads_in) {
    char *p = w->line + 5;
    for (size_t i = 0; i < w->o->nconvs; i++) w->heads[i] = strtoll(p, &p, 10);
    w->heads_in = 1;
    w->heads_deadline = now_ms(w) + w->o->wait_ms;
  }
  w->line_len = 0;
}

void rollw_main(const rollw_options_t *o) {
  static worker_t w;
  w.o = o;
  w.cl = calloc(o->nclients, sizeof *w.cl);
  w.heads = calloc(o->nconvs, sizeof *w.heads);
  /* "heads" and one signed 64-bit number per conversation */
  w.line_cap = 64 + o->nconvs * 21;
  if (w.line_cap < (1 << 16)) w.line_cap = 1 << 16;
  w.line = malloc(w.line_cap);
  w.lat = calloc(LAT_BINS, sizeof *w.lat);
  w.live_lat = calloc(LAT_BINS, sizeof *w.live_lat);
  w.out = fdopen(o->fd_out, "w");
  if (!w.cl || !w.heads || !w.line || !w.lat || !w.live_lat || !w.out ||
      uv_loop_init(&w.loop) != 0) {
    fprintf(stderr, "roll worker: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < o->nclients; i++)
    w.cl[i] = (wcl_t){.w = &w,
                      .index = o->first + i,
                      .conv = (int)((o->first + i) % o->nconvs),
                      .node = -1,
                      .drop_ms = -1};
  uv_pipe_init(&w.loop, &w.ctl, 0);
  w.ctl.data = &w;
  if (uv_pipe_open(&w.ctl, o->fd_in) != 0 ||
      uv_read_start((uv_stream_t *)&w.ctl, ctl_alloc, ctl_read) != 0) {
    fprintf(stderr, "roll worker: cannot read the bench's socket\n");
    exit(1);
  }
  uv_timer_init(&w.loop, &w.tick);
  w.tick.data = &w;
  uv_timer_start(&w.tick, tick_cb, 0, 100);
  uv_run(&w.loop, UV_RUN_DEFAULT);
  fclose(w.out);
  exit(w.closed == o->nclients ? 0 : 1);
}
