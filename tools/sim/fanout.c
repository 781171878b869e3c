/*
 * sim/fanout.c: the fleet on paper, its model and wire sizes (see
 * fanout.h; the summary, the table and the flags are in fanout_report.c).
 */
#include "sim/fanout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Decimal digits of n >= 0. */
static int64_t digits(int64_t n) {
  int64_t d = 1;
  while (n >= 10) n /= 10, d++;
  return d;
}

/* A RESP2 bulk string of n bytes: "$<n>\r\n<bytes>\r\n". */
static int64_t bulk(int64_t n) { return 1 + digits(n) + 2 + n + 2; }

double fanout_notify_bytes_per_msg(int64_t payload, int64_t batch) {
  /* 'A', Int32 length, Int32 pid, channel NUL, payload NUL */
  int64_t frame = 1 + 4 + 4 + (int64_t)sizeof FANOUT_NOTIFY_CHANNEL;
  if (batch <= 1) return (double)(frame + payload + 1);
  /* "b\n" then "<len> <payload>" per message, one NUL */
  return (double)(frame + 2 + 1) / (double)batch + (double)(digits(payload) + 1 + payload);
}

int64_t fanout_push_bytes(int64_t channel, int64_t payload) {
  return 4 /* *3\r\n */ + bulk(7) /* message or PUBLISH */ + bulk(channel) + bulk(payload);
}

int64_t fanout_reply_bytes(int64_t receivers) { return 1 + digits(receivers) + 2; }

int64_t fanout_confirm_bytes(int unsub, int64_t channel, int64_t count) {
  return 4 + bulk(unsub ? 11 : 9) + bulk(channel) + 1 + digits(count) + 2;
}

void fanout_params_default(fanout_params_t *p) {
  *p = (fanout_params_t){
      .nodes = 480,
      .clients = 13000000,
      .appends_per_s = 20000,
      .msg_bytes = 300,
      .subs_per_client = 5,
      .online_per_conv = 3,
      .size_dist = FANOUT_SIZE_FIXED,
      .size_max = 100000,
      .rate_by = FANOUT_RATE_SIZE,
      .conv_id_bytes = 16,
      .notify_batch = 1,
      .churn_per_million = 6154, /* 80 000 reconnects/min at 13 M clients, as sim's */
      .control_per_s = 10,
      .control_bytes = 200,
      .bus_instances = 16,
      .seed = 1,
  };
}

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      snprintf(err, errlen, __VA_ARGS__);                                                          \
      return -1;                                                                                   \
    }                                                                                              \
  } while (0)

int fanout_params_check(const fanout_params_t *p, char *err, size_t errlen) {
  CHECK(p->nodes >= 1 && p->nodes <= 60000, "--nodes wants [1, 60000]");
  CHECK(p->clients >= 1 && p->clients <= 100000000, "--clients wants [1, 100000000]");
  CHECK(p->subs_per_client >= 1 && p->subs_per_client <= 1000, "--subs-per-client wants [1, 1000]");
  CHECK(p->online_per_conv >= 1 && p->online_per_conv <= p->clients,
        "--online-per-conv wants [1, --clients]");
  CHECK(p->appends_per_s >= 0, "--appends-per-s wants >= 0");
  CHECK(p->msg_bytes >= 1 && p->msg_bytes <= FANOUT_NOTIFY_MAX,
        "--msg-bytes wants [1, %d] (PostgreSQL's NOTIFY payload limit)", FANOUT_NOTIFY_MAX);
  CHECK(p->notify_batch >= 1 &&
            (p->notify_batch == 1 ||
             2 + p->notify_batch * (digits(p->msg_bytes) + 1 + p->msg_bytes) <= FANOUT_NOTIFY_MAX),
        "--notify-batch %lld: that many messages of --msg-bytes do not fit in one NOTIFY "
        "(%d bytes)",
        (long long)p->notify_batch, FANOUT_NOTIFY_MAX);
  CHECK(p->conv_id_bytes >= 1 && p->conv_id_bytes <= 128, "--conv-id-bytes wants [1, 128]");
  CHECK(p->bus_instances >= 1 && p->bus_instances <= 100000, "--bus-instances wants [1, 100000]");
  CHECK(p->size_dist >= FANOUT_SIZE_FIXED && p->size_dist <= FANOUT_SIZE_ZIPF,
        "--conv-size-dist wants fixed, geometric or zipf");
  CHECK(p->rate_by == FANOUT_RATE_SIZE || p->rate_by == FANOUT_RATE_CONV,
        "--rate-by wants size or conv");
  if (p->size_dist != FANOUT_SIZE_FIXED) {
    CHECK(p->size_max >= p->online_per_conv && p->size_max <= p->clients &&
              p->size_max <= FANOUT_SIZE_MAX_LIMIT,
          "--conv-size-max %lld wants [--online-per-conv, min(--clients, %d)]",
          (long long)p->size_max, FANOUT_SIZE_MAX_LIMIT);
  }
  if (p->size_dist == FANOUT_SIZE_ZIPF)
    CHECK(p->online_per_conv == 1 || 2 * p->online_per_conv < p->size_max + 1,
          "zipf: --online-per-conv %lld must be below the middle of [1, --conv-size-max] "
          "(the mean of a flat distribution)",
          (long long)p->online_per_conv);
  CHECK(p->churn_per_million >= 0 && p->control_per_s >= 0, "rates want >= 0");
  CHECK(p->control_bytes >= 1 && p->control_bytes <= 1000000, "--control-bytes wants [1, 10^6]");
  return 0;
}

/* The mean of P(k) ~ k^-s on [1, n]. */
static double zipf_mean(double s, int64_t n) {
  double num = 0, den = 0;
  for (int64_t k = 1; k <= n; k++) {
    double t = exp(-s * log((double)k));
    den += t;
    num += t * (double)k;
  }
  return num / den;
}

/* Solve zipf_mean(s, n) = mean by bisection (the mean falls as s grows)
 * and fill the CDF. */
static void zipf_setup(fanout_t *f) {
  int64_t n = f->p.size_max;
  double mean = (double)f->p.online_per_conv, s = 0;
  if (f->p.online_per_conv == 1) {
    s = INFINITY; /* everything at 1 */
  } else {
    double lo = 0, hi = 64;
    for (int i = 0; i < 48; i++) {
      s = (lo + hi) / 2;
      if (zipf_mean(s, n) > mean)
        lo = s;
      else
        hi = s;
    }
    s = (lo + hi) / 2;
  }
  f->zipf_exponent = s;
  double sum = 0;
  for (int64_t k = 1; k <= n; k++) {
    sum += isinf(s) ? (k == 1) : exp(-s * log((double)k));
    f->zipf_cdf[k - 1] = sum;
  }
  for (int64_t k = 0; k < n; k++) f->zipf_cdf[k] /= sum;
  f->zipf_cdf[n - 1] = 1.0;
}

/* Uniform in [0, 1). */
static double unit(jitter_rng_t *rng) { return (double)(jitter_next(rng) >> 11) * 0x1.0p-53; }

static int64_t draw_size(fanout_t *f) {
  const fanout_params_t *p = &f->p;
  switch (p->size_dist) {
  case FANOUT_SIZE_GEOMETRIC: {
    if (p->online_per_conv == 1) return 1;
    /* P(k) = q^(k-1) (1 - q), q = 1 - 1 / mean; by inversion, u in (0, 1] */
    double u = 1.0 - unit(&f->rng);
    double k = 1 + floor(log(u) / log(1.0 - 1.0 / (double)p->online_per_conv));
    return k >= (double)p->size_max ? p->size_max : (int64_t)k;
  }
  case FANOUT_SIZE_ZIPF: {
    double u = unit(&f->rng);
    int64_t lo = 0, hi = p->size_max - 1; /* the first index with cdf > u */
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if (f->zipf_cdf[mid] > u)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo + 1;
  }
  default:
    return p->online_per_conv;
  }
}

/* A node in proportion to its clients: a uniform node (the high 32 bits),
 * kept when the low 32 bits fall below its threshold (clients / the most
 * any node has, in 2^-32). */
static int64_t draw_node(fanout_t *f) {
  uint64_t n = (uint64_t)f->p.nodes;
  for (;;) {
    uint64_t r = jitter_next(&f->rng);
    uint64_t k = ((r >> 32) * n) >> 32;
    if ((r & 0xffffffffu) < f->accept[k] || f->accept[k] > 0xffffffffu) return (int64_t)k;
  }
}

/* Lamping and Veach's jump consistent hash: a bucket in [0, n) that moves
 * for only 1/n of the keys when n grows (the design's conversation ->
 * instance map; SCALE-OUT: FNV-1a + jump). */
static int64_t jump(uint64_t key, int64_t n) {
  int64_t b = -1, j = 0;
  while (j < n) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = (int64_t)((double)(b + 1) * ((double)(1LL << 31) / (double)((key >> 33) + 1)));
  }
  return b;
}

/* A stand-in for FNV-1a of the conversation's id: synthetic conversations
 * are numbered, and splitmix64 spreads the numbers as a hash of ids would. */
static uint64_t conv_key(int64_t c) {
  uint64_t z = (uint64_t)c + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void fanout_free(fanout_t *f) {
  free(f->clients_on), free(f->notify_in), free(f->msg_in), free(f->control_in);
  free(f->kept), free(f->pairs), free(f->subs), free(f->single);
  free(f->bus_subs), free(f->bus_egress), free(f->bus_ingress);
  free(f->zipf_cdf), free(f->accept), free(f->stamp), free(f->count), free(f->seen);
  free(f->w_msgs), free(f->bus_w), free(f->bus_w_fan), free(f->bus_w_reply);
  memset(f, 0, sizeof *f);
}

int fanout_init(fanout_t *f, const fanout_params_t *p) {
  memset(f, 0, sizeof *f);
  f->p = *p;
  size_t n = (size_t)p->nodes, b = (size_t)p->bus_instances;
  f->clients_on = calloc(n, sizeof *f->clients_on);
  f->notify_in = calloc(n, sizeof *f->notify_in);
  f->msg_in = calloc(n, sizeof *f->msg_in);
  f->control_in = calloc(n, sizeof *f->control_in);
  f->kept = calloc(n, sizeof *f->kept);
  f->pairs = calloc(n, sizeof *f->pairs);
  f->subs = calloc(n, sizeof *f->subs);
  f->single = calloc(n, sizeof *f->single);
  f->accept = calloc(n, sizeof *f->accept);
  f->stamp = calloc(n, sizeof *f->stamp);
  f->count = calloc(n, sizeof *f->count);
  f->seen = calloc(n, sizeof *f->seen);
  f->w_msgs = calloc(n, sizeof *f->w_msgs);
  f->bus_subs = calloc(b, sizeof *f->bus_subs);
  f->bus_egress = calloc(b, sizeof *f->bus_egress);
  f->bus_ingress = calloc(b, sizeof *f->bus_ingress);
  f->bus_w = calloc(b, sizeof *f->bus_w);
  f->bus_w_fan = calloc(b, sizeof *f->bus_w_fan);
  f->bus_w_reply = calloc(b, sizeof *f->bus_w_reply);
  if (p->size_dist == FANOUT_SIZE_ZIPF)
    f->zipf_cdf = calloc((size_t)p->size_max, sizeof *f->zipf_cdf);
  if (!f->clients_on || !f->notify_in || !f->msg_in || !f->control_in || !f->kept || !f->pairs ||
      !f->subs || !f->single || !f->accept || !f->stamp || !f->count || !f->seen || !f->w_msgs ||
      !f->bus_subs || !f->bus_egress || !f->bus_ingress || !f->bus_w || !f->bus_w_fan ||
      !f->bus_w_reply || (p->size_dist == FANOUT_SIZE_ZIPF && !f->zipf_cdf)) {
    fanout_free(f);
    return -1;
  }
  jitter_seed(&f->rng, (uint64_t)p->seed);
  /* the load balancer: each client to a uniformly random node */
  for (int64_t i = 0; i < p->clients; i++)
    f->clients_on[((jitter_next(&f->rng) >> 32) * (uint64_t)p->nodes) >> 32]++;
  if (p->size_dist == FANOUT_SIZE_ZIPF) zipf_setup(f);
  return 0;
}

int fanout_run(fanout_t *f) {
  const fanout_params_t *p = &f->p;
  int64_t n = p->nodes, most = 0, placed = 0;
  for (int64_t k = 0; k < n; k++) {
    if (f->clients_on[k] > most) most = f->clients_on[k];
    placed += f->clients_on[k];
  }
  if (most == 0) return -1;
  for (int64_t k = 0; k < n; k++)
    f->accept[k] = f->clients_on[k] == most
                       ? 0x100000000ULL /* always */
                       : (uint32_t)((double)f->clients_on[k] / (double)most * 4294967296.0);

  /* Conversations: as many as make S subscriptions per client at the mean
   * size (the sizes drawn add up to about that). */
  double want = (double)p->clients * (double)p->subs_per_client / (double)p->online_per_conv;
  int64_t convs = want < 1 ? 1 : llround(want);
  double weight_sum = 0, reply_sum = 0;
  for (int64_t c = 0; c < convs; c++) {
    int64_t s = draw_size(f), d = 0;
    for (int64_t j = 0; j < s; j++) {
      int64_t k = draw_node(f);
      if (f->stamp[k] != c + 1) {
        f->stamp[k] = c + 1;
        f->count[k] = 0;
        f->seen[d++] = k;
      }
      f->count[k]++;
    }
    double w = p->rate_by == FANOUT_RATE_SIZE ? (double)s : 1.0;
    for (int64_t i = 0; i < d; i++) {
      int64_t k = f->seen[i];
      f->w_msgs[k] += w;
      f->pairs[k]++;
      f->subs[k] += f->count[k];
      if (f->count[k] == 1) f->single[k]++;
    }
    int64_t b = jump(conv_key(c), p->bus_instances);
    double reply = (double)fanout_reply_bytes(d);
    f->bus_subs[b] += d;
    f->bus_w[b] += w;
    f->bus_w_fan[b] += w * (double)d;
    f->bus_w_reply[b] += w * reply;
    weight_sum += w;
    reply_sum += w * reply;
    f->subs_total += s;
    f->pairs_total += d;
    if (s > f->largest) f->largest = s;
  }
  f->convs = convs;

  /* Scale the weights to messages per second. */
  double R = (double)p->appends_per_s, per_w = R / weight_sum;
  int64_t ch = (int64_t)strlen(FANOUT_CONV_PREFIX) + p->conv_id_bytes;
  int64_t ctl = (int64_t)strlen(FANOUT_CONTROL_CHANNEL);
  double push = (double)fanout_push_bytes(ch, p->msg_bytes);
  double push_ctl = (double)fanout_push_bytes(ctl, p->control_bytes);
  double notify = fanout_notify_bytes_per_msg(p->msg_bytes, p->notify_batch);
  double churn_per_client = (double)p->churn_per_million / 1e6 / 60.0; /* reconnects/s */
  f->reply_bytes = reply_sum / weight_sum;
  double conf_total = 0, cmd_total = 0;
  for (int64_t k = 0; k < n; k++) {
    f->notify_in[k] = R * notify;
    f->kept[k] = f->w_msgs[k] * per_w;
    f->msg_in[k] = f->kept[k] * push;
    /* A reconnect takes a client's S subscriptions off one node and onto
     * another; each that was (or becomes) its conversation's only one on
     * the node costs that node an UNSUBSCRIBE (a SUBSCRIBE). Departures
     * and arrivals balance in the steady state, and a subscription is
     * alone on its node as often as the placement says (single / subs). */
    double alone = f->subs[k] ? (double)f->single[k] / (double)f->subs[k] : 0;
    double changes = (double)f->clients_on[k] * churn_per_client * (double)p->subs_per_client *
                     alone;                             /* each way, per s */
    int64_t count = f->pairs[k] / p->bus_instances + 1; /* channels on one connection */
    double conf = (double)(fanout_confirm_bytes(0, ch, count) + fanout_confirm_bytes(1, ch, count));
    f->control_in[k] = (double)p->control_per_s * push_ctl +
                       R * (double)f->clients_on[k] / (double)placed * f->reply_bytes +
                       changes * conf;
    conf_total += changes * conf;
    cmd_total += changes * 2 * (double)bulk(ch);
  }
  int64_t ctl_home = jump(conv_key(-1), p->bus_instances);
  double B = (double)p->bus_instances;
  for (int64_t b = 0; b < p->bus_instances; b++) {
    f->bus_egress[b] = (f->bus_w_fan[b] * push + f->bus_w_reply[b]) * per_w + conf_total / B;
    f->bus_ingress[b] = f->bus_w[b] * per_w * push + cmd_total / B;
  }
  f->bus_subs[ctl_home] += n;
  f->bus_egress[ctl_home] +=
      (double)p->control_per_s * ((double)n * push_ctl + (double)fanout_reply_bytes(n));
  f->bus_ingress[ctl_home] += (double)p->control_per_s * push_ctl;
  return 0;
}
