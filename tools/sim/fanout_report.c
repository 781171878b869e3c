/*
 * sim/fanout_report.c: `converger sim fanout`'s flags, summary and tables
 * (see fanout.h; the model is fanout.c).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "bench/run.h"
#include "sim/fanout.h"
#include "stats/rank.h"

typedef enum { KIND_INT, KIND_ENUM } kind_t;

typedef struct {
  const char *flag, *placeholder; /* "--flag PLACEHOLDER" */
  kind_t kind;
  size_t offset; /* of an int64_t (KIND_INT) or an int (KIND_ENUM) in fanout_params_t */
  long long min, max;
  const char *const *names; /* KIND_ENUM: value i is names[i], NULL-terminated */
  const char *help;
} flag_t;

static const char *const dist_names[] = {"fixed", "geometric", "zipf", NULL};
static const char *const rate_names[] = {"size", "conv", NULL};

#define I(flag, ph, field, lo, hi, help)                                                           \
  { flag, ph, KIND_INT, offsetof(fanout_params_t, field), lo, hi, NULL, help }
#define E(flag, ph, field, names, help)                                                            \
  { flag, ph, KIND_ENUM, offsetof(fanout_params_t, field), 0, 0, names, help }

static const flag_t flags[] = {
    I("nodes", "N", nodes, 1, 60000, "gateway nodes"),
    I("clients", "N", clients, 1, 100000000,
      "online clients, spread over the nodes uniformly at random"),
    I("appends-per-s", "R", appends_per_s, 0, 100000000,
      "messages appended per second, fleet-wide"),
    I("msg-bytes", "BYTES", msg_bytes, 1, FANOUT_NOTIFY_MAX,
      "a message's notification payload (store/notify.h's record)"),
    I("subs-per-client", "S", subs_per_client, 1, 1000, "subscriptions of each client"),
    I("online-per-conv", "M", online_per_conv, 1, 100000000,
      "online subscribers of a conversation, the mean"),
    E("conv-size-dist", "fixed|geometric|zipf", size_dist, dist_names,
      "conversation sizes: all M, or geometric or Zipf with mean M"),
    I("conv-size-max", "N", size_max, 1, FANOUT_SIZE_MAX_LIMIT,
      "geometric, zipf: the largest conversation"),
    E("rate-by", "size|conv", rate_by, rate_names,
      "a conversation's share of R: by its size (each client sends alike) or equal"),
    I("conv-id-bytes", "BYTES", conv_id_bytes, 1, 128,
      "a conversation id's length (Redis channel cvg.m.<id>)"),
    I("notify-batch", "N", notify_batch, 1, FANOUT_NOTIFY_MAX,
      "messages group commit packs into one NOTIFY (1: one each)"),
    I("churn-per-million", "N", churn_per_million, 0, 100000000,
      "steady reconnects per minute per 10^6 clients"),
    I("control-per-s", "N", control_per_s, 0, 100000000,
      "control-channel messages per second, fleet-wide"),
    I("control-bytes", "BYTES", control_bytes, 1, 1000000, "a control message's payload"),
    I("bus-instances", "B", bus_instances, 1, 100000, "Redis instances of the bus"),
    I("seed", "N", seed, 0, LLONG_MAX, "seed of every random draw"),
};
#define NFLAGS (sizeof flags / sizeof flags[0])

static int64_t *int_field(fanout_params_t *p, const flag_t *d) {
  return (int64_t *)((char *)p + d->offset);
}
static int *enum_field(fanout_params_t *p, const flag_t *d) {
  return (int *)((char *)p + d->offset);
}

/* "  LEFT   TEXT", TEXT wrapped at 79 columns under itself. */
static void wrap(FILE *out, const char *left, const char *text) {
  enum { INDENT = 33, WIDTH = 79 };
  int col = fprintf(out, "  %-*s", INDENT - 2, left);
  if (col > INDENT) {
    fprintf(out, "\n%*s", INDENT, "");
    col = INDENT;
  }
  while (*text) {
    size_t word = strcspn(text, " ");
    if (col > INDENT && col + 1 + (int)word > WIDTH) {
      fprintf(out, "\n%*s", INDENT, "");
      col = INDENT;
    }
    if (col > INDENT) col += fprintf(out, " ");
    col += fprintf(out, "%.*s", (int)word, text);
    text += word;
    while (*text == ' ') text++;
  }
  fprintf(out, "\n");
}

static void usage(FILE *out) {
  fanout_params_t def;
  fanout_params_default(&def);
  fprintf(out, "usage: converger sim fanout [options]\n\n"
               "The fleet on paper (docs/benchmarks/scale-out.md): each node's bytes in from\n"
               "the bus, for NOTIFY to all (one PostgreSQL; every node hears every append) and\n"
               "for the interest-routed Redis bus (a node hears only the conversations it has\n"
               "subscribers for, once each, plus control traffic). Conversations are generated\n"
               "and placed one at a time, never stored: a few seconds at full scale.\n\n"
               "The defaults are the fleet of the reconnect-storm post-mortem: about 480 nodes\n"
               "holding about 13 million WebSocket clients (docs/background.md), with the\n"
               "scale-out design's assumptions for what the post-mortem does not give (20 000\n"
               "appends/s, ~300 B a notification, 5 subscriptions per client, ~3 online\n"
               "subscribers per conversation; docs/benchmarks/scale-out.md lists them all).\n\n");
  for (size_t i = 0; i < NFLAGS; i++) {
    const flag_t *d = &flags[i];
    char left[64], dflt[64];
    snprintf(left, sizeof left, "--%s %s", d->flag, d->placeholder);
    if (d->kind == KIND_INT)
      snprintf(dflt, sizeof dflt, "%lld", (long long)*int_field(&def, d));
    else
      snprintf(dflt, sizeof dflt, "%s", d->names[*enum_field(&def, d)]);
    char text[256];
    snprintf(text, sizeof text, "%s (default %s)", d->help, dflt);
    wrap(out, left, text);
  }
  wrap(out, "--json", "print the summary as JSON instead of tables");
  fprintf(out, "\nSame flags and seed, same figures. Exit status: 0 after a run, 1 when out of\n"
               "memory, 2 on a bad flag or value.\n");
}

/* min, median, p99 (nearest rank, stats/rank.h), max and mean of `n`
 * values, as a new JSON object; NULL when out of memory. */
static json_t *stats(const double *v, size_t n) {
  double *s = malloc((n ? n : 1) * sizeof *s), sum = 0;
  if (!s) return NULL;
  for (size_t i = 0; i < n; i++) s[i] = v[i], sum += v[i];
  qsort(s, n, sizeof *s, run_cmp_double);
  json_t *o =
      n ? json_pack("{s:f, s:f, s:f, s:f, s:f}", "min", s[0], "median", s[rank_nearest(0.5, n) - 1],
                    "p99", s[rank_nearest(0.99, n) - 1], "max", s[n - 1], "mean", sum / (double)n)
        : json_object();
  free(s);
  return o;
}

static json_t *stats_i64(const int64_t *v, size_t n) {
  double *d = malloc((n ? n : 1) * sizeof *d);
  if (!d) return NULL;
  for (size_t i = 0; i < n; i++) d[i] = (double)v[i];
  json_t *o = stats(d, n);
  free(d);
  return o;
}

static json_t *params_json(const fanout_params_t *p) {
  json_t *o = json_object();
  for (size_t i = 0; o && i < NFLAGS; i++) {
    const flag_t *d = &flags[i];
    fanout_params_t *q = (fanout_params_t *)p; /* the accessors do not write */
    json_t *v = d->kind == KIND_INT ? json_integer(*int_field(q, d))
                                    : json_string(d->names[*enum_field(q, d)]);
    char key[64];
    snprintf(key, sizeof key, "%s", d->flag);
    for (char *c = key; *c; c++)
      if (*c == '-') *c = '_';
    if (json_object_set_new(o, key, v) != 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

json_t *fanout_summary(const fanout_t *f) {
  const fanout_params_t *p = &f->p;
  size_t n = (size_t)p->nodes, nb = (size_t)p->bus_instances;
  double *in = malloc(n * sizeof *in), *share = malloc(n * sizeof *share);
  double *ratio = malloc(n * sizeof *ratio), *payload = malloc(n * sizeof *payload);
  json_t *sum = NULL;
  if (!in || !share || !ratio || !payload) goto out;
  double R = (double)p->appends_per_s, P = (double)p->msg_bytes, N = (double)p->nodes;
  double M = (double)p->online_per_conv, pg = 0, fleet_payload = 0;
  size_t nr = 0;
  for (size_t k = 0; k < n; k++) {
    in[k] = f->msg_in[k] + f->control_in[k];
    share[k] = R > 0 ? f->kept[k] / R : 0;
    payload[k] = f->kept[k] * P;
    if (in[k] > 0) ratio[nr++] = f->notify_in[k] / in[k];
    pg += f->notify_in[k];
    fleet_payload += payload[k];
  }
  json_t *per_instance = nb <= FANOUT_PER_INSTANCE_LIST ? json_array() : json_null();
  for (size_t b = 0; per_instance && nb <= FANOUT_PER_INSTANCE_LIST && b < nb; b++)
    json_array_append_new(per_instance,
                          json_pack("{s:I, s:f, s:f}", "subscriptions", (json_int_t)f->bus_subs[b],
                                    "egress_bytes_per_s", f->bus_egress[b], "ingress_bytes_per_s",
                                    f->bus_ingress[b]));
  int64_t ch = (int64_t)strlen(FANOUT_CONV_PREFIX) + p->conv_id_bytes;
  sum = json_pack(
      "{s:I, s:I, s:f, s:I, s:o, s:I,"
      " s:{s:f, s:I, s:I, s:f},"
      " s:{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o},"
      " s:{s:I, s:o, s:o, s:o, s:o},"
      " s:f, s:f,"
      " s:{s:f, s:f, s:f, s:f, s:f, s:f},"
      " s:o}",
      "conversations", (json_int_t)f->convs, "subscriptions", (json_int_t)f->subs_total,
      "mean_online_per_conv", (double)f->subs_total / (double)f->convs, "largest_conv",
      (json_int_t)f->largest, "zipf_exponent",
      p->size_dist == FANOUT_SIZE_ZIPF && f->zipf_exponent < 1e9 ? json_real(f->zipf_exponent)
                                                                 : json_null(),
      "conv_node_pairs", (json_int_t)f->pairs_total,
      /* wire bytes */
      "wire_bytes", "notify_per_msg", fanout_notify_bytes_per_msg(p->msg_bytes, p->notify_batch),
      "push_per_msg", (json_int_t)fanout_push_bytes(ch, p->msg_bytes), "control_push",
      (json_int_t)fanout_push_bytes((int64_t)strlen(FANOUT_CONTROL_CHANNEL), p->control_bytes),
      "publish_reply_mean", f->reply_bytes,
      /* per node */
      "per_node", "clients", stats_i64(f->clients_on, n), "conversations", stats_i64(f->pairs, n),
      "notify_in_bytes_per_s", stats(f->notify_in, n), "interest_in_bytes_per_s", stats(in, n),
      "interest_msg_bytes_per_s", stats(f->msg_in, n), "interest_control_bytes_per_s",
      stats(f->control_in, n), "interest_payload_bytes_per_s", stats(payload, n), "kept_share",
      stats(share, n), "notify_over_interest", stats(ratio, nr),
      /* bus instances */
      "bus", "instances", (json_int_t)p->bus_instances, "subscriptions", stats_i64(f->bus_subs, nb),
      "egress_bytes_per_s", stats(f->bus_egress, nb), "ingress_bytes_per_s",
      stats(f->bus_ingress, nb), "per_instance", per_instance,
      /* fleet */
      "postgres_egress_bytes_per_s", pg, "interest_payload_fleet_bytes_per_s", fleet_payload,
      /* the design study's arithmetic, from the same parameters */
      "paper", "postgres_egress_bytes_per_s", N * R * P, "node_in_bytes_per_s", R * P, "kept_share",
      M / N, "interest_fleet_bytes_per_s", R * M * P, "interest_node_bytes_per_s", R * M * P / N,
      "conv_node_pairs_at_most", (double)p->clients * (double)p->subs_per_client, "params",
      params_json(p));
out:
  free(in), free(share), free(ratio), free(payload);
  return sum;
}

static double num(const json_t *o, const char *path) {
  /* "a.b": one level of nesting */
  char key[64];
  const char *dot = strchr(path, '.');
  if (dot) {
    snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
    return json_number_value(json_object_get(json_object_get(o, key), dot + 1));
  }
  return json_number_value(json_object_get(o, path));
}

/* Bytes per second with a unit: "6.40 MB/s" (decimal units). */
static const char *rate(double v, char *buf, size_t len) {
  if (v >= 1e9)
    snprintf(buf, len, "%.2f GB/s", v / 1e9);
  else if (v >= 1e6)
    snprintf(buf, len, "%.2f MB/s", v / 1e6);
  else if (v >= 1e3)
    snprintf(buf, len, "%.1f kB/s", v / 1e3);
  else
    snprintf(buf, len, "%.0f B/s", v);
  return buf;
}

/* A row of a per-node figure: median, p99, max (`as`: 'r' a rate, '%' a
 * share, 'x' a ratio, 'n' a count). */
static void row(FILE *out, const char *label, const json_t *o, char as) {
  const char *keys[] = {"median", "p99", "max"};
  fprintf(out, "| %s |", label);
  for (int i = 0; i < 3; i++) {
    double v = num(o, keys[i]);
    char buf[32];
    if (as == 'r')
      fprintf(out, " %s |", rate(v, buf, sizeof buf));
    else if (as == '%')
      fprintf(out, " %.3f %% |", 100 * v);
    else if (as == 'x')
      fprintf(out, " %.1fx |", v);
    else
      fprintf(out, " %.0f |", v);
  }
  fprintf(out, "\n");
}

void fanout_print(const json_t *sum, FILE *out) {
  const json_t *p = json_object_get(sum, "params"), *pn = json_object_get(sum, "per_node");
  const json_t *bus = json_object_get(sum, "bus"), *paper = json_object_get(sum, "paper");
  const json_t *za = json_object_get(sum, "zipf_exponent");
  char a[32], b[32], c[32];
  fprintf(out,
          "%.0f nodes, %.0f clients, R = %.0f appends/s of %.0f B, %.0f subscriptions per "
          "client;\n%.0f conversations, sizes %s (mean %.2f, largest %.0f",
          num(p, "nodes"), num(p, "clients"), num(p, "appends_per_s"), num(p, "msg_bytes"),
          num(p, "subs_per_client"), num(sum, "conversations"),
          json_string_value(json_object_get(p, "conv_size_dist")), num(sum, "mean_online_per_conv"),
          num(sum, "largest_conv"));
  if (json_is_number(za)) fprintf(out, ", exponent %.3f", json_number_value(za));
  fprintf(out, "), rates by %s, %.0f bus instances, seed %.0f\n\n",
          json_string_value(json_object_get(p, "rate_by")), num(p, "bus_instances"),
          num(p, "seed"));

  fprintf(out, "| per node | median | p99 | max |\n| --- | ---: | ---: | ---: |\n");
  row(out, "bytes in, NOTIFY to all", json_object_get(pn, "notify_in_bytes_per_s"), 'r');
  row(out, "bytes in, interest-routed", json_object_get(pn, "interest_in_bytes_per_s"), 'r');
  row(out, "... messages", json_object_get(pn, "interest_msg_bytes_per_s"), 'r');
  row(out, "... control", json_object_get(pn, "interest_control_bytes_per_s"), 'r');
  /* the ratio at the median, p99 and max node of interest-routed bytes
   * (NOTIFY's are the same on every node) */
  fprintf(out, "| NOTIFY / interest-routed |");
  for (int i = 0; i < 3; i++) {
    const char *key = i == 0 ? "median" : i == 1 ? "p99" : "max";
    fprintf(out, " %.1fx |",
            num(json_object_get(pn, "notify_in_bytes_per_s"), key) /
                num(json_object_get(pn, "interest_in_bytes_per_s"), key));
  }
  fprintf(out, "\n");
  row(out, "share of NOTIFY's messages the node keeps", json_object_get(pn, "kept_share"), '%');
  row(out, "conversations subscribed on the bus", json_object_get(pn, "conversations"), 'n');
  row(out, "clients", json_object_get(pn, "clients"), 'n');
  fprintf(out, "\n");

  fprintf(out, "| each bus instance (%.0f) | min | median | max |\n| --- | ---: | ---: | ---: |\n",
          num(bus, "instances"));
  const json_t *bs = json_object_get(bus, "subscriptions");
  fprintf(out, "| subscriptions ((conversation, node) pairs) | %.0f | %.0f | %.0f |\n",
          num(bs, "min"), num(bs, "median"), num(bs, "max"));
  const char *names[] = {"egress_bytes_per_s", "ingress_bytes_per_s"};
  const char *labels[] = {"egress", "ingress"};
  for (int i = 0; i < 2; i++) {
    const json_t *o = json_object_get(bus, names[i]);
    fprintf(out, "| %s | %s | %s | %s |\n", labels[i], rate(num(o, "min"), a, sizeof a),
            rate(num(o, "median"), b, sizeof b), rate(num(o, "max"), c, sizeof c));
  }

  fprintf(out, "\n| cross-check with issue 32 | its arithmetic | this model |\n"
               "| --- | ---: | ---: |\n");
  fprintf(out, "| one PostgreSQL's NOTIFY egress (issue: 2.9 GB/s) | %s | %s with framing |\n",
          rate(num(paper, "postgres_egress_bytes_per_s"), a, sizeof a),
          rate(num(sum, "postgres_egress_bytes_per_s"), b, sizeof b));
  fprintf(out, "| NOTIFY bytes into each node (issue: 6 MB/s) | %s | %s with framing |\n",
          rate(num(paper, "node_in_bytes_per_s"), a, sizeof a),
          rate(num(json_object_get(pn, "notify_in_bytes_per_s"), "median"), b, sizeof b));
  fprintf(out, "| share a node keeps (issue: under 1 %%) | %.3f %% | %.3f %% (median) |\n",
          100 * num(paper, "kept_share"), 100 * num(json_object_get(pn, "kept_share"), "median"));
  fprintf(out, "| interest-routed payload, fleet | %s | %s |\n",
          rate(num(paper, "interest_fleet_bytes_per_s"), a, sizeof a),
          rate(num(sum, "interest_payload_fleet_bytes_per_s"), b, sizeof b));
  fprintf(out, "| interest-routed payload per node | %s | %s (median) |\n",
          rate(num(paper, "interest_node_bytes_per_s"), a, sizeof a),
          rate(num(json_object_get(pn, "interest_payload_bytes_per_s"), "median"), b, sizeof b));
  fprintf(out, "| (conversation, node) pairs | at most %.0f | %.0f |\n",
          num(paper, "conv_node_pairs_at_most"), num(sum, "conv_node_pairs"));
}

int fanout_main(int argc, char **argv) {
  static const char cmd[] = "converger sim fanout";
  fanout_params_t p;
  fanout_params_default(&p);
  /* --json takes no value: take it out first */
  int json = 0, m = 0;
  char **args = calloc((size_t)argc + 1, sizeof *args),
       **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!args || !rest) {
    free(args), free(rest);
    fprintf(stderr, "%s: out of memory\n", cmd);
    return 1;
  }
  for (int i = 0; i < argc; i++)
    if (strcmp(argv[i], "--json") == 0)
      json = 1;
    else
      args[m++] = argv[i];

  const char *names[NFLAGS], *values[NFLAGS] = {0};
  const char **dest[NFLAGS];
  char enames[NFLAGS][64], inames[NFLAGS][64];
  const flag_t *enums[NFLAGS];
  long long ints[NFLAGS];
  run_int_opt_t iopts[NFLAGS];
  size_t ne = 0, ni = 0;
  for (size_t i = 0; i < NFLAGS; i++) {
    const flag_t *d = &flags[i];
    if (d->kind == KIND_ENUM) {
      snprintf(enames[ne], sizeof enames[ne], "--%s", d->flag);
      names[ne] = enames[ne], dest[ne] = &values[ne], enums[ne] = d;
      ne++;
    } else {
      snprintf(inames[ni], sizeof inames[ni], "%s", d->flag);
      ints[ni] = LLONG_MIN; /* not given */
      iopts[ni] = (run_int_opt_t){inames[ni], &ints[ni], d->min, d->max};
      ni++;
    }
  }
  int nrest = 0, rc = run_split_string_options(cmd, m, args, names, dest, ne, rest, &nrest);
  if (rc == 0) rc = run_parse_int_options(cmd, nrest, rest, iopts, ni, usage);
  free(args), free(rest);
  if (rc != 0) return rc > 0 ? 0 : 2;
  for (size_t k = 0; k < ne; k++) {
    if (!values[k]) continue;
    int e = -1;
    for (int i = 0; enums[k]->names[i]; i++)
      if (strcmp(enums[k]->names[i], values[k]) == 0) e = i;
    if (e < 0) {
      fprintf(stderr, "%s: invalid %s \"%s\": want %s\n", cmd, names[k], values[k],
              enums[k]->placeholder);
      return 2;
    }
    *enum_field(&p, enums[k]) = e;
  }
  for (size_t i = 0, k = 0; i < NFLAGS; i++)
    if (flags[i].kind == KIND_INT) {
      if (ints[k] != LLONG_MIN) *int_field(&p, &flags[i]) = ints[k];
      k++;
    }
  char err[256];
  if (fanout_params_check(&p, err, sizeof err) != 0) {
    fprintf(stderr, "%s: %s\n", cmd, err);
    return 2;
  }

  fanout_t f;
  if (fanout_init(&f, &p) != 0) {
    fprintf(stderr, "%s: out of memory\n", cmd);
    return 1;
  }
  fanout_run(&f); /* every client is on some node: cannot fail here */
  json_t *sum = fanout_summary(&f);
  fanout_free(&f);
  if (!sum) {
    fprintf(stderr, "%s: out of memory for the summary\n", cmd);
    return 1;
  }
  if (json) {
    char *text = json_dumps(sum, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text) printf("%s\n", text);
    free(text);
  } else {
    fanout_print(sum, stdout);
  }
  json_decref(sum);
  return 0;
}
