/*
 * tail.c: `converger tail`, a subscriber on the client library. Prints each
 * message once, in order, as the JSON line the node sent; reconnects for
 * ever with the library's backoff; says every state change on stderr.
 * Main thread only.
 *
 * Output: each line goes to fd 1 with write(2), all of it or an error; a
 * message counts as printed only once its whole line is written. A reader
 * that goes away (EPIPE; SIGPIPE is ignored) ends tail with 0, any other
 * write error with 1. A reader can also go away while there is nothing to
 * write (`tail | head -3` on a quiet conversation): a timer polls fd 1 for
 * POLLERR/POLLHUP, which a pipe without readers reports. (uv_poll would set
 * O_NONBLOCK on a file description tail shares with its parent.)
 */
#include "cli/tail.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "cli/args.h"
#include "converger/client.h"

#define MAX_URLS        16
#define STDOUT_WATCH_MS 250 /* how often fd 1 is checked for a reader that went away */
#define TOKEN_MAX       8192

static void usage(FILE *out) {
  fprintf(out,
          "usage: converger tail --url WS_URL [--url WS_URL ...] (--token JWT | --token-cmd CMD)\n"
          "                      [--conv C ...] [--watermark N] [--commands] [--backoff STRATEGY]\n"
          "                      [--presence-events users|clients] [--max-messages N] [--tls-ca "
          "PATH]\n\n"
          "Subscribes to the conversations and prints each message once and in order, one JSON\n"
          "line per message (the node's msg frame), on stdout. Reconnects for ever: after a\n"
          "failure to a random other --url, after a backoff (decorrelated jitter, 250 ms to\n"
          "10 s) and never before the node's retry hint; migrates on drain. State changes go\n"
          "to stderr. SIGINT or SIGTERM ends it (exit 0); a refused token ends it (exit 1).\n"
          "When the reader of stdout goes away (a closed pipe) it ends with 0; when a write\n"
          "to stdout fails otherwise (a full disk) it says why and ends with 1.\n\n"
          "  --url WS_URL        ws://host:port/v1/ws or wss://host/v1/ws (TLS, the server's\n"
          "                      certificate and name verified) of a node; repeat for several\n"
          "  --tls-ca PATH       a PEM file (or a hashed directory) of the CAs to trust for\n"
          "                      wss:// (default: the system's)\n"
          "  --token JWT         a client token (or the environment variable CONVERGER_TOKEN)\n"
          "  --token-cmd CMD     a shell command that prints a fresh token for the same user;\n"
          "                      run at the start without --token, at about 80 %% of each\n"
          "                      token's lifetime (a refresh), and after the node closed with\n"
          "                      token_expired; a failure is retried with backoff\n"
          "  --conv C            a conversation id; repeat for several (none: subscribe later\n"
          "                      with --commands)\n"
          "  --watermark N       the last seq already seen; default: none (start at the head);\n"
          "                      0 prints the whole history\n"
          "  --epoch E           the epoch that watermark is in (as a msg frame's \"epoch\");\n"
          "                      with it, a resume into a restored store is told to reset\n"
          "  --backoff S         decorrelated (default), full, equal, exponential, additive,\n"
          "                      proportional\n"
          "  --client-id ID      this client's id in every hello (default: a random one,\n"
          "                      kept across reconnects)\n"
          "  --commands          read commands from stdin, one a line: \"subscribe C [N]\" (from\n"
          "                      watermark N; default the head), \"unsubscribe C\", \"refresh\"\n"
          "                      (a new token from --token-cmd now), \"refresh JWT\"\n"
          "  --presence-events E users or clients: say on stderr who joins and leaves the\n"
          "                      conversations whose channel has presence (docs/protocol.md\n"
          "                      4.9); signals (typing indicators) are said on stderr always\n"
          "  --max-messages N    exit 0 after N messages (default: never)\n");
}

typedef struct {
  uv_loop_t loop;
  uv_signal_t sigint, sigterm;
  uv_timer_t stdout_watch;
  cvg_client_t *client;
  long long max_messages, printed;
  int exit_code;
  int ending;
  const char *token_cmd; /* --token-cmd, or NULL */
  int commands;          /* --commands: stdin is read */
  union {
    uv_pipe_t pipe;
    uv_tty_t tty;
  } in; /* stdin, with --commands: a terminal or a pipe */
  char line[4096];
  size_t line_len;
} tail_t;

/* Run --token-cmd through /bin/sh and take the first line of its output
 * as the token. 0, or -1 with the reason on stderr. Blocks the loop for as
 * long as the command runs (a local signer or a cached token: quick). */
static int run_token_cmd(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  if (!p) {
    fprintf(stderr, "converger tail: --token-cmd: %s\n", strerror(errno));
    return -1;
  }
  out[0] = '\0';
  int got = fgets(out, (int)cap, p) != NULL;
  int st = pclose(p);
  out[strcspn(out, "\r\n")] = '\0';
  if (!got || !out[0] || st != 0) {
    fprintf(stderr, "converger tail: --token-cmd printed no token (exit status %d)\n",
            WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return -1;
  }
  return 0;
}

/* The client's token callback (cvg_token_cb). */
static int token_cb(void *ud, const char *why, char *out, size_t cap) {
  tail_t *t = ud;
  int r = run_token_cmd(t->token_cmd, out, cap);
  fprintf(stderr, "converger tail: token (%s): %s\n", why,
          r == 0 ? "new one from --token-cmd" : "none; trying again later");
  return r;
}

static void on_closed(void *ud) { (void)ud; }

static void end(tail_t *t, int code) {
  if (t->ending) return;
  t->ending = 1;
  t->exit_code = code;
  cvg_stats_t st;
  cvg_client_stats(t->client, &st);
  fprintf(stderr,
          "converger tail: %lld message(s); attempts %llu, welcomes %llu, duplicates dropped "
          "%llu, gaps filled %llu, resets %llu, unavailable %llu, bad frames %llu, offline %lld "
          "ms\n",
          t->printed, (unsigned long long)st.attempts, (unsigned long long)st.welcomes,
          (unsigned long long)st.duplicates, (unsigned long long)st.gaps_filled,
          (unsigned long long)st.resets, (unsigned long long)st.unavailable,
          (unsigned long long)st.bad_frames, (long long)st.offline_ms);
  cvg_client_close(t->client, on_closed, NULL);
  uv_close((uv_handle_t *)&t->sigint, NULL);
  uv_close((uv_handle_t *)&t->sigterm, NULL);
  uv_close((uv_handle_t *)&t->stdout_watch, NULL);
  if (t->commands) {
    t->commands = 0;
    uv_close((uv_handle_t *)&t->in, NULL);
  }
}

/* The reader of stdout is gone: nothing more can be printed, and that is
 * how a pipeline such as `tail | head -3` ends tail. */
static void reader_gone(tail_t *t) {
  if (t->ending) return;
  fprintf(stderr, "converger tail: the reader of stdout went away, closing\n");
  end(t, 0);
}

/* Write data and a newline to fd 1, retrying short writes and EINTR and
 * waiting out EAGAIN (a non-blocking stdout). Returns 0 once all of it is
 * written, else a negative errno (-EPIPE: no reader). */
static int write_line(const char *data, size_t len) {
  static const char nl[] = "\n";
  struct iovec iov[2] = {{(void *)data, len}, {(void *)nl, 1}}, *v = iov;
  int n = 2;
  while (n > 0) {
    ssize_t w = writev(STDOUT_FILENO, v, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
      struct pollfd p = {.fd = STDOUT_FILENO, .events = POLLOUT};
      if (poll(&p, 1, -1) < 0 && errno != EINTR) return -errno;
      continue;
    }
    for (; n > 0 && (size_t)w >= v->iov_len; v++, n--) w -= (ssize_t)v->iov_len;
    if (n > 0) {
      v->iov_base = (char *)v->iov_base + w;
      v->iov_len -= (size_t)w;
    }
  }
  return 0;
}

static void stdout_watch_cb(uv_timer_t *h) {
  struct pollfd p = {.fd = STDOUT_FILENO, .events = 0};
  if (poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP))) reader_gone(h->data);
}

static void on_message(void *ud, const cvg_message_t *m) {
  tail_t *t = ud;
  if (t->ending) return;
  int r = write_line(m->frame, m->frame_len);
  if (r == -EPIPE) {
    reader_gone(t);
    return;
  }
  if (r != 0) {
    fprintf(stderr, "converger tail: cannot write to stdout: %s; %s seq %lld is not printed\n",
            strerror(-r), m->conv, (long long)m->seq);
    end(t, 1);
    return;
  }
  if (++t->printed == t->max_messages) end(t, 0);
}

static void on_state(void *ud, cvg_state_t s, const char *detail) {
  tail_t *t = ud;
  fprintf(stderr, "converger tail: %s: %s\n", cvg_state_name(s), detail);
  if (s == CVG_STATE_FAILED) end(t, 1);
}

static void on_error(void *ud, const char *code, const char *message, const char *conv) {
  fprintf(stderr, "converger tail: server error %s%s%s: %s\n", code, conv ? " on " : "",
          conv ? conv : "", message);
}

static void on_reset(void *ud, const char *conv, int64_t old_watermark, const char *old_epoch,
                     int64_t head, const char *epoch) {
  (void)ud;
  fprintf(stderr,
          "converger tail: reset on %s: watermark %lld%s%s%s is not in the node's history (head "
          "%lld, epoch %s); messages after %lld follow\n",
          conv, (long long)old_watermark, old_epoch[0] ? " (epoch " : "", old_epoch,
          old_epoch[0] ? ")" : "", (long long)head, epoch[0] ? epoch : "unknown", (long long)head);
}

static void on_unsubscribed(void *ud, const char *conv) {
  (void)ud;
  fprintf(stderr, "converger tail: the node ended the subscription of %s\n", conv);
}

/* Protocol 1.2: presence and signals are not messages: stderr, not stdout. */
static void on_presence(void *ud, const char *conv, int join, const char *user,
                        const char *client) {
  (void)ud;
  fprintf(stderr, "converger tail: %s: %s %s (client %s)\n", conv, user, join ? "joined" : "left",
          client);
}

static void on_signal_frame(void *ud, const char *conv, const char *sender, int64_t ts_ms,
                            const char *body) {
  (void)ud;
  (void)ts_ms;
  fprintf(stderr, "converger tail: %s: signal from %s: %s\n", conv, sender, body);
}

static void on_synced(void *ud, const char *conv, int64_t head) {
  tail_t *t = ud;
  if (t->commands) fprintf(stderr, "converger tail: %s: synced at %lld\n", conv, (long long)head);
}

/* One --commands line. */
static void command(tail_t *t, char *line) {
  char *verb = strtok(line, " \t"), *a = verb ? strtok(NULL, " \t") : NULL;
  char *b = a ? strtok(NULL, " \t") : NULL;
  int r = 0;
  if (!verb) return;
  if (strcmp(verb, "subscribe") == 0 && a) {
    long long wm = CVG_WATERMARK_NONE;
    if (b && cli_parse_ll(b, 0, INT64_MAX, &wm) != 0) {
      fprintf(stderr, "converger tail: subscribe %s: the watermark must be an integer >= 0\n", a);
      return;
    }
    r = cvg_subscribe(t->client, a, wm, NULL);
    if (r == 0) fprintf(stderr, "converger tail: subscribing to %s\n", a);
  } else if (strcmp(verb, "unsubscribe") == 0 && a) {
    r = cvg_unsubscribe(t->client, a);
    if (r == 0) fprintf(stderr, "converger tail: unsubscribed from %s\n", a);
  } else if (strcmp(verb, "refresh") == 0) {
    char tok[TOKEN_MAX];
    if (!a && !t->token_cmd) {
      fprintf(stderr, "converger tail: refresh: give a token, or start with --token-cmd\n");
      return;
    }
    if (!a && run_token_cmd(t->token_cmd, tok, sizeof tok) != 0) return;
    r = cvg_client_set_token(t->client, a ? a : tok);
    if (r == 0)
      fprintf(stderr, "converger tail: new token sent (refresh); the next refresh is due at about "
                      "80 %% of its lifetime\n");
  } else {
    fprintf(stderr, "converger tail: commands: subscribe C [N], unsubscribe C, refresh [JWT]\n");
    return;
  }
  if (r != 0)
    fprintf(stderr, "converger tail: %s %s: %s\n", verb, a ? a : "",
            r == CVG_ENOENT   ? "not subscribed"
            : r == CVG_EBUSY  ? "100 subscriptions already"
            : r == CVG_EINVAL ? "not a conversation id"
                              : "not possible now");
}

static void in_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  tail_t *t = h->data;
  (void)hint;
  *buf = uv_buf_init(t->line + t->line_len, (unsigned)(sizeof t->line - 1 - t->line_len));
}

static void in_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  tail_t *t = st->data;
  (void)buf;
  if (n < 0) { /* end of stdin: no more commands; tail goes on */
    uv_close((uv_handle_t *)&t->in, NULL);
    t->commands = 0;
    return;
  }
  t->line_len += (size_t)n;
  t->line[t->line_len] = '\0';
  char *nl;
  while ((nl = strchr(t->line, '\n'))) {
    *nl = '\0';
    if (!t->ending) command(t, t->line);
    size_t rest = t->line_len - (size_t)(nl + 1 - t->line);
    memmove(t->line, nl + 1, rest + 1);
    t->line_len = rest;
  }
  if (t->line_len == sizeof t->line - 1) t->line_len = 0; /* a line too long: dropped */
}

static void on_signal(uv_signal_t *s, int signum) {
  tail_t *t = s->data;
  fprintf(stderr, "converger tail: %s, closing\n", signum == SIGINT ? "SIGINT" : "SIGTERM");
  end(t, 0);
}

int tail_main(int argc, char **argv) {
  const char *urls[MAX_URLS];
  size_t nurls = 0;
  cvg_sub_t subs[100];
  size_t nsubs = 0;
  const char *token = getenv("CONVERGER_TOKEN");
  const char *token_cmd = NULL;
  int commands = 0;
  char first_token[TOKEN_MAX];
  const char *epoch = NULL;
  const char *epochs[100];
  long long watermark = CVG_WATERMARK_NONE, max_messages = -1;
  cvg_options_t o;
  cvg_options_init(&o);
  for (int i = 0; i < argc; i++) {
    const char *v, *flag = argv[i];
    int missing = 0;
    if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(flag, "--commands") == 0) {
      commands = 1;
      continue;
    }
    if ((v = cli_flag_value(argc, argv, &i, "--url", &missing))) {
      if (nurls == MAX_URLS) return cli_usage_error("tail", "at most 16 --url");
      urls[nurls++] = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--client-id", &missing))) {
      o.client_id = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--tls-ca", &missing))) {
      struct stat st;
      if (stat(v, &st) == 0 && S_ISDIR(st.st_mode))
        o.tls_ca_dir = v;
      else
        o.tls_ca_file = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--presence-events", &missing))) {
      if (strcmp(v, "users") == 0)
        o.presence_events = CVG_PRESENCE_USERS;
      else if (strcmp(v, "clients") == 0)
        o.presence_events = CVG_PRESENCE_CLIENTS;
      else
        return cli_usage_error("tail", "--presence-events is users or clients");
    } else if ((v = cli_flag_value(argc, argv, &i, "--token-cmd", &missing))) {
      token_cmd = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--token", &missing))) {
      token = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--conv", &missing))) {
      if (nsubs == 100) return cli_usage_error("tail", "at most 100 --conv");
      subs[nsubs++].conv = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--watermark", &missing))) {
      if (cli_parse_ll(v, 0, INT64_MAX, &watermark) != 0)
        return cli_usage_error("tail", "--watermark must be an integer >= 0");
    } else if ((v = cli_flag_value(argc, argv, &i, "--epoch", &missing))) {
      epoch = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--max-messages", &missing))) {
      if (cli_parse_ll(v, 1, INT64_MAX, &max_messages) != 0)
        return cli_usage_error("tail", "--max-messages must be an integer >= 1");
    } else if ((v = cli_flag_value(argc, argv, &i, "--backoff", &missing))) {
      if (cvg_backoff_parse(v, &o.backoff) != 0)
        return cli_usage_error("tail", "--backoff: decorrelated, full, equal, exponential, "
                                       "additive or proportional");
    } else if (!missing) {
      fprintf(stderr, "converger tail: unknown argument '%s' (see --help)\n", flag);
      return 2;
    }
    if (missing) {
      fprintf(stderr, "converger tail: %s needs a value\n", flag);
      return 2;
    }
  }
  if (nurls == 0) return cli_usage_error("tail", "--url is required");
  if ((!token || !*token) && token_cmd) {
    if (run_token_cmd(token_cmd, first_token, sizeof first_token) != 0) return 1;
    token = first_token;
  }
  if (!token || !*token)
    return cli_usage_error("tail", "--token, --token-cmd or CONVERGER_TOKEN is required");
  if (nsubs == 0 && !commands) return cli_usage_error("tail", "--conv is required (or --commands)");
  if (epoch && watermark == CVG_WATERMARK_NONE)
    return cli_usage_error("tail", "--epoch needs --watermark");
  for (size_t i = 0; i < nsubs; i++) {
    subs[i].watermark = watermark;
    epochs[i] = epoch;
  }

  tail_t t = {.max_messages = max_messages, .token_cmd = token_cmd, .commands = commands};
  o.urls = urls;
  o.nurls = nurls;
  o.token = token;
  o.subs = subs;
  o.nsubs = nsubs;
  o.epochs = epochs;
  o.client_name = "converger-tail";
  o.cb.on_message = on_message;
  o.cb.on_state = on_state;
  o.cb.on_error = on_error;
  o.cb.on_reset = on_reset;
  o.cb.on_unsubscribed = on_unsubscribed;
  o.cb.on_synced = on_synced;
  o.on_presence = on_presence;
  o.on_signal = on_signal_frame;
  if (token_cmd) o.token_cb = token_cb;
  o.userdata = &t;
  char err[300];
  uv_loop_init(&t.loop);
  if (cvg_client_new(&t.loop, &o, &t.client, err, sizeof err) != 0) {
    fprintf(stderr, "converger tail: %s\n", err);
    uv_loop_close(&t.loop);
    return 2;
  }
  uv_signal_init(&t.loop, &t.sigint);
  uv_signal_init(&t.loop, &t.sigterm);
  t.sigint.data = t.sigterm.data = &t;
  uv_signal_start(&t.sigint, on_signal, SIGINT);
  uv_signal_start(&t.sigterm, on_signal, SIGTERM);
  signal(SIGPIPE, SIG_IGN); /* a closed stdout is EPIPE from write_line */
  uv_timer_init(&t.loop, &t.stdout_watch);
  t.stdout_watch.data = &t;
  uv_timer_start(&t.stdout_watch, stdout_watch_cb, STDOUT_WATCH_MS, STDOUT_WATCH_MS);
  if (commands) {
    int r = uv_guess_handle(STDIN_FILENO) == UV_TTY
                ? uv_tty_init(&t.loop, &t.in.tty, STDIN_FILENO, 1)
                : uv_pipe_init(&t.loop, &t.in.pipe, 0) || uv_pipe_open(&t.in.pipe, STDIN_FILENO);
    t.in.pipe.data = &t;
    if (r != 0 || uv_read_start((uv_stream_t *)&t.in, in_alloc, in_read) != 0) {
      fprintf(stderr, "converger tail: --commands: cannot read stdin\n");
      uv_close((uv_handle_t *)&t.in, NULL);
      t.commands = 0;
    }
  }
  cvg_client_start(t.client);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&t.loop) != 0) fprintf(stderr, "converger tail: handles left open\n");
  return t.exit_code;
}
