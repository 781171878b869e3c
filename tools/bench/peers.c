/*
 * `converger bench peers`: converger side by side with other WebSocket
 * fan-out servers, measured by one neutral load client (this file), on one
 * machine (issue 21). The peers:
 *   converger  this executable's node (bench/node.h), SQLite with
 *              synchronous=off, messages sent as `send` frames and stored;
 *   uws        uWebSockets.js 20.30 (tools/bench/peers/uws.mjs): pub/sub
 *              on a topic, in memory;
 *   ws         Node ws 8.23 (tools/bench/peers/ws.mjs): a broadcast loop;
 *   nats       nats-server (Debian) with its WebSocket listener, core NATS
 *              (at most once, in memory);
 *   mosquitto  mosquitto (Debian) over WebSocket, MQTT 3.1.1 QoS 0.
 * scripts/setup --bench-peers installs the last four. A peer that is not
 * installed fails the run with what to install.
 *
 * Each round starts every peer fresh, one after the other (rounds
 * interleave the peers), the server pinned to --server-cpu and this client
 * to --client-cpu. For each it measures, from /proc of the server's process
 * (utime + stime) and its VmRSS:
 *   1. memory: --conns subscribers opened and subscribed, then 2 s idle:
 *      (RSS after - RSS before) / conns;
 *   2. handshakes: --handshakes new subscribers (connect, upgrade,
 *      subscribe, the subscription acknowledged where the protocol has an
 *      acknowledgement), OPEN_WINDOW at a time: server CPU / handshakes;
 *   3. single messages: --single messages to --subs subscribers, one at a
 *      time (the next once every subscriber has the last): server CPU per
 *      delivery, and the time from the publish to the last subscriber's
 *      receipt (p50, p99);
 *   4. bursts of --burst (20) messages, --bursts times: deliveries/s;
 *   5. one burst of --big-burst (200): deliveries/s; over phases 4 and 5,
 *      the server's peak RSS (VmHWM, reset through /proc/PID/clear_refs
 *      before phase 4) over its RSS at rest just before;
 *   6. a steady rate: --steady messages at --steady-rate per second, paced
 *      by the clock whatever the server's progress, to --steady-subs new
 *      subscribers: the time from each publish to its last subscriber's
 *      receipt (p50, p99).
 * Every subscriber must get every message once, in order (a marker "#P" and
 * eight digits in each payload); a loss fails the run.
 *
 * Main thread only.
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "bench/bench.h"
#include "bench/node.h"
#include "bench/restc.h"
#include "bench/run.h"
#include "common/jitter.h"
#include "common/util.h"

#define CMD         "converger bench peers"
#define OPEN_WINDOW 128 /* connections connecting or upgrading at once */
#define MAX_ROUNDS  9
#define PAYLOAD     100 /* bytes of every message's payload */

typedef enum { P_CONVERGER, P_UWS, P_WS, P_NATS, P_MOSQUITTO, P_COUNT } peer_t;
static const char *const peer_name[P_COUNT] = {"converger", "uws", "ws", "nats", "mosquitto"};

enum { F_RSS, F_HS, F_CPU1, F_LAT50, F_LAT99, F_ST50, F_ST99, F_PEAK, F_B20, F_B200, F_COUNT };
#define F_LOWER_BETTER F_B20 /* the figures before it: lower is better */
static const char *const fig_name[F_COUNT] = {
    "bytes of server RSS per idle subscribed connection",
    "server CPU per handshake (connect, upgrade, subscribe), us",
    "server CPU per delivery, one message in flight, us",
    "one message to every subscriber, p50, ms",
    "one message to every subscriber, p99, ms",
    "steady --steady-rate messages/s to --steady-subs subscribers, p50, ms",
    "the same, p99, ms",
    "peak RSS during the bursts over RSS at rest",
    "deliveries/s, bursts of --burst messages",
    "deliveries/s, one burst of --big-burst messages",
};

typedef struct {
  long long rounds, conns, handshakes, subs, single, burst, bursts, big_burst, steady, steady_rate,
      steady_subs, server_cpu, client_cpu, timeout_s;
  int peer[P_COUNT];
  size_t npeers;
  const char *peers_dir, *out;
} opts_t;

typedef struct run_s run_t;

/* One client connection. */
typedef struct {
  uv_tcp_t tcp;
  uv_connect_t creq;
  run_t *r;
  uint32_t index;
  uint8_t pub;   /* the publisher */
  uint8_t state; /* 0 connecting, 1 upgrading, 2 open, 3 ready (subscribed) */
  uint8_t handle;
  uint8_t *in; /* bytes read and not yet parsed */
  size_t in_len, in_cap;
  int64_t last; /* last message index received */
  uint64_t got;
  uint8_t carry[9]; /* the last bytes of the frame before: a marker may span two frames */
  uint8_t ncarry;
} pc_t;

struct run_s {
  const opts_t *o;
  peer_t peer;
  int port;
  pid_t pid; /* the server (uws, ws, nats, mosquitto); converger's is b.pid */
  bench_t *b;
  char dir[256];
  char *token;
  uv_loop_t *loop;
  pc_t *c; /* the set of connections; c[0] may be the publisher */
  size_t n, next, opening, ready;
  size_t want_ready;
  size_t handles; /* client handles not closed yet */
  int failed;
  char err[256];
  uint64_t deadline_ns;
  /* messages */
  int64_t sent;    /* messages published this phase */
  uint32_t *count; /* per message of the phase: subscribers that have it */
  uint64_t *pub_ns, *done_ns;
  int64_t done_msgs; /* messages every subscriber has */
  uint64_t deliveries, order_errors;
  size_t nsubs;     /* subscribers in the set */
  int64_t wait_for; /* the phase ends when done_msgs reaches it */
  uv_timer_t watch;
  uv_timer_t pace;       /* the steady phase's publisher */
  uint64_t pace_t0;      /* when it began (run_now_ns) */
  int64_t pace_msgs;     /* messages it publishes */
  uint64_t pace_late_ns; /* the most a publish came after its time */
  long rest_kb, peak_kb; /* VmRSS before the bursts, VmHWM after */
  uint32_t rng;
};

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

static void fail(run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(run_t *r, const char *fmt, ...) {
  if (r->failed) return;
  r->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
  uv_stop(r->loop);
}

/* ---- server processes ------------------------------------------------------------ */

static double cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  unsigned long long ut = 0, st = 0;
  /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static pid_t server_pid(const run_t *r) { return r->peer == P_CONVERGER ? r->b->pid : r->pid; }

static int port_open(int port) {
  uv_os_sock_t fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", port, &a);
  int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* Start the peer's server on a free port and wait until it accepts. */
static int server_start(run_t *r) {
  const opts_t *o = r->o;
  if (r->peer == P_CONVERGER) {
    bench_t *b = r->b;
    b->node_cpu = (int)o->server_cpu;
    static const char *const env[] = {"CONVERGER_RATE_SEND=0", "CONVERGER_MAX_SUBS=10", NULL};
    if (bnode_start_env(b, env) != 0 || bnode_wait_ready(b) != 0) {
      fail(r, "converger: %s", b->err);
      return -1;
    }
    r->port = b->port;
    char out[512];
    if (restc_expect(b, "POST", "/v1/channels", "{\"id\":\"pc\",\"name\":\"peers\"}", NULL, 201,
                     out, sizeof out) != 0 ||
        restc_expect(b, "POST", "/v1/conversations", "{\"id\":\"t\",\"channel\":\"pc\"}", NULL, 201,
                     out, sizeof out) != 0 ||
        restc_expect(b, "POST", "/v1/conversations", "{\"id\":\"pub\",\"channel\":\"pc\"}", NULL,
                     201, out, sizeof out) != 0 ||
        !(r->token = restc_token(b, "peers"))) {
      fail(r, "converger: %s", b->err);
      return -1;
    }
    return 0;
  }
  r->port = bnode_free_port();
  const char *tmp = getenv("TMPDIR");
  snprintf(r->dir, sizeof r->dir, "%s/converger-peers-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(r->dir)) {
    r->dir[0] = '\0';
    fail(r, "cannot make a temporary directory: %s", strerror(errno));
    return -1;
  }
  char port[16], conf[300], script[PATH_MAX], text[1024];
  snprintf(port, sizeof port, "%d", r->port);
  char *argv[8] = {0};
  if (r->peer == P_UWS || r->peer == P_WS) {
    snprintf(script, sizeof script, "%s/%s", o->peers_dir, r->peer == P_UWS ? "uws.mjs" : "ws.mjs");
    char mods[PATH_MAX];
    snprintf(mods, sizeof mods, "%s/node_modules", o->peers_dir);
    if (access(mods, R_OK) != 0) {
      fail(r, "%s: %s is missing: run scripts/setup --bench-peers", peer_name[r->peer], mods);
      return -1;
    }
    argv[0] = "node", argv[1] = script, argv[2] = port;
  } else {
    /* a Debian daemon with a configuration file of the bench's */
    const char *name = r->peer == P_NATS ? "nats-server" : "mosquitto";
    if (r->peer == P_NATS) {
      /* the client port is required; the bench uses only the WebSocket one */
      snprintf(text, sizeof text,
               "listen: 127.0.0.1:%d\nmax_connections: 200000\nmax_pending: 64MB\n"
               "write_deadline: \"30s\"\nwebsocket {\n  listen: \"127.0.0.1:%d\"\n"
               "  no_tls: true\n  compression: false\n}\n",
               bnode_free_port(), r->port);
    } else {
      /* mosquitto 2.0.11 starts no WebSocket listener alone, and its
       * libwebsockets binds it to every interface whatever the address
       * says: an MQTT listener on loopback first (unused), then the
       * WebSocket one. The bench connects to 127.0.0.1 only. */
      snprintf(text, sizeof text,
               "per_listener_settings false\nallow_anonymous true\npersistence false\n"
               "max_queued_messages 100000\nlog_dest stderr\nlog_type error\n"
               "listener %d 127.0.0.1\nprotocol mqtt\nmax_connections -1\n"
               "listener %d\nprotocol websockets\nmax_connections -1\n",
               bnode_free_port(), r->port);
    }
    snprintf(conf, sizeof conf, "%s/%s.conf", r->dir, name);
    if (write_file(conf, text) != 0) {
      fail(r, "cannot write %s", conf);
      return -1;
    }
    snprintf(script, sizeof script, "/usr/sbin/%s", name); /* not always in PATH */
    argv[0] = access(script, X_OK) == 0 ? script : (char *)name;
    argv[1] = "-c", argv[2] = conf;
  }
  run_spawn_opts_t so = {.env = NULL,
                         .out_fd = -1,
                         .err_fd = -1,
                         .death_sig = SIGKILL,
                         .own_group = 1,
                         .cpu = (int)o->server_cpu};
  r->pid = run_spawn(argv, &so);
  if (r->pid < 0) {
    fail(r, "%s: cannot start %s: %s", peer_name[r->peer], argv[0], strerror(errno));
    return -1;
  }
  for (int i = 0; i < 500; i++) { /* 10 s */
    if (port_open(r->port)) return 0;
    int st;
    if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
      r->pid = 0;
      fail(r, "%s: %s exited before listening (%s)%s", peer_name[r->peer], argv[0],
           WIFEXITED(st) && WEXITSTATUS(st) == RUN_EXEC_FAILED ? "not installed" : "failed",
           r->peer == P_NATS || r->peer == P_MOSQUITTO ? ": run scripts/setup --bench-peers" : "");
      return -1;
    }
    run_sleep_ms(20);
  }
  fail(r, "%s: not listening on port %d after 10 s", peer_name[r->peer], r->port);
  return -1;
}

static void server_stop(run_t *r) {
  if (r->peer == P_CONVERGER) {
    bnode_stop(r->b);
    bnode_remove_dir(r->b);
  } else if (r->pid > 0) {
    run_stop_child(r->pid, 5000, NULL);
    r->pid = 0;
  }
  if (r->dir[0]) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
    if (system(cmd) != 0) fprintf(stderr, CMD ": could not remove %s\n", r->dir);
    r->dir[0] = '\0';
  }
  free(r->token);
  r->token = NULL;
}

/* ---- the client: WebSocket framing and the peers' protocols ------------------------ */

static void on_write(uv_write_t *w, int status) {
  (void)status;
  free(w);
}

static void send_bytes(pc_t *c, const void *data, size_t len) {
  uv_buf_t buf = uv_buf_init((char *)data, (unsigned)len);
  int n = uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
  if (n == (int)len) return;
  if (n < 0 && n != UV_EAGAIN) {
    fail(c->r, "%s: a write failed: %s", peer_name[c->r->peer], uv_strerror(n));
    return;
  }
  size_t done = n > 0 ? (size_t)n : 0;
  uv_write_t *w = malloc(sizeof *w + len - done);
  if (!w) {
    fail(c->r, "out of memory");
    return;
  }
  memcpy(w + 1, (const char *)data + done, len - done);
  buf = uv_buf_init((char *)(w + 1), (unsigned)(len - done));
  if (uv_write(w, (uv_stream_t *)&c->tcp, &buf, 1, on_write) != 0) {
    free(w);
    fail(c->r, "%s: uv_write failed", peer_name[c->r->peer]);
  }
}

/* One masked client frame (RFC 6455 5.2, 5.3): opcode 1 text, 2 binary,
 * 10 pong. */
static void send_frame(pc_t *c, int opcode, const void *data, size_t len) {
  uint8_t stackbuf[512], *f = len + 14 <= sizeof stackbuf ? stackbuf : malloc(len + 14);
  if (!f) {
    fail(c->r, "out of memory");
    return;
  }
  size_t h = 0;
  f[h++] = (uint8_t)(0x80 | opcode);
  if (len < 126) {
    f[h++] = (uint8_t)(0x80 | len);
  } else if (len < 65536) {
    f[h++] = 0x80 | 126;
    f[h++] = (uint8_t)(len >> 8);
    f[h++] = (uint8_t)len;
  } else {
    f[h++] = 0x80 | 127;
    for (int i = 7; i >= 0; i--) f[h++] = (uint8_t)((uint64_t)len >> (8 * i));
  }
  run_t *r = c->r;
  r->rng ^= r->rng << 13, r->rng ^= r->rng >> 17, r->rng ^= r->rng << 5;
  uint8_t mask[4] = {(uint8_t)r->rng, (uint8_t)(r->rng >> 8), (uint8_t)(r->rng >> 16),
                     (uint8_t)(r->rng >> 24)};
  memcpy(f + h, mask, 4);
  h += 4;
  for (size_t i = 0; i < len; i++) f[h + i] = ((const uint8_t *)data)[i] ^ mask[i & 3];
  send_bytes(c, f, h + len);
  if (f != stackbuf) free(f);
}

static void send_text(pc_t *c, const char *text) { send_frame(c, 1, text, strlen(text)); }

/* An MQTT 3.1.1 packet's remaining length (section 2.2.3) into `out`. */
static size_t mqtt_len(uint8_t *out, size_t v) {
  size_t n = 0;
  do {
    uint8_t d = v % 128;
    v /= 128;
    out[n++] = (uint8_t)(v ? d | 0x80 : d);
  } while (v);
  return n;
}

static void set_ready(pc_t *c);

/* What a connection sends once its WebSocket is open. */
static void on_open(pc_t *c) {
  run_t *r = c->r;
  char text[4096];
  switch (r->peer) {
  case P_CONVERGER:
    snprintf(
        text, sizeof text,
        "{\"type\":\"hello\",\"token\":\"%s\",\"subs\":[{\"conv\":\"%s\",\"watermark\":null}]}",
        r->token, c->pub ? "pub" : "t");
    send_text(c, text);
    break;
  case P_UWS:
  case P_WS:
    set_ready(c); /* subscribed by the upgrade itself */
    break;
  case P_NATS:
    break; /* after the server's INFO */
  case P_MOSQUITTO: {
    /* CONNECT: "MQTT" level 4, clean session, no keep-alive, client id */
    char id[24];
    int idn = snprintf(id, sizeof id, "c%u-%d", c->index, (int)getpid());
    uint8_t p[64], body[48];
    size_t bn = 0;
    const uint8_t head[] = {0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 0};
    memcpy(body, head, sizeof head);
    bn = sizeof head;
    body[bn++] = 0;
    body[bn++] = (uint8_t)idn;
    memcpy(body + bn, id, (size_t)idn);
    bn += (size_t)idn;
    size_t n = 0;
    p[n++] = 0x10;
    n += mqtt_len(p + n, bn);
    memcpy(p + n, body, bn);
    send_frame(c, 2, p, n + bn);
    break;
  }
  default:
    break;
  }
}

/* A message's payload: the marker, its index, padding to PAYLOAD bytes. */
static void payload(char out[PAYLOAD + 1], int64_t i) {
  int n = snprintf(out, PAYLOAD + 1, "#P%08lld", (long long)i);
  memset(out + n, 'x', (size_t)(PAYLOAD - n));
  out[PAYLOAD] = '\0';
}

static void publish(run_t *r, int64_t i) {
  pc_t *c = &r->c[0];
  char p[PAYLOAD + 1], text[512];
  payload(p, i);
  switch (r->peer) {
  case P_CONVERGER:
    snprintf(text, sizeof text,
             "{\"type\":\"send\",\"conv\":\"t\",\"id\":\"m%d-%lld\",\"body\":{\"text\":\"%s\"}}",
             (int)r->rng, (long long)i, p);
    send_text(c, text);
    break;
  case P_UWS:
  case P_WS:
    send_text(c, p);
    break;
  case P_NATS:
    snprintf(text, sizeof text, "PUB t %d\r\n%s\r\n", PAYLOAD, p);
    send_text(c, text);
    break;
  case P_MOSQUITTO: {
    uint8_t pk[PAYLOAD + 16];
    size_t n = 0;
    pk[n++] = 0x30; /* PUBLISH, QoS 0 */
    n += mqtt_len(pk + n, 3 + PAYLOAD);
    pk[n++] = 0, pk[n++] = 1, pk[n++] = 't';
    memcpy(pk + n, p, PAYLOAD);
    send_frame(c, 2, pk, n + PAYLOAD);
    break;
  }
  default:
    break;
  }
  if (i < r->wait_for) r->pub_ns[i] = run_now_ns();
  r->sent++;
}

static void set_ready(pc_t *c) {
  if (c->state == 3) return;
  c->state = 3;
  c->r->ready++;
  if (c->r->ready >= c->r->want_ready && c->r->want_ready) uv_stop(c->r->loop);
}

static void delivered(pc_t *c, int64_t i);

/* Every message marker ("#P" and eight digits) in a subscriber's frame,
 * also one that began in the frame before: nats-server and mosquitto cut
 * their output into WebSocket frames wherever it falls. */
static void deliveries(pc_t *c, const uint8_t *p, size_t n) {
  if (c->ncarry) {
    uint8_t tmp[18];
    size_t head = n < 9 ? n : 9, k = c->ncarry;
    memcpy(tmp, c->carry, k);
    memcpy(tmp + k, p, head);
    for (size_t j = 0; j < k && j + 10 <= k + head; j++)
      if (tmp[j] == '#' && tmp[j + 1] == 'P') {
        int64_t i = 0;
        for (int d = 2; d < 10; d++) i = i * 10 + (tmp[j + d] - '0');
        delivered(c, i);
      }
  }
  const uint8_t *q = p, *end = p + n;
  while ((q = memmem(q, (size_t)(end - q), "#P", 2)) != NULL && end - q >= 10) {
    int64_t i = 0;
    for (int k = 2; k < 10; k++) i = i * 10 + (q[k] - '0');
    q += 10;
    delivered(c, i);
  }
  /* the last 9 bytes seen (of this frame, and of the ones before when it
   * is shorter), where an incomplete marker may begin (a complete one was
   * counted) */
  if (n >= 9) {
    memcpy(c->carry, end - 9, 9);
    c->ncarry = 9;
  } else {
    size_t keep = c->ncarry + n > 9 ? 9 - n : c->ncarry;
    memmove(c->carry, c->carry + c->ncarry - keep, keep);
    memcpy(c->carry + keep, p, n);
    c->ncarry = (uint8_t)(keep + n);
  }
}

/* Message `i` reached subscriber `c`. */
static void delivered(pc_t *c, int64_t i) {
  run_t *r = c->r;
  if (i != c->last + 1) r->order_errors++;
  c->last = i;
  c->got++;
  r->deliveries++;
  if (i >= 0 && i < r->wait_for && ++r->count[i] == r->nsubs) {
    r->done_ns[i] = run_now_ns();
    r->done_msgs++;
    if (r->done_msgs >= r->wait_for) uv_stop(r->loop);
  }
}

/* One data frame from the server. */
static void on_data(pc_t *c, const uint8_t *p, size_t n) {
  run_t *r = c->r;
  if (c->state < 3) {
    switch (r->peer) {
    case P_CONVERGER:
      if (memmem(p, n, "\"type\":\"synced\"", 15)) set_ready(c);
      if (memmem(p, n, "\"type\":\"error\"", 14))
        fail(r, "converger: an error frame: %.*s", (int)(n > 200 ? 200 : n), p);
      break;
    case P_NATS:
      if (n >= 4 && memcmp(p, "INFO", 4) == 0)
        send_text(c, c->pub
                         ? "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n"
                         : "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB t 1\r\nPING\r\n");
      if (memmem(p, n, "PONG", 4)) set_ready(c);
      break;
    case P_MOSQUITTO:
      if (n >= 2 && p[0] == 0x20) { /* CONNACK */
        if (c->pub) {
          set_ready(c);
        } else {
          const uint8_t sub[] = {0x82, 6, 0, 1, 0, 1, 't', 0}; /* SUBSCRIBE t, QoS 0 */
          send_frame(c, 2, sub, sizeof sub);
        }
      }
      if (n >= 2 && p[0] == 0x90) set_ready(c); /* SUBACK */
      break;
    default:
      break;
    }
    return;
  }
  if (r->peer == P_NATS && n >= 4 && memcmp(p, "PING", 4) == 0) {
    send_text(c, "PONG\r\n");
    return;
  }
  if (!c->pub) deliveries(c, p, n);
}

static void open_more(run_t *r);

static void on_close(uv_handle_t *h) {
  pc_t *c = h->data;
  c->handle = 0;
  c->r->handles--;
}

static void lost(pc_t *c, const char *why) {
  fail(c->r, "%s: connection %u lost (%s)", peer_name[c->r->peer], c->index, why);
}

/* Parse `len` bytes at `in`: the 101 answer, then frames. Returns how
 * many were used (the rest is an incomplete frame). */
static size_t parse(pc_t *c, const uint8_t *in, size_t len) {
  size_t off = 0;
  if (c->state == 1) {
    const uint8_t *e = memmem(in, len, "\r\n\r\n", 4);
    if (!e) return 0;
    if (len < 12 || memcmp(in + 9, "101", 3) != 0) {
      fail(c->r, "%s: upgrade refused: %.60s", peer_name[c->r->peer], in);
      return len;
    }
    off = (size_t)(e + 4 - in);
    c->state = 2;
    c->r->opening--;
    on_open(c);
    open_more(c->r);
  }
  while (len - off >= 2 && !c->r->failed) {
    const uint8_t *f = in + off;
    size_t avail = len - off, h = 2;
    uint64_t flen = f[1] & 0x7f;
    if (flen == 126) {
      if (avail < 4) break;
      flen = (uint64_t)f[2] << 8 | f[3], h = 4;
    } else if (flen == 127) {
      if (avail < 10) break;
      flen = 0;
      for (int i = 0; i < 8; i++) flen = flen << 8 | f[2 + i];
      h = 10;
    }
    if (f[1] & 0x80) h += 4; /* servers do not mask; skip a mask key if one does */
    if (avail < h + flen) break;
    int op = f[0] & 0x0f;
    if (op == 8) {
      lost(c, "close frame");
      return len;
    }
    if (op == 9)
      send_frame(c, 10, f + h, (size_t)flen);
    else if (op <= 2)
      on_data(c, f + h, (size_t)flen);
    off += h + (size_t)flen;
  }
  return off;
}

/* Every read of every connection lands in one buffer, parsed in place;
 * only an incomplete frame is kept, in its connection's own buffer. */
static uint8_t read_buf[256 << 10];

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  *buf = uv_buf_init((char *)read_buf, sizeof read_buf);
}

static int keep(pc_t *c, const uint8_t *p, size_t n) {
  if (c->in_len + n > c->in_cap) {
    size_t cap = c->in_cap ? c->in_cap : 4096;
    while (cap < c->in_len + n) cap *= 2;
    uint8_t *q = realloc(c->in, cap);
    if (!q) {
      fail(c->r, "out of memory");
      return -1;
    }
    c->in = q;
    c->in_cap = cap;
  }
  memcpy(c->in + c->in_len, p, n);
  c->in_len += n;
  return 0;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  pc_t *c = s->data;
  if (n < 0) {
    lost(c, n == UV_EOF ? "EOF" : uv_strerror((int)n));
    return;
  }
  const uint8_t *p = (const uint8_t *)buf->base;
  if (c->in_len == 0) {
    size_t used = parse(c, p, (size_t)n);
    if (used < (size_t)n) keep(c, p + used, (size_t)n - used);
    return;
  }
  if (keep(c, p, (size_t)n) != 0) return;
  size_t used = parse(c, c->in, c->in_len);
  memmove(c->in, c->in + used, c->in_len - used);
  c->in_len -= used;
  if (c->in_len == 0) { /* idle connections keep no buffer */
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
}

static void on_connect(uv_connect_t *req, int status) {
  pc_t *c = req->data;
  run_t *r = c->r;
  if (status != 0) {
    fail(r, "%s: connect failed: %s", peer_name[r->peer], uv_strerror(status));
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  c->state = 1;
  char req_text[512];
  const char *path = r->peer == P_CONVERGER ? "/v1/ws" : c->pub ? "/pub" : "/sub";
  const char *proto = r->peer == P_CONVERGER   ? "Sec-WebSocket-Protocol: converger.v1\r\n"
                      : r->peer == P_MOSQUITTO ? "Sec-WebSocket-Protocol: mqtt\r\n"
                                               : "";
  int n = snprintf(req_text, sizeof req_text,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   "Sec-WebSocket-Version: 13\r\n%s\r\n",
                   path, r->port, proto);
  send_bytes(c, req_text, (size_t)n);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void open_more(run_t *r) {
  while (r->next < r->n && r->opening < OPEN_WINDOW && !r->failed) {
    pc_t *c = &r->c[r->next];
    c->r = r;
    c->index = (uint32_t)r->next;
    c->last = -1;
    r->next++;
    r->opening++;
    uv_tcp_init(r->loop, &c->tcp);
    c->tcp.data = c;
    c->handle = 1;
    r->handles++;
    c->creq.data = c;
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", r->port, &a);
    int e = uv_tcp_connect(&c->creq, &c->tcp, (struct sockaddr *)&a, on_connect);
    if (e != 0) fail(r, "connect: %s", uv_strerror(e));
  }
}

static void watch_cb(uv_timer_t *t) {
  run_t *r = t->data;
  if (interrupted) fail(r, "interrupted");
  if (run_now_ns() > r->deadline_ns) fail(r, "timed out");
  if (r->peer == P_CONVERGER ? bnode_gone(r->b) : waitpid(r->pid, NULL, WNOHANG) == r->pid) {
    if (r->peer != P_CONVERGER) r->pid = 0; /* reaped: never signalled again */
    fail(r, "%s: the server exited", peer_name[r->peer]);
  }
}

/* Run the loop until the phase's condition stops it, a failure, or
 * `limit_ns` from now. */
static int run_loop_for(run_t *r, uint64_t limit_ns) {
  r->deadline_ns = run_now_ns() + limit_ns;
  uv_timer_start(&r->watch, watch_cb, 100, 100);
  while (!r->failed) {
    uv_run(r->loop, UV_RUN_DEFAULT);
    if (r->want_ready && r->ready >= r->want_ready) break;
    if (r->wait_for && r->done_msgs >= r->wait_for) break;
  }
  uv_timer_stop(&r->watch);
  return r->failed ? -1 : 0;
}

/* run_loop_for --timeout. */
static int run_loop(run_t *r) { return run_loop_for(r, (uint64_t)r->o->timeout_s * 1000000000u); }

/* Open `n` connections (the first the publisher when `with_pub`) and wait
 * until every one is subscribed (ready). */
static int set_open(run_t *r, size_t n, int with_pub) {
  r->c = calloc(n, sizeof *r->c);
  if (!r->c) {
    fail(r, "out of memory");
    return -1;
  }
  r->n = n;
  r->next = r->opening = r->ready = 0;
  r->want_ready = n;
  r->nsubs = with_pub ? n - 1 : n;
  if (with_pub) r->c[0].pub = 1;
  open_more(r);
  int e = run_loop(r);
  r->want_ready = 0;
  return e;
}

static void set_close(run_t *r) {
  for (size_t i = 0; i < r->next; i++)
    if (r->c[i].handle) {
      struct linger l = {1, 0};
      uv_os_fd_t fd;
      if (uv_fileno((uv_handle_t *)&r->c[i].tcp, &fd) == 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      uv_close((uv_handle_t *)&r->c[i].tcp, on_close);
    }
  while (r->handles > 0) uv_run(r->loop, UV_RUN_ONCE);
  for (size_t i = 0; i < r->next; i++) free(r->c[i].in);
  free(r->c);
  r->c = NULL;
  r->n = r->next = 0;
}

/* A message phase of `msgs` begins: its per-message arrays and its
 * counts, fresh. 0, or -1 (the run failed: out of memory). */
static int phase_begin(run_t *r, int64_t msgs) {
  free(r->count), free(r->pub_ns), free(r->done_ns);
  r->count = calloc((size_t)msgs, sizeof *r->count);
  r->pub_ns = calloc((size_t)msgs, sizeof *r->pub_ns);
  r->done_ns = calloc((size_t)msgs, sizeof *r->done_ns);
  if (!r->count || !r->pub_ns || !r->done_ns) {
    fail(r, "out of memory");
    return -1;
  }
  r->sent = r->done_msgs = 0;
  r->deliveries = r->order_errors = 0;
  return 0;
}

/* The phase ended: 0 when every subscriber got each of the `msgs`
 * messages once and in order, else -1 (the run failed, with why). */
static int phase_end(run_t *r, int64_t msgs) {
  r->wait_for = 0;
  if (r->failed) return -1;
  if (r->order_errors || r->deliveries != (uint64_t)msgs * r->nsubs) {
    fail(r, "%s: %" PRIu64 " deliveries of %" PRIu64 " expected, %" PRIu64 " out of order",
         peer_name[r->peer], r->deliveries, (uint64_t)msgs * r->nsubs, r->order_errors);
    return -1;
  }
  return 0;
}

/* A phase of `msgs` messages: published `per` at a time, the next group
 * once every subscriber has the last. */
static int messages(run_t *r, int64_t msgs, int64_t per) {
  if (phase_begin(r, msgs) != 0) return -1;
  for (size_t i = 1; i < r->n; i++) {
    r->c[i].last = -1;
    r->c[i].got = 0;
    r->c[i].ncarry = 0;
  }
  r->wait_for = msgs;
  while (r->done_msgs < msgs && !r->failed) {
    int64_t until = r->sent + per < msgs ? r->sent + per : msgs;
    while (r->sent < until) publish(r, r->sent);
    int64_t target = until;
    r->wait_for = target; /* stop once this group is everywhere */
    if (run_loop(r) != 0) break;
    r->wait_for = msgs;
  }
  return phase_end(r, msgs);
}

/* When the steady phase's message `i` is due: pace_t0 + i / steady_rate. */
static uint64_t pace_due_ns(const run_t *r, int64_t i) {
  return r->pace_t0 + (uint64_t)((double)i * 1e9 / (double)r->o->steady_rate);
}

/* The steady phase's clock: publish every message whose time has come,
 * whatever was delivered (open loop: a server's backlog shows in the
 * latencies, which run from each publish). How late the publisher itself
 * was against the schedule (libuv's 1 ms timer, a busy read) is kept
 * apart, in pace_late_ns, rather than added to every server's figure. */
static void pace_cb(uv_timer_t *t) {
  run_t *r = t->data;
  uint64_t now = run_now_ns();
  while (r->sent < r->pace_msgs && pace_due_ns(r, r->sent) <= now) {
    uint64_t late = now - pace_due_ns(r, r->sent);
    if (late > r->pace_late_ns) r->pace_late_ns = late;
    publish(r, r->sent);
  }
  if (r->sent >= r->pace_msgs) uv_timer_stop(t);
}

/* A phase of `msgs` messages published at --steady-rate per second (open
 * loop: a slow server gets them as fast anyway, and its latencies grow),
 * until every subscriber has every one. */
static int steady(run_t *r, int64_t msgs) {
  if (phase_begin(r, msgs) != 0) return -1;
  r->wait_for = r->pace_msgs = msgs;
  r->pace_late_ns = 0;
  r->pace_t0 = run_now_ns();
  uv_timer_start(&r->pace, pace_cb, 0, 1);
  /* --timeout from when the last one is due */
  run_loop_for(r, (uint64_t)r->o->timeout_s * 1000000000u + (pace_due_ns(r, msgs) - r->pace_t0));
  uv_timer_stop(&r->pace);
  return phase_end(r, msgs);
}

/* p50 and p99 (nearest rank) of the phase's `n` publish-to-last-receipt
 * times, ms. -1 on out of memory (the run failed). */
static int fanout_ranks(run_t *r, long long n, double *p50, double *p99) {
  double *lat = malloc((size_t)n * sizeof *lat);
  if (!lat) {
    fail(r, "out of memory");
    return -1;
  }
  for (long long i = 0; i < n; i++) lat[i] = (double)(r->done_ns[i] - r->pub_ns[i]) / 1e6;
  qsort(lat, (size_t)n, sizeof *lat, run_cmp_double);
  *p50 = lat[(size_t)ceil(0.50 * (double)n) - 1];
  *p99 = lat[(size_t)ceil(0.99 * (double)n) - 1];
  free(lat);
  return 0;
}

/* Reset the peak RSS (VmHWM) of `pid` to its RSS now (proc(5), clear_refs
 * "5"). 0 or -1. */
static int reset_peak(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)pid);
  return write_file(path, "5");
}

/* ---- one peer, one round -------------------------------------------------------------- */

static int one(run_t *r, double fig[F_COUNT]) {
  const opts_t *o = r->o;
  for (int f = 0; f < F_COUNT; f++) fig[f] = NAN;
  if (server_start(r) != 0) return -1;
  pid_t pid = server_pid(r);
  fprintf(stderr, CMD ": %s: %lld idle subscribers\n", peer_name[r->peer], o->conns);
  run_sleep_ms(300);
  long rss0 = bnode_status_kb(pid, "VmRSS");
  if (set_open(r, (size_t)o->conns, 0) != 0) return -1;
  run_sleep_ms(2000);
  long rss1 = bnode_status_kb(pid, "VmRSS");
  fig[F_RSS] = (double)(rss1 - rss0) * 1024.0 / (double)o->conns;
  set_close(r);
  run_sleep_ms(1000);

  fprintf(stderr, CMD ": %s: %lld handshakes\n", peer_name[r->peer], o->handshakes);
  double c0 = cpu_s(pid);
  if (set_open(r, (size_t)o->handshakes, 0) != 0) return -1;
  double c1 = cpu_s(pid);
  fig[F_HS] = (c1 - c0) * 1e6 / (double)o->handshakes;
  set_close(r);
  run_sleep_ms(1000);

  fprintf(stderr, CMD ": %s: %lld subscribers, messages\n", peer_name[r->peer], o->subs);
  if (set_open(r, (size_t)o->subs + 1, 1) != 0) return -1;
  run_sleep_ms(500);
  c0 = cpu_s(pid);
  if (messages(r, o->single, 1) != 0) return -1;
  c1 = cpu_s(pid);
  fig[F_CPU1] = (c1 - c0) * 1e6 / (double)(o->single * o->subs);
  if (fanout_ranks(r, o->single, &fig[F_LAT50], &fig[F_LAT99]) != 0) return -1;

  run_sleep_ms(500);
  r->rest_kb = bnode_status_kb(pid, "VmRSS");
  int peak_ok = reset_peak(pid) == 0;
  if (!peak_ok) /* a read-only /proc: the other figures still count */
    fprintf(stderr, CMD ": %s: no peak RSS figure: cannot write /proc/%d/clear_refs: %s\n",
            peer_name[r->peer], (int)pid, strerror(errno));
  uint64_t t0 = run_now_ns();
  if (messages(r, o->burst * o->bursts, o->burst) != 0) return -1;
  fig[F_B20] = (double)(o->burst * o->bursts * o->subs) / ((double)(run_now_ns() - t0) / 1e9);
  t0 = run_now_ns();
  if (messages(r, o->big_burst, o->big_burst) != 0) return -1;
  fig[F_B200] = (double)(o->big_burst * o->subs) / ((double)(run_now_ns() - t0) / 1e9);
  r->peak_kb = bnode_status_kb(pid, "VmHWM");
  if (peak_ok && r->rest_kb > 0 && r->peak_kb > 0)
    fig[F_PEAK] = (double)r->peak_kb / (double)r->rest_kb;
  set_close(r);
  run_sleep_ms(1000);

  fprintf(stderr, CMD ": %s: %lld subscribers, %lld messages/s\n", peer_name[r->peer],
          o->steady_subs, o->steady_rate);
  if (set_open(r, (size_t)o->steady_subs + 1, 1) != 0) return -1;
  run_sleep_ms(500);
  if (steady(r, o->steady) != 0) return -1;
  if (fanout_ranks(r, o->steady, &fig[F_ST50], &fig[F_ST99]) != 0) return -1;
  set_close(r);
  return 0;
}

/* ---- options, the rounds, the table --------------------------------------------------- */

static void usage(FILE *out) {
  fprintf(out,
          "usage: " CMD " [options]\n\n"
          "converger next to other WebSocket fan-out servers, one neutral load client,\n"
          "the server pinned to one CPU and the client to another, rounds interleaved,\n"
          "each server started fresh each round. Figures per server: RSS per idle\n"
          "subscribed connection, CPU per handshake, CPU per delivery with one message\n"
          "in flight and its fan-out time, deliveries/s in bursts and the peak RSS\n"
          "they cause, the fan-out time under a steady rate. Every subscriber\n"
          "must get every message once and in order. docs/benchmarks/peers.md says\n"
          "what each server guarantees.\n\n"
          "  --peers LIST        of converger,uws,ws,nats,mosquitto [all five]\n"
          "  --rounds N          rounds, medians reported (1..%d) [3]\n"
          "  --conns N           idle subscribers of the memory figure [10000]\n"
          "  --handshakes N      handshakes of the CPU figure [5000]\n"
          "  --subs N            subscribers of the message figures [5000]\n"
          "  --single N          messages sent one at a time [200]\n"
          "  --burst N           messages per burst [20]\n"
          "  --bursts N          bursts [20]\n"
          "  --big-burst N       messages of the one big burst [200]\n"
          "  --steady N          messages of the steady phase [5000]\n"
          "  --steady-rate N     its messages per second [1000]\n"
          "  --steady-subs N     its subscribers [20]\n"
          "  --server-cpu N      CPU the server runs on [0]\n"
          "  --client-cpu N      CPU this client runs on (-1: not pinned) [1]\n"
          "  --peers-dir DIR     the peers' programs and node_modules [%s]\n"
          "  --out FILE          also write every round's figures as JSON lines\n"
          "  --timeout S         limit of each phase [120]\n"
          "  --help              this text\n\n"
          "The uws and ws peers need Node and `scripts/setup --bench-peers` (npm ci in\n"
          "the peers directory); nats and mosquitto the Debian packages it installs.\n",
          MAX_ROUNDS, CONVERGER_PEERS_DIR_DEFAULT);
}

static int parse_opts(int argc, char **argv, opts_t *o, int *help) {
  const char *peers = "converger,uws,ws,nats,mosquitto";
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  static const char *const names[] = {"--peers", "--peers-dir", "--out"};
  const char **const dest[] = {&peers, &o->peers_dir, &o->out};
  if (!rest || run_split_string_options(CMD, argc, argv, names, dest, 3, rest, &nrest) != 0) {
    free(rest);
    return -1;
  }
  const run_int_opt_t opts[] = {
      {"rounds", &o->rounds, 1, MAX_ROUNDS},       {"conns", &o->conns, 1, 200000},
      {"handshakes", &o->handshakes, 1, 200000},   {"subs", &o->subs, 1, 100000},
      {"single", &o->single, 1, 100000},           {"burst", &o->burst, 1, 100000},
      {"bursts", &o->bursts, 1, 100000},           {"big-burst", &o->big_burst, 1, 100000},
      {"steady", &o->steady, 1, 1000000},          {"steady-rate", &o->steady_rate, 1, 100000},
      {"steady-subs", &o->steady_subs, 1, 100000}, {"server-cpu", &o->server_cpu, 0, 4095},
      {"client-cpu", &o->client_cpu, -1, 4095},    {"timeout", &o->timeout_s, 1, 86400},
  };
  int e = run_parse_int_options(CMD, nrest, rest, opts, CV_ARRAY_SIZE(opts), usage);
  free(rest);
  if (e > 0) *help = 1;
  if (e != 0) return e > 0 ? 0 : -1;
  o->npeers = 0;
  char list[256];
  snprintf(list, sizeof list, "%s", peers);
  for (char *save = NULL, *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
    int k = 0;
    while (k < P_COUNT && strcmp(w, peer_name[k]) != 0) k++;
    if (k == P_COUNT || o->npeers == P_COUNT) {
      fprintf(stderr,
              CMD ": unknown peer \"%s\" in --peers (converger, uws, ws, nats, mosquitto)\n", w);
      return -1;
    }
    o->peer[o->npeers++] = k;
  }
  if (o->npeers == 0) {
    fprintf(stderr, CMD ": --peers names none\n");
    return -1;
  }
  return 0;
}

static void fmt(char *out, size_t cap, int f, double v) {
  if (isnan(v))
    snprintf(out, cap, "-");
  else if (f == F_B20 || f == F_B200)
    snprintf(out, cap, "%.0f", v);
  else if (f == F_RSS)
    snprintf(out, cap, "%.0f", v);
  else
    snprintf(out, cap, "%.2f", v);
}

int bench_peers_main(int argc, char **argv) {
  opts_t o = {.rounds = 3,
              .conns = 10000,
              .handshakes = 5000,
              .subs = 5000,
              .single = 200,
              .burst = 20,
              .bursts = 20,
              .big_burst = 200,
              .steady = 5000,
              .steady_rate = 1000,
              .steady_subs = 20,
              .server_cpu = 0,
              .client_cpu = 1,
              .timeout_s = 120,
              .peers_dir = CONVERGER_PEERS_DIR_DEFAULT};
  int help = 0;
  if (parse_opts(argc, argv, &o, &help) != 0) return 2;
  if (help) return 0;
  run_raise_nofile();
  if (o.client_cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)o.client_cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
      fprintf(stderr, CMD ": cannot pin to CPU %lld: %s\n", o.client_cpu, strerror(errno));
  }
  struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  signal(SIGPIPE, SIG_IGN);

  static double fig[MAX_ROUNDS][P_COUNT][F_COUNT];
  FILE *json = o.out ? fopen(o.out, "w") : NULL;
  if (o.out && !json) {
    fprintf(stderr, CMD ": cannot write %s: %s\n", o.out, strerror(errno));
    return 1;
  }
  printf(CMD ": %lld round(s); %lld idle, %lld handshakes, %lld subscribers; %lld single, %lld "
             "bursts of %lld, one of %lld; %lld at %lld/s to %lld subscribers; server on CPU "
             "%lld, client on CPU %lld\n",
         o.rounds, o.conns, o.handshakes, o.subs, o.single, o.bursts, o.burst, o.big_burst,
         o.steady, o.steady_rate, o.steady_subs, o.server_cpu, o.client_cpu);
  int status = 0;
  uv_loop_t loop;
  uv_loop_init(&loop);
  for (long long round = 0; round < o.rounds && !status; round++)
    for (size_t k = 0; k < o.npeers && !status; k++) {
      bench_t *b = calloc(1, sizeof *b);
      run_t r = {
          .o = &o, .peer = o.peer[k], .b = b, .loop = &loop, .rng = (uint32_t)(run_now_ns() | 1)};
      if (!b) return 1;
      b->timeout_s = (int)o.timeout_s;
      b->node_cpu = -1;
      b->phase = "setup";
      jitter_seed_random(&b->rng);
      uv_loop_init(&b->loop);
      b->loop_ready = 1;
      uv_timer_init(&b->loop, &b->watch);
      uv_timer_init(&loop, &r.watch);
      r.watch.data = &r;
      uv_timer_init(&loop, &r.pace);
      r.pace.data = &r;
      int e = one(&r, fig[round][r.peer]);
      if (r.c) set_close(&r);
      server_stop(&r);
      uv_close((uv_handle_t *)&r.watch, NULL);
      uv_close((uv_handle_t *)&r.pace, NULL);
      uv_run(&loop, UV_RUN_NOWAIT);
      uv_close((uv_handle_t *)&b->watch, NULL);
      uv_run(&b->loop, UV_RUN_DEFAULT);
      uv_loop_close(&b->loop);
      free(b);
      free(r.count), free(r.pub_ns), free(r.done_ns);
      if (e != 0) {
        fprintf(stderr, CMD ": round %lld, %s: %s\n", round + 1, peer_name[r.peer], r.err);
        status = 1;
        break;
      }
      double *v = fig[round][r.peer];
      printf("round %lld, %s: %.0f B/conn, %.2f us/handshake, %.2f us/delivery (one in flight), "
             "fan-out p50 %.2f ms p99 %.2f ms, %.0f deliveries/s (bursts of %lld), %.0f (burst of "
             "%lld), peak RSS %ld kB over %ld kB at rest (%.2fx), steady fan-out p50 %.2f ms p99 "
             "%.2f ms (publisher at most %.2f ms behind its schedule)\n",
             round + 1, peer_name[r.peer], v[F_RSS], v[F_HS], v[F_CPU1], v[F_LAT50], v[F_LAT99],
             v[F_B20], o.burst, v[F_B200], o.big_burst, r.peak_kb, r.rest_kb, v[F_PEAK], v[F_ST50],
             v[F_ST99], (double)r.pace_late_ns / 1e6);
      fflush(stdout);
      if (json) {
        fprintf(json, "{\"round\":%lld,\"peer\":\"%s\"", round + 1, peer_name[r.peer]);
        static const char *const key[F_COUNT] = {
            "rssPerConn",          "cpuPerHandshakeUs",     "cpuPerDeliveryUs", "fanoutP50Ms",
            "fanoutP99Ms",         "steadyP50Ms",           "steadyP99Ms",      "peakOverRestRss",
            "burstDeliveriesPerS", "bigBurstDeliveriesPerS"};
        for (int f = 0; f < F_COUNT; f++) /* a figure left out (the peak RSS) is null */
          if (isnan(v[f]))
            fprintf(json, ",\"%s\":null", key[f]);
          else
            fprintf(json, ",\"%s\":%.3f", key[f], v[f]);
        fprintf(json, ",\"restRssKb\":%ld,\"peakRssKb\":%ld,\"steadyPublisherLateMs\":%.3f}\n",
                r.rest_kb, r.peak_kb, (double)r.pace_late_ns / 1e6);
      }
    }
  uv_loop_close(&loop);
  if (json) fclose(json);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  if (status) return status;

  /* medians, min-max, ratio to converger's median */
  printf("\n| figure |");
  for (size_t k = 0; k < o.npeers; k++) printf(" %s |", peer_name[o.peer[k]]);
  printf("\n| --- |");
  for (size_t k = 0; k < o.npeers; k++) printf(" ---: |");
  printf("\n");
  for (int f = 0; f < F_COUNT; f++) {
    printf("| %s |", fig_name[f]);
    double conv = NAN, v[MAX_ROUNDS];
    for (size_t k = 0; k < o.npeers; k++)
      if (o.peer[k] == P_CONVERGER) {
        for (long long i = 0; i < o.rounds; i++) v[i] = fig[i][P_CONVERGER][f];
        conv = run_median(v, (size_t)o.rounds);
      }
    for (size_t k = 0; k < o.npeers; k++) {
      for (long long i = 0; i < o.rounds; i++) v[i] = fig[i][o.peer[k]][f];
      double med = run_median(v, (size_t)o.rounds);
      double lo = v[0], hi = v[0];
      for (long long i = 1; i < o.rounds; i++) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
      char a[32], l[32], h[32];
      fmt(a, sizeof a, f, med), fmt(l, sizeof l, f, lo), fmt(h, sizeof h, f, hi);
      if (o.rounds > 1)
        printf(" %s (%s–%s)", a, l, h);
      else
        printf(" %s", a);
      if (o.peer[k] != P_CONVERGER && !isnan(conv) && conv > 0) printf(" ×%.2f", med / conv);
      printf(" |");
    }
    printf("\n");
  }
  printf("\nMedians of the rounds, min–max in brackets; × is the peer's median over "
         "converger's (lower is better in the first %d rows, higher in the last %d).\n",
         F_LOWER_BETTER, F_COUNT - F_LOWER_BETTER);
  return 0;
}
