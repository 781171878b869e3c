/*
 * config: every setting of `converger serve`, read from the environment and
 * from flags (a flag wins over the environment), with defaults. One table
 * drives parsing, validation and `--help`, so the three never disagree.
 * Loop thread only (called once at start-up).
 */
#ifndef CONVERGER_CORE_CONFIG_H
#define CONVERGER_CORE_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "common/jitter.h"
#include "common/util.h"

/* The shortest token secret accepted (bytes): HS256's key is as strong as
 * its hash is long (RFC 7518, section 3.2). */
#define CONFIG_SECRET_MIN 32
#define CONFIG_KEYS_MAX   8 /* API keys, or token secrets, at once (a rotation needs 2) */
#define CONFIG_URL_MAX                                                                             \
  512 /* CONVERGER_PUBLIC_URL, bytes: the membership row holds it (STORE_URL_MAX) */

typedef struct {
  char *listen;           /* "host:port" */
  char *listen_host;      /* derived from listen */
  int listen_port;        /* derived from listen */
  char *admin_listen;     /* host:port of the admin listener; "" none (all on listen) */
  char *admin_host;       /* derived from admin_listen; NULL: none */
  int admin_port;         /* derived from admin_listen */
  char *admin_url;        /* http://HOST:PORT of the admin listener for others (config_listening) */
  int key_from_file;      /* the API key came from data_dir/api-key (SIGHUP re-reads it) */
  int secret_from_file;   /* the token secret came from data_dir/token-secret (likewise) */
  char *tls_cert;         /* PEM chain for TLS on the client listener; NULL: plain TCP */
  char *tls_key;          /* PEM private key of tls_cert */
  char *database_url;     /* "sqlite:PATH", "postgres://..." or libpq keywords */
  char *data_dir;         /* secrets: the SQLite file's directory; PostgreSQL: "data" */
  char *api_key;          /* NULL: generated/stored by config_load_secrets */
  char *token_secret;     /* NULL: generated/stored by config_load_secrets */
  char *node_id;          /* default hostname:port */
  char *public_url;       /* ws URL for clients (default ws://LISTEN/v1/ws) */
  int public_url_default; /* public_url was not set: config_listening writes it again */
  char *web_dir;          /* demo page directory */
  char *sqlite_sync;      /* off | normal | full */
  char *log_level;        /* debug | info | warn | error */
  char *log_format;       /* text | json */
  int access_log;         /* 1: a line per REST request and upgrade */
  int pool_size;          /* worker threads = database connections */
  int append_batch;       /* appends per group commit at most (store/pool.h); 1: one each */
  int max_message_bytes;  /* largest WebSocket message accepted, bytes */
  int heartbeat_ms;       /* ping interval, ms */
  int hello_timeout_ms;   /* time allowed for the first frame, ms */
  int header_timeout_ms;  /* time allowed for an HTTP header block, ms */
  int max_subs;           /* subscriptions per connection */
  int token_leeway_ms;    /* skew allowed past a token's exp, ms */
  char *token_public_keys;                  /* RS256 / ES256 key files (gate/keys.h); NULL: none */
  char *token_issuer;                       /* required iss; NULL: not checked */
  char *token_audience;                     /* required aud; NULL: not checked */
  int rate_send, rate_send_burst;           /* send frames per second per connection; 0: off */
  int rate_subscribe, rate_subscribe_burst; /* subscribe + unsubscribe + sync, per connection */
  int rate_refresh, rate_refresh_burst;     /* refresh frames, per connection */
  int rate_signal, rate_signal_burst;       /* signal frames, per connection */
  int presence_grace_ms;  /* a client stays present this long after its last connection */
  int max_presence;       /* users listed per conversation; past it, counted only */
  int rate_abuse_factor;  /* this many times a rate ... (0: never closed for it) */
  int rate_abuse_ms;      /* ... every second for this long: close 1008 rate_limited */
  int max_conns_per_user; /* WebSocket connections per token sub on the node; 0: no limit */
  int rest_rate,
      rest_rate_burst;       /* REST appends and signals per second, one bucket per node; 0: off */
  int revocation_refresh_ms; /* revocation cache refresh period, ms */
  char *bus;                 /* CONVERGER_BUS: Redis URLs of a sharded cluster; NULL: one database */
  int bus_check_ms;          /* a conversation with nothing heard this long: its head is read */
  int retry_after_min_ms;    /* retry hint range, ms */
  int retry_after_max_ms;
  int handshake_concurrency;  /* admission slots; 0: half the pool (gate/admission.h) */
  int handshake_queue_ms;     /* longest admission wait, ms */
  int handshake_queue_max;    /* admission waiters allowed */
  int pool_queue_target_ms;   /* pool queue-delay target, ms (store/pool.h) */
  int pool_queue_interval_ms; /* pool queue-delay interval, ms */
  int store_timeout_ms;       /* deadline of interactive store jobs from submission, ms */
  int accept_rate;            /* WebSocket upgrades per second; 0: unlimited */
  int max_connections;        /* WebSocket connections at once; 0: from the open-file limit */
  int capacity_connections;   /* connections the node is sized for (roll's budget); 0: not set */
  int drain_window_ms;        /* drain: afterMs drawn from [0, this), ms (gate/drain.h) */
  int drain_close_rate;       /* drain: paced 1012 closes per second after the window */
  int drain_migrate;          /* drain: 1 drain frames first; 0 none, paced 1012 closes at once */
  int drain_shutdown_ms;      /* drain: exit this long after the drain began, ms */
  int test_store_delay_ms;    /* tests only: sleep before each store job, ms */
} config_t;

/* Print the settings table (flag, environment variable, default, meaning)
 * to `out`. */
void config_usage(FILE *out);

/* Fill `cfg` from defaults, then the environment, then argv (flags of the
 * form --name=value or --name value). Returns 0, 1 when --help was given
 * (usage already printed), or -CV_EINVAL after printing one line to stderr
 * naming the bad setting: callers exit with status 2. The strings in cfg
 * are heap copies freed by config_free. */
int config_parse(config_t *cfg, int argc, char **argv);

/* When api_key or token_secret is unset, read it from DATA_DIR/api-key or
 * DATA_DIR/token-secret. With `create`, a missing file is generated with a
 * random secret (mode 0600, creating the data directory); without it (the
 * `token` command, which must sign with the node's own secret), a missing
 * file is an error, and so is a token-secret file shorter than
 * CONFIG_SECRET_MIN bytes. Sets *key_from_file to 1 when the API key came from the
 * data directory (so the caller can say where it is). Returns 0 or a negative
 * errno after logging why. */
int config_load_secrets(config_t *cfg, int create, int *key_from_file);

/* The text of dir/name: one key, or several separated by commas or line
 * ends (a rotation), each at least min_len bytes. Heap string in *out.
 * Returns 0, -ENOENT (no file), -EINVAL (empty, a key too short; logged)
 * or another negative errno. Any thread. */
int config_read_secret(const char *dir, const char *name, size_t min_len, char **out);

/* The next key of a key list (API keys, token secrets: separated by commas
 * or line ends, blanks around each dropped, empty ones skipped) at *p:
 * 1 with *key, *len (not NUL-terminated) and *p moved past it; 0 at the
 * end. Any thread. */
int config_key_next(const char **p, const char **key, size_t *len);

/* The listeners are open, their ports chosen (port 0 in a setting): set
 * the URLs that name them. public_url, when it was not set, becomes
 * ws://LISTEN/v1/ws (wss:// with TLS) with the port chosen. Then
 * cfg->admin_url, the URL other hosts (converger roll) reach the admin
 * listener at: http://HOST:admin_port with HOST the listener's address,
 * or the host of public_url when it listens on every address (0.0.0.0,
 * ::); "" without an admin listener, and for a loopback listener when
 * public_url is not on loopback (no other host could reach it). Returns 0
 * or -CV_ENOMEM. Loop thread, at start. */
int config_listening(config_t *cfg);

void config_free(config_t *cfg);

/* A retry hint for a refusal, drawn from `rng`: uniform in
 * CONVERGER_RETRY_AFTER_MIN_MS..MAX_MS, ms. The thread owning `rng`. */
static inline long config_retry_hint(const config_t *cfg, jitter_rng_t *rng) {
  return (long)jitter_retry_hint(rng, cfg->retry_after_min_ms, cfg->retry_after_max_ms);
}

/* The deadline of interactive store work submitted now (a REST request, a
 * hello, a sync or gap fill, a socket send: work a client waits for), for
 * pool_job_t.deadline_ms: CONVERGER_STORE_TIMEOUT_MS from now, monotonic
 * ms. Background jobs (membership, revocations, resync, drain peers) have
 * none. Any thread. */
static inline uint64_t config_store_deadline(const config_t *cfg) {
  return util_mono_ms() + (uint64_t)cfg->store_timeout_ms;
}

#endif
