/*
 * config.c: settings table, parsing and secret files.
 *
 * Each row names the field, its environment variable, its flag, its default
 * and its kind. Validation is by kind (positive integer within bounds, one
 * of a set of words, host:port). A bad value prints exactly one line naming
 * the setting.
 */
#include "core/config.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/busurl.h"
#include "core/dburl.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/urlauth.h"
#include "common/util.h"

typedef enum { K_STR, K_INT, K_ENUM, K_LISTEN, K_ADMIN, K_DBURL, K_WSURL } kind_t;

typedef struct {
  const char *env;
  const char *flag;
  kind_t kind;
  size_t offset;
  const char *def;   /* NULL: unset */
  long min, max;     /* K_INT bounds; K_STR: min is the shortest value in bytes */
  const char *words; /* K_ENUM: "a|b|c" */
  const char *help;
} setting_t;

#define S(env, flag, kind, field, def, min, max, words, help)                                      \
  { env, flag, kind, offsetof(config_t, field), def, min, max, words, help }

static const setting_t settings[] = {
    S("CONVERGER_LISTEN", "listen", K_LISTEN, listen, "127.0.0.1:8080", 0, 0, NULL,
      "address and port for the clients: WebSocket, REST, the demo page and /readyz (health, "
      "metrics and admin too when CONVERGER_ADMIN_LISTEN is empty)"),
    S("CONVERGER_ADMIN_LISTEN", "admin-listen", K_ADMIN, admin_listen, "127.0.0.1:9090", 0, 0, NULL,
      "host:port of a second, private listener for /metrics, /admin/*, /livez and /readyz, "
      "which the client port then no longer serves (it keeps /readyz); empty: none, everything "
      "on the client port"),
    S("CONVERGER_TLS_CERT", "tls-cert", K_STR, tls_cert, NULL, 0, 0, NULL,
      "PEM certificate chain: the client listener then speaks only HTTPS and WSS (TLS 1.2 or "
      "later), with CONVERGER_TLS_KEY; re-read on SIGHUP or when a file changes"),
    S("CONVERGER_TLS_KEY", "tls-key", K_STR, tls_key, NULL, 0, 0, NULL,
      "PEM private key of CONVERGER_TLS_CERT; re-read with it"),
    S("CONVERGER_DATABASE_URL", "database-url", K_DBURL, database_url, "sqlite:data/converger.db",
      0, 0, NULL,
      "store: sqlite:PATH, or PostgreSQL as postgres://USER@HOST:PORT/DB or libpq keywords"
      " (host=... dbname=...)"),
    S("CONVERGER_BUS", "bus", K_STR, bus, NULL, 0, 0, NULL,
      "a sharded cluster (docs/operations.md, \"Scaling out\"): its Redis pub/sub instances, "
      "comma-separated redis://HOST:PORT, the same list in the same order on every node; the "
      "database URL is then the control database's, which holds the shard map; unset: one "
      "database"),
    S("CONVERGER_BUS_CHECK_MS", "bus-check-ms", K_INT, bus_check_ms, "30000", 100, 3600000, NULL,
      "sharded cluster: a conversation with a subscriber here and nothing heard on the bus for "
      "this long (ms) has its head read from the store (a publish lost in a crash is found "
      "within this)"),
    S("CONVERGER_API_KEY", "api-key", K_STR, api_key, NULL, 0, 0, NULL,
      "REST/admin bearer key (unset: generated, stored in the data directory); several, "
      "separated by commas, are all accepted (a rotation)"),
    S("CONVERGER_TOKEN_SECRET", "token-secret", K_STR, token_secret, NULL, CONFIG_SECRET_MIN, 0,
      NULL,
      "HS256 secret for client tokens, at least 32 bytes (unset: generated, stored in the data "
      "directory); several, separated by commas: tokens are signed with the first and verified "
      "with any (a rotation)"),
    S("CONVERGER_NODE_ID", "node-id", K_STR, node_id, NULL, 0, 0, NULL,
      "this node's name in welcome frames and metrics (default hostname:port)"),
    S("CONVERGER_PUBLIC_URL", "public-url", K_WSURL, public_url, NULL, 0, 0, NULL,
      "ws:// or wss:// URL clients should use for this node, as listed by /admin/cluster"
      " (default ws://LISTEN/v1/ws, wss:// with CONVERGER_TLS_CERT)"),
    S("CONVERGER_POOL_SIZE", "pool-size", K_INT, pool_size, "20", 1, 512, NULL,
      "store worker threads, one database connection each"),
    S("CONVERGER_APPEND_BATCH", "append-batch", K_INT, append_batch, "256", 1, 1024, NULL,
      "appends committed together in one store transaction at most (group commit); 1: one "
      "transaction each"),
    S("CONVERGER_MAX_MESSAGE_BYTES", "max-message-bytes", K_INT, max_message_bytes, "65536", 256,
      16777216, NULL, "largest WebSocket message accepted (bytes); larger: close 1009"),
    S("CONVERGER_HEARTBEAT_MS", "heartbeat-ms", K_INT, heartbeat_ms, "25000", 50, 3600000, NULL,
      "ping interval (ms); silent for two intervals: closed"),
    S("CONVERGER_HELLO_TIMEOUT_MS", "hello-timeout-ms", K_INT, hello_timeout_ms, "10000", 50,
      600000, NULL, "time for the first frame, hello (ms); else close 1008"),
    S("CONVERGER_SQLITE_SYNC", "sqlite-sync", K_ENUM, sqlite_sync, "full", 0, 0, "off|normal|full",
      "SQLite PRAGMA synchronous: off, normal or full"),
    S("CONVERGER_HTTP_HEADER_TIMEOUT_MS", "http-header-timeout-ms", K_INT, header_timeout_ms,
      "10000", 50, 600000, NULL,
      "time for a complete HTTP header block (ms); else the connection is closed"),
    S("CONVERGER_MAX_SUBS", "max-subs", K_INT, max_subs, "100", 1, 10000, NULL,
      "subscriptions on one connection, from its hello and later subscribes"),
    S("CONVERGER_TOKEN_PUBLIC_KEYS", "token-public-keys", K_STR, token_public_keys, NULL, 0, 0,
      NULL,
      "comma-separated files of public keys for RS256 / ES256 tokens: a JWKS (*.json, kid from "
      "each key) or PEM files (kid: the file name without extension); re-read on SIGHUP or when "
      "a file changes"),
    S("CONVERGER_TOKEN_ISSUER", "token-issuer", K_STR, token_issuer, NULL, 0, 0, NULL,
      "when set, every token's iss must be this (the node's own tokens carry it)"),
    S("CONVERGER_TOKEN_AUDIENCE", "token-audience", K_STR, token_audience, NULL, 0, 0, NULL,
      "when set, every token's aud must name this (the node's own tokens carry it)"),
    S("CONVERGER_TOKEN_LEEWAY_MS", "token-leeway-ms", K_INT, token_leeway_ms, "5000", 0, 3600000,
      NULL, "clock skew allowed past a token's exp (ms); then error token_expired and close 1008"),
    S("CONVERGER_RATE_SEND", "rate-send", K_INT, rate_send, "20", 0, 1000000, NULL,
      "send frames per second per connection (token bucket); above: error rate_limited; 0: no "
      "limit"),
    S("CONVERGER_RATE_SEND_BURST", "rate-send-burst", K_INT, rate_send_burst, "40", 1, 10000000,
      NULL, "send frames a connection may send at once above its rate"),
    S("CONVERGER_RATE_SUBSCRIBE", "rate-subscribe", K_INT, rate_subscribe, "10", 0, 1000000, NULL,
      "subscribe, unsubscribe and sync frames per second per connection, together; 0: no limit"),
    S("CONVERGER_RATE_SUBSCRIBE_BURST", "rate-subscribe-burst", K_INT, rate_subscribe_burst, "20",
      1, 10000000, NULL, "subscribe, unsubscribe and sync frames at once above the rate"),
    S("CONVERGER_RATE_REFRESH", "rate-refresh", K_INT, rate_refresh, "1", 0, 1000000, NULL,
      "refresh frames per second per connection; 0: no limit"),
    S("CONVERGER_RATE_REFRESH_BURST", "rate-refresh-burst", K_INT, rate_refresh_burst, "1", 1,
      10000000, NULL, "refresh frames at once above the rate"),
    S("CONVERGER_RATE_SIGNAL", "rate-signal", K_INT, rate_signal, "5", 0, 1000000, NULL,
      "signal frames per second per connection; 0: no limit"),
    S("CONVERGER_RATE_SIGNAL_BURST", "rate-signal-burst", K_INT, rate_signal_burst, "10", 1,
      10000000, NULL, "signal frames at once above the rate"),
    S("CONVERGER_PRESENCE_GRACE_MS", "presence-grace-ms", K_INT, presence_grace_ms, "5000", 0,
      3600000, NULL,
      "a client without a connection stays present this long (ms) before its leave: drain moves, "
      "restarts and blips emit nothing"),
    S("CONVERGER_MAX_PRESENCE", "max-presence", K_INT, max_presence, "1000", 1, 100000000, NULL,
      "users listed per conversation by presence reads; past it they are counted, not listed"),
    S("CONVERGER_RATE_ABUSE_FACTOR", "rate-abuse-factor", K_INT, rate_abuse_factor, "10", 0, 1000,
      NULL,
      "a connection that sends this many times one of its rates ... (0: never closed for it)"),
    S("CONVERGER_RATE_ABUSE_MS", "rate-abuse-ms", K_INT, rate_abuse_ms, "10000", 1000, 3600000,
      NULL, "... in every second for this long (ms) is closed with 1008 rate_limited"),
    S("CONVERGER_MAX_CONNS_PER_USER", "max-conns-per-user", K_INT, max_conns_per_user, "0", 0,
      100000000, NULL,
      "WebSocket connections of one user (token sub) on this node; more: error "
      "too_many_connections and close 1008 at hello; 0: no limit"),
    S("CONVERGER_REST_RATE", "rest-rate", K_INT, rest_rate, "0", 0, 100000000, NULL,
      "REST message appends and signals per second on this node, one token bucket for every "
      "API key; above: HTTP 429 rate_limited; 0: no limit"),
    S("CONVERGER_REST_RATE_BURST", "rest-rate-burst", K_INT, rest_rate_burst, "0", 0, 100000000,
      NULL, "REST appends and signals at once above the rate; 0: twice the rate"),
    S("CONVERGER_REVOCATION_REFRESH_MS", "revocation-refresh-ms", K_INT, revocation_refresh_ms,
      "1000", 50, 3600000, NULL, "how often the revocation cache is re-read from the store (ms)"),
    S("CONVERGER_RETRY_AFTER_MIN_MS", "retry-after-min-ms", K_INT, retry_after_min_ms, "1000", 0,
      3600000, NULL, "smallest retryAfterMs hint (ms)"),
    S("CONVERGER_RETRY_AFTER_MAX_MS", "retry-after-max-ms", K_INT, retry_after_max_ms, "6000", 1,
      3600000, NULL, "largest retryAfterMs hint (ms)"),
    S("WS_HANDSHAKE_CONCURRENCY", "handshake-concurrency", K_INT, handshake_concurrency, "0", 0,
      100000, NULL, "admission slots for hello and sync store work; 0: half the pool, at least 1"),
    S("WS_HANDSHAKE_QUEUE_MS", "handshake-queue-ms", K_INT, handshake_queue_ms, "10000", 1, 600000,
      NULL, "longest wait for an admission slot (ms); then unavailable (retryable)"),
    S("WS_HANDSHAKE_QUEUE_MAX", "handshake-queue-max", K_INT, handshake_queue_max, "10000", 0,
      10000000, NULL, "hellos and syncs allowed to wait for a slot; more: unavailable at once"),
    S("CONVERGER_POOL_QUEUE_TARGET_MS", "pool-queue-target-ms", K_INT, pool_queue_target_ms, "50",
      1, 600000, NULL, "store jobs are dropped when none waited less than this for an interval"),
    S("CONVERGER_POOL_QUEUE_INTERVAL_MS", "pool-queue-interval-ms", K_INT, pool_queue_interval_ms,
      "1000", 1, 3600000, NULL,
      "interval (ms) of the pool's queue-delay rule; dropped jobs waited over twice the target"),
    S("CONVERGER_STORE_TIMEOUT_MS", "store-timeout-ms", K_INT, store_timeout_ms, "5000", 1, 600000,
      NULL,
      "deadline (ms) of store work a client waits for (REST, hello, sync, gap fill, socket send),"
      " from submission to the pool; then 503 / unavailable / replay_unavailable"),
    S("CONVERGER_ACCEPT_RATE", "accept-rate", K_INT, accept_rate, "0", 0, 10000000, NULL,
      "WebSocket upgrades per second (token bucket); above: HTTP 503; 0: no limit"),
    S("CONVERGER_MAX_CONNECTIONS", "max-connections", K_INT, max_connections, "0", 0, 100000000,
      NULL,
      "WebSocket connections at once; more upgrades: HTTP 503 too_many_connections; 0: the "
      "open-file limit (RLIMIT_NOFILE) minus a reserve of 128 + 2 per pool connection"),
    S("CONVERGER_CAPACITY_CONNECTIONS", "capacity-connections", K_INT, capacity_connections, "0", 0,
      100000000, NULL,
      "connections this node is sized for, published in its membership row and /admin/status"
      " for converger roll's headroom budget; 0: not set (roll then uses loop utilisation)"),
    S("CONVERGER_DRAIN_WINDOW_MS", "drain-window-ms", K_INT, drain_window_ms, "30000", 0, 3600000,
      NULL, "drain: clients are told to move at a time drawn from [0, this) (ms)"),
    S("CONVERGER_DRAIN_CLOSE_RATE", "drain-close-rate", K_INT, drain_close_rate, "500", 1, 1000000,
      NULL,
      "drain: connections still open after the window are closed (1012) at this rate (per s)"),
    S("CONVERGER_DRAIN_MIGRATE", "drain-migrate", K_INT, drain_migrate, "1", 0, 1, NULL,
      "drain: 1 tell clients to move (drain frames) first; 0 no frames, the paced 1012 closes "
      "begin at once (for experiments)"),
    S("CONVERGER_DRAIN_SHUTDOWN_MS", "drain-shutdown-ms", K_INT, drain_shutdown_ms, "60000", 0,
      86400000, NULL,
      "drain: the node closes what remains and exits this long after it began (ms)"),
    S("CONVERGER_TEST_STORE_DELAY_MS", "test-store-delay-ms", K_INT, test_store_delay_ms, "0", 0,
      60000, NULL, "for tests only: every store job sleeps this long (ms) before it runs"),
    S("CONVERGER_WEB_DIR", "web-dir", K_STR, web_dir, CONVERGER_WEB_DIR_DEFAULT, 0, 0, NULL,
      "directory of the demo page served at /"),
    S("CONVERGER_LOG_LEVEL", "log-level", K_ENUM, log_level, "info", 0, 0, "debug|info|warn|error",
      "lowest log level printed: debug, info, warn or error"),
    S("CONVERGER_LOG_FORMAT", "log-format", K_ENUM, log_format, "text", 0, 0, "text|json",
      "log lines as text, or one JSON object per line (time, level, node, event, message)"),
    S("CONVERGER_ACCESS_LOG", "access-log", K_INT, access_log, "0", 0, 1, NULL,
      "1: a log line per REST request and WebSocket upgrade (method, path without the query, "
      "status, duration, bytes)"),
};

void config_usage(FILE *out) {
  fprintf(out, "usage: converger serve [--flag=value ...]\n\n"
               "Runs one gateway node. Every setting is a flag and an environment\n"
               "variable; a flag wins. Defaults in brackets.\n\n");
  for (size_t i = 0; i < CV_ARRAY_SIZE(settings); i++) {
    const setting_t *s = &settings[i];
    fprintf(out, "  --%-24s %-32s [%s]\n      %s\n", s->flag, s->env, s->def ? s->def : "unset",
            s->help);
  }
}

static int words_has(const char *words, const char *v) {
  size_t n = strlen(v);
  const char *p = words;
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, v, n) == 0) return 1;
    if (!bar) break;
    p = bar + 1;
  }
  return 0;
}

/* "host:port" or "[v6]:port" into *host (heap, replacing it) and *port. */
static int parse_hostport(const char *v, char **host, int *port) {
  const char *colon = strrchr(v, ':');
  if (!colon || colon == v) return -1;
  char *end;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (errno || *end || end == colon + 1 || p < 0 || p > 65535) return -1;
  free(*host);
  const char *h = v;
  size_t hl = (size_t)(colon - v);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  *host = strndup(h, hl);
  *port = (int)p;
  return 0;
}

static int parse_listen(config_t *cfg, const char *v) {
  return parse_hostport(v, &cfg->listen_host, &cfg->listen_port);
}

static int apply(config_t *cfg, const setting_t *s, const char *v, const char *src) {
  char **strp = (char **)((char *)cfg + s->offset);
  char who[96]; /* what the user wrote: the flag, or the variable and where it came from */
  if (strcmp(src, "flag") == 0)
    snprintf(who, sizeof who, "--%s", s->flag);
  else
    snprintf(who, sizeof who, "%s (%s)", s->env, src);
  switch (s->kind) {
  case K_INT: {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *v == '\0' || *end || n < s->min || n > s->max) {
      fprintf(stderr, "converger: invalid %s \"%s\": want an integer in [%ld, %ld]\n", who, v,
              s->min, s->max);
      return -CV_EINVAL;
    }
    *(int *)((char *)cfg + s->offset) = (int)n;
    return 0;
  }
  case K_ENUM:
    if (!words_has(s->words, v)) {
      fprintf(stderr, "converger: invalid %s \"%s\": want one of %s\n", who, v, s->words);
      return -CV_EINVAL;
    }
    break;
  case K_LISTEN:
    if (parse_listen(cfg, v) != 0) {
      fprintf(stderr, "converger: invalid %s \"%s\": want host:port\n", who, v);
      return -CV_EINVAL;
    }
    break;
  case K_ADMIN:
    free(cfg->admin_host);
    cfg->admin_host = NULL;
    if (v[0] && parse_hostport(v, &cfg->admin_host, &cfg->admin_port) != 0) {
      fprintf(stderr, "converger: invalid %s \"%s\": want host:port, or empty for none\n", who, v);
      return -CV_EINVAL;
    }
    break;
  case K_DBURL:
    if (dburl_backend(v) == NULL) {
      char shown[512];
      dburl_redact(v, shown, sizeof shown);
      fprintf(stderr,
              "converger: invalid %s \"%s\": want sqlite:PATH, "
              "postgres://USER@HOST:PORT/DB or a libpq keyword string (host=... dbname=...)\n",
              who, shown);
      return -CV_EINVAL;
    }
    break;
  case K_WSURL: /* the scheme in any case, as the clients read it */
    if (urlauth_ws_scheme(v, NULL) == 0 || v[urlauth_ws_scheme(v, NULL)] == '\0') {
      fprintf(stderr, "converger: invalid %s \"%s\": want ws://HOST... or wss://HOST...\n", who, v);
      return -CV_EINVAL;
    }
    if (strlen(v) > CONFIG_URL_MAX) {
      fprintf(stderr, "converger: invalid %s: longer than %d bytes\n", who, CONFIG_URL_MAX);
      return -CV_EINVAL;
    }
    { /* its host and port as the client library reads them (common/urlauth.h):
         a URL it would refuse reaches no client */
      const char *auth = v + urlauth_ws_scheme(v, NULL);
      urlauth_t a;
      char why[CONFIG_URL_MAX + 160];
      if (urlauth_parse(v, auth, strcspn(auth, "/?#"), &a, why, sizeof why) != 0) {
        fprintf(stderr, "converger: invalid %s: %s\n", who, why);
        return -CV_EINVAL;
      }
    }
    break;
  case K_STR:
    if (*v == '\0' && !s->def) { /* empty: unset, as a ConfigMap writes it */
      free(*strp);
      *strp = NULL;
      return 0;
    }
    if (*v == '\0') {
      fprintf(stderr, "converger: invalid %s: empty\n", who);
      return -CV_EINVAL;
    }
    if (strlen(v) < (size_t)s->min) { /* a secret: its value is not printed */
      fprintf(stderr, "converger: invalid %s: %zu bytes, want at least %ld bytes\n", who, strlen(v),
              s->min);
      return -CV_EINVAL;
    }
    break;
  }
  free(*strp);
  *strp = strdup(v);
  return 0;
}

static const setting_t *find_flag(const char *name, size_t len) {
  for (size_t i = 0; i < CV_ARRAY_SIZE(settings); i++)
    if (strlen(settings[i].flag) == len && strncmp(settings[i].flag, name, len) == 0)
      return &settings[i];
  return NULL;
}

static int keys_long_enough(const char *text, size_t min_len);

/* node_id from the host name and the listener's port: HOST:PORT. */
static int default_node_id(config_t *cfg) {
  char host[256];
  if (gethostname(host, sizeof host) != 0) strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  char buf[300];
  snprintf(buf, sizeof buf, "%s:%d", host, cfg->listen_port);
  char *id = strdup(buf);
  if (!id) return -CV_ENOMEM;
  free(cfg->node_id);
  cfg->node_id = id;
  return 0;
}

/* public_url from listen: ws://LISTEN/v1/ws, wss:// with TLS. */
static int default_public_url(config_t *cfg) {
  size_t len = strlen("wss://") + strlen(cfg->listen) + strlen("/v1/ws") + 1;
  char *url = malloc(len);
  if (!url) return -CV_ENOMEM;
  snprintf(url, len, "%s://%s/v1/ws", cfg->tls_cert ? "wss" : "ws", cfg->listen);
  free(cfg->public_url);
  cfg->public_url = url;
  return 0;
}

int config_parse(config_t *cfg, int argc, char **argv) {
  memset(cfg, 0, sizeof *cfg);
  for (size_t i = 0; i < CV_ARRAY_SIZE(settings); i++)
    if (settings[i].def && apply(cfg, &settings[i], settings[i].def, "default") != 0)
      return -CV_EINVAL;
  for (size_t i = 0; i < CV_ARRAY_SIZE(settings); i++) {
    const char *v = getenv(settings[i].env);
    if (v && apply(cfg, &settings[i], v, "environment") != 0) return -CV_EINVAL;
  }
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      config_usage(stdout);
      return 1;
    }
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "converger: unexpected argument \"%s\" (see --help)\n", a);
      return -CV_EINVAL;
    }
    const char *name = a + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const setting_t *s = find_flag(name, len);
    if (!s) {
      fprintf(stderr, "converger: unknown flag \"--%.*s\" (see --help)\n", (int)len, name);
      return -CV_EINVAL;
    }
    const char *v = eq ? eq + 1 : NULL;
    if (!v) {
      if (i + 1 >= argc) {
        fprintf(stderr, "converger: flag --%s needs a value (%s)\n", s->flag, s->env);
        return -CV_EINVAL;
      }
      v = argv[++i];
    }
    if (apply(cfg, s, v, "flag") != 0) return -CV_EINVAL;
  }
  if (cfg->retry_after_min_ms > cfg->retry_after_max_ms) {
    fprintf(stderr,
            "converger: invalid CONVERGER_RETRY_AFTER_MIN_MS %d: above "
            "CONVERGER_RETRY_AFTER_MAX_MS %d\n",
            cfg->retry_after_min_ms, cfg->retry_after_max_ms);
    return -CV_EINVAL;
  }
  if (!cfg->tls_cert != !cfg->tls_key) {
    fprintf(stderr, "converger: %s is set without %s: TLS needs both\n",
            cfg->tls_cert ? "CONVERGER_TLS_CERT" : "CONVERGER_TLS_KEY",
            cfg->tls_cert ? "CONVERGER_TLS_KEY" : "CONVERGER_TLS_CERT");
    return -CV_EINVAL;
  }
  /* Rotation lists (config_key_next): every entry as long as one alone
   * must be. Refused here, with the other settings (exit 2), not when the
   * secrets are loaded. */
  if (cfg->token_secret && !keys_long_enough(cfg->token_secret, CONFIG_SECRET_MIN)) {
    fprintf(stderr,
            "converger: invalid CONVERGER_TOKEN_SECRET: want 1 to %d secrets (comma-separated), "
            "every secret at least %d bytes\n",
            CONFIG_KEYS_MAX, CONFIG_SECRET_MIN);
    return -CV_EINVAL;
  }
  if (cfg->api_key && !keys_long_enough(cfg->api_key, 1)) {
    fprintf(stderr, "converger: invalid CONVERGER_API_KEY: want 1 to %d keys (comma-separated)\n",
            CONFIG_KEYS_MAX);
    return -CV_EINVAL;
  }
  if (cfg->bus) {
    char why[300];
    if (strcmp(dburl_backend(cfg->database_url), "postgres") != 0) {
      fprintf(stderr, "converger: CONVERGER_BUS needs a PostgreSQL CONVERGER_DATABASE_URL (the "
                      "control database of a sharded cluster)\n");
      return -CV_EINVAL;
    }
    if (busurl_parse(cfg->bus, NULL, NULL, why, sizeof why) != 0) {
      fprintf(stderr, "converger: invalid CONVERGER_BUS: %s\n", why);
      return -CV_EINVAL;
    }
  }
  /* The data directory holds the generated secrets: SQLite's is the
   * database file's directory; with PostgreSQL it is data/ under the
   * current directory (nodes started from one directory share it). */
  if (strcmp(dburl_backend(cfg->database_url), "sqlite") == 0) {
    const char *path = cfg->database_url + 7;
    const char *slash = strrchr(path, '/');
    cfg->data_dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    if (cfg->data_dir[0] == '\0') {
      free(cfg->data_dir);
      cfg->data_dir = strdup("/");
    }
  } else {
    cfg->data_dir = strdup("data");
  }
  /* With --listen HOST:0 the default names port 0: a node that listens on
   * a port chosen for it is given CONVERGER_NODE_ID (the tests do). It is
   * not renamed once the port is known: the LISTEN connection, started
   * before the listener, keeps the id it was given. */
  if (!cfg->node_id && default_node_id(cfg) != 0) return -CV_ENOMEM;
  if (!cfg->public_url) {
    cfg->public_url_default = 1;
    if (default_public_url(cfg) != 0) return -CV_ENOMEM;
  }
  return 0;
}

/* The host of a ws:// or wss:// URL (no user information, no port, no
 * path, query or fragment; an IPv6 literal keeps its brackets) into
 * out[len]. */
static void url_host(const char *url, char *out, size_t len) {
  const char *p = strstr(url, "://");
  p = p ? p + 3 : url;
  size_t n = strcspn(p, "/?#");
  const char *at = memrchr(p, '@', n); /* user information: dropped */
  if (at) {
    n -= (size_t)(at + 1 - p);
    p = at + 1;
  }
  const char *rb = p[0] == '[' ? memchr(p, ']', n) : NULL; /* [v6]:port */
  const char *colon = memrchr(p, ':', n);
  if (rb)
    n = (size_t)(rb - p) + 1;
  else if (colon)
    n = (size_t)(colon - p);
  snprintf(out, len, "%.*s", (int)n, p);
}

static int loopback_host(const char *h) {
  return strncmp(h, "127.", 4) == 0 || strcmp(h, "::1") == 0 || strcmp(h, "[::1]") == 0 ||
         strcmp(h, "localhost") == 0;
}

int config_listening(config_t *cfg) {
  if (cfg->public_url_default && default_public_url(cfg) != 0) return -CV_ENOMEM;
  free(cfg->admin_url);
  cfg->admin_url = NULL;
  char buf[600] = "", pub[300] = "";
  if (cfg->public_url) url_host(cfg->public_url, pub, sizeof pub);
  if (cfg->admin_host) {
    const char *host = cfg->admin_host;
    int any = host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
    if (any && pub[0]) host = pub;
    /* A loopback listener is reachable from this host only: published
     * when the clients' URL is on loopback too (nodes sharing one machine),
     * else not at all (converger roll then says where it cannot reach). */
    if (!loopback_host(host) || loopback_host(pub)) {
      int v6 = strchr(host, ':') && host[0] != '[';
      snprintf(buf, sizeof buf, v6 ? "http://[%s]:%d" : "http://%s:%d", host, cfg->admin_port);
    }
  }
  cfg->admin_url = strdup(buf);
  return cfg->admin_url ? 0 : -CV_ENOMEM;
}

static int mkdir_p(const char *dir) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -errno;
    *p = '/';
  }
  if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -errno;
  return 0;
}

int config_key_next(const char **p, const char **key, size_t *len) {
  while (**p) {
    size_t n = strcspn(*p, ",\r\n");
    const char *b = *p, *e = *p + n;
    *p += n;
    if (**p) (*p)++;
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if (e > b) {
      *key = b;
      *len = (size_t)(e - b);
      return 1;
    }
  }
  return 0;
}

/* Whether `text` holds 1 to CONFIG_KEYS_MAX keys (config_key_next), each
 * at least min_len bytes. */
static int keys_long_enough(const char *text, size_t min_len) {
  int n = 0;
  const char *key;
  size_t len;
  for (const char *p = text; config_key_next(&p, &key, &len);)
    if (len < min_len || ++n > CONFIG_KEYS_MAX) return 0;
  return n > 0;
}

int config_read_secret(const char *dir, const char *name, size_t min_len, char **out) {
  char path[4096], buf[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -errno;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) return -errno;
  buf[n] = '\0';
  if (!keys_long_enough(buf, min_len)) {
    log_error("secret file %s: want 1 to %d keys (one per line), each at least %zu bytes", path,
              CONFIG_KEYS_MAX, min_len);
    return -EINVAL;
  }
  *out = strdup(buf);
  return *out ? 0 : -ENOMEM;
}

/* Read the secret in dir/name (config_read_secret), or create it with 32
 * random bytes as hex. */
static int secret_file(const char *dir, const char *name, size_t min_len, int create, char **out) {
  char path[4096], buf[256];
  int r = config_read_secret(dir, name, min_len, out);
  if (r != -ENOENT || !create) return r;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (util_random_hex(buf, 32) != 0) return -EIO;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return -errno;
  size_t len = strlen(buf);
  buf[len] = '\n';
  ssize_t w = write(fd, buf, len + 1);
  close(fd);
  if (w != (ssize_t)len + 1) return -EIO;
  buf[len] = '\0';
  *out = strdup(buf);
  return 0;
}

int config_load_secrets(config_t *cfg, int create, int *key_from_file) {
  int r;
  *key_from_file = 0;
  if (create && (r = mkdir_p(cfg->data_dir)) != 0) {
    log_error("cannot create data directory %s: %s", cfg->data_dir, strerror(-r));
    return r;
  }
  if (!cfg->api_key) {
    if ((r = secret_file(cfg->data_dir, "api-key", 1, create, &cfg->api_key)) != 0) {
      log_error("cannot %s %s/api-key: %s", create ? "read or create" : "read", cfg->data_dir,
                strerror(-r));
      return r;
    }
    *key_from_file = 1;
  }
  if (!cfg->token_secret) {
    if ((r = secret_file(cfg->data_dir, "token-secret", CONFIG_SECRET_MIN, create,
                         &cfg->token_secret)) != 0) {
      log_error("cannot %s %s/token-secret: %s", create ? "read or create" : "read", cfg->data_dir,
                strerror(-r));
      return r;
    }
    cfg->secret_from_file = 1;
  } /* set ones were checked with the settings (config_parse) */
  cfg->key_from_file = *key_from_file;
  return 0;
}

void config_free(config_t *cfg) {
  for (size_t i = 0; i < CV_ARRAY_SIZE(settings); i++) {
    if (settings[i].kind == K_INT) continue;
    char **p = (char **)((char *)cfg + settings[i].offset);
    free(*p);
    *p = NULL;
  }
  free(cfg->listen_host);
  free(cfg->admin_host);
  free(cfg->admin_url);
  free(cfg->data_dir);
  cfg->listen_host = cfg->admin_host = cfg->admin_url = cfg->data_dir = NULL;
}
