/* Fuzz target: the client library's core (client/client_core.c) fed with
 * server frames it cannot trust. The input is a list of lines; each line is
 * one event on the newest transport: "!CODE reason" closes it, "@" fires
 * the timer, "+" opens it (the core then sends hello), anything else is a
 * text frame. Whatever arrives, the core must not crash or leak, and the
 * application must see every conversation's messages exactly in seq order
 * from its watermark: c1 from 1, c2 from 6. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "converger/client.h"

typedef struct {
  cvg_core_t *core;
  uint32_t newest;
  int64_t timer_at, now;
  int64_t last[2];
} fz_t;

static void on_message(void *ud, const cvg_message_t *m) {
  fz_t *f = ud;
  int i = strcmp(m->conv, "c1") == 0 ? 0 : 1;
  if (m->seq != f->last[i] + 1) __builtin_trap(); /* out of order or twice */
  f->last[i] = m->seq;
  if (cvg_core_watermark(f->core, m->conv) != m->seq) __builtin_trap();
}

static void take(fz_t *f) {
  cvg_action_t a;
  while (cvg_core_next_action(f->core, &a)) {
    if (a.type == CVG_ACT_OPEN) f->newest = a.transport;
    if (a.type == CVG_ACT_TIMER) f->timer_at = a.at_ms;
    if (a.type == CVG_ACT_SEND && strlen(a.data) != a.len) __builtin_trap();
  }
}

static void on_sent(void *ud, const char *conv, const char *id, int64_t seq, const char *error) {
  if (!error && seq <= 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  static const char *const urls[] = {"ws://a:1/v1/ws", "ws://b:2/v1/ws"};
  cvg_sub_t subs[] = {{"c1", 0}, {"c2", 5}};
  fz_t f = {.timer_at = -1, .last = {0, 5}};
  cvg_options_t o;
  cvg_options_init(&o);
  o.urls = urls;
  o.nurls = 2;
  o.token = "t";
  o.subs = subs;
  o.nsubs = 2;
  o.seed = 1;
  o.max_pending_sends = 4;
  o.cb.on_message = on_message;
  o.userdata = &f;
  if (cvg_core_new(&o, &f.core, NULL, 0) != 0) __builtin_trap();
  cvg_core_start(f.core, 0);
  take(&f);
  cvg_core_opened(f.core, f.newest, 0);
  take(&f);
  cvg_core_send(f.core, "c1", "s1", "{\"a\":1}", on_sent, NULL, 0);
  take(&f);
  const char *p = (const char *)data, *end = p + len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = (size_t)((nl ? nl : end) - p);
    f.now += 10;
    if (n >= 1 && p[0] == '!') {
      int code = n >= 5 ? atoi((char[5]){p[1], p[2], p[3], p[4], 0}) : 1006;
      const char *r = n > 6 ? p + 6 : "";
      cvg_core_closed(f.core, f.newest, code, r, n > 6 ? n - 6 : 0, f.now);
    } else if (n == 1 && p[0] == '@') {
      if (f.timer_at > f.now) f.now = f.timer_at;
      cvg_core_timer(f.core, f.now);
    } else if (n == 1 && p[0] == '+') {
      cvg_core_opened(f.core, f.newest, f.now);
    } else {
      cvg_core_text(f.core, f.newest, p, n, f.now);
    }
    take(&f);
    p += n + (nl ? 1 : 0);
  }
  cvg_stats_t st;
  cvg_core_stats(f.core, f.now, &st);
  if (st.delivered != (uint64_t)(f.last[0] + f.last[1] - 5)) __builtin_trap();
  cvg_core_stop(f.core, f.now);
  take(&f);
  cvg_core_free(f.core);
  return 0;
}
