/*
 * roll.c: `converger roll` and `converger balance` (cli/roll.h).
 *
 * One sample a second drives everything: GET /admin/status of every node
 * (cli/fleet.h) becomes the policy's input (cluster/rollpolicy.h), whose
 * verdict says whether a batch may start (GO), must wait (PAUSE) or
 * whether the restart stops (ABORT). A batch is: POST /admin/drain to each
 * of its nodes, wait for each to leave (it stops answering, or answers as
 * a new process), run --restart-cmd if given (without a shell, its exit
 * status checked), then wait for /readyz. On ABORT nothing more starts;
 * the batch under way finishes (its nodes are brought back, not left
 * down). Then the balance: shed moves (POST /admin/shed, make-before-break)
 * from the nodes above the mean to the others, until none is more than the
 * tolerance above it.
 */
#include "cli/roll.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/fleet.h"
#include "cluster/rollpolicy.h"
#include "common/util.h"

extern char **environ;

#define ROLL_API_KEY_ENV "CONVERGER_API_KEY"
#define ROLL_GRACE_MS    2000 /* past a drain or shed window: the last moves (DRAIN_GRACE_MS) */
#define ROLL_RESTART_EST 10   /* s: a restart and its readiness, for the plan's estimate */

typedef struct {
  const char *url, *nodes, *api_key, *restart_cmd, *out;
  long long batch, interval_s, settle_s, ready_timeout_s, leave_timeout_s, abort_s;
  long long max_util, pause_cpu, abort_cpu, abort_drop, tolerance;
  long long balance_window_ms, balance_rounds;
  int dry_run, balance_only, no_balance;
} opts_t;

typedef struct {
  opts_t o;
  fleet_t f;
  rollpolicy_t rp;
  rollpolicy_node_t *pn;
  size_t *batch_of, nbatches;
  int cur; /* the batch under way, -1: none */
  int tty;
  uint64_t t0, next_sample;
  int aborted; /* start nothing more */
  char why[400];
  int64_t start_total, fewest, last_total;
  int pauses, pausing;
  uint64_t paused_ms;
  uint64_t *batch_ms;
  size_t batches_done;
  double spread_before, spread_after;
  int balanced, sheds;
  int *shedding; /* per node: told to shed in the current balance round */
  int interrupt_seen, policy_seen;
} roll_t;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
  if (interrupted) _exit(130); /* a second Ctrl-C: now */
  interrupted = 1;
}

static void usage(FILE *out, int balance_only) {
  const char *cmd = balance_only ? "balance" : "roll";
  fprintf(out, "usage: converger %s (--url URL | --nodes URL,...) [--api-key KEY] [options]\n\n",
          cmd);
  if (balance_only)
    fprintf(out, "Moves clients from the nodes above the fleet's mean to those below it, with\n"
                 "make-before-break shed moves, until none is more than --balance-tolerance\n"
                 "above it (a scale-out: new nodes join empty). The pause and abort thresholds\n"
                 "of converger roll apply.\n\n");
  else
    fprintf(out, "Restarts a fleet of converger nodes in batches without a reconnect storm (the\n"
                 "reconnect-storm post-mortem's controller, docs/background.md): refuses to\n"
                 "start without headroom, drains each batch (clients move make-before-break),\n"
                 "restarts it, waits for /readyz, pauses while a survivor is hot, aborts on the\n"
                 "connections-drop alarm, a survivor hot for too long, a node that does not come\n"
                 "back, or Ctrl-C; then balances the fleet. Prints the plan first.\n\n");
  fprintf(out, "  --url URL              the admin URL (http://host:9090) of any node: the fleet\n"
               "                         is its GET /admin/cluster, each node at its adminUrl\n"
               "  --nodes URL,...        or the nodes' own http:// admin URLs (one of --url and\n"
               "                         --nodes is required; no default)\n"
               "  --api-key KEY          the nodes' API key (default: $" ROLL_API_KEY_ENV ")\n");
  if (!balance_only)
    fprintf(out,
            "  --batch N              nodes restarted at once, in the fleet's order\n"
            "                         (default 1)\n"
            "  --interval-s S         least time between two batch starts (default 0)\n"
            "  --settle-s S           wait after a batch is ready again (default 10)\n"
            "  --restart-cmd CMD      run for each drained node once it left, without a shell;\n"
            "                         {id} and {url} are replaced (e.g. \"systemctl restart\n"
            "                         converger@{id}\"); a non-zero exit aborts. Default: none,\n"
            "                         the supervisor brings it back (Kubernetes, systemd)\n"
            "  --leave-timeout-s S    longest wait for a drained node to leave (default: its\n"
            "                         CONVERGER_DRAIN_SHUTDOWN_MS + 30 s)\n"
            "  --ready-timeout-s S    longest wait for /readyz after it left (default 120)\n"
            "  --max-utilisation P    refuse to start above P %% of the fleet's capacity (or CPU\n"
            "                         without CONVERGER_CAPACITY_CONNECTIONS) (default 65)\n"
            "  --dry-run              stop after the plan and headroom check (default off)\n"
            "  --no-balance           skip the balance after the last batch (default off)\n"
            "  --balance-only         only balance, as converger balance (default off)\n");
  fprintf(out, "  --pause-cpu P          no batch starts while a survivor's loop is above P %%\n"
               "                         (default 75; 0: never pause)\n"
               "  --abort-cpu P          abort when a survivor stays above P %% ... (default 80;\n"
               "                         0: no CPU abort)\n"
               "  --abort-s S            ... for S seconds (default 30)\n"
               "  --abort-drop P         abort when total connections fall more than P %% within\n"
               "                         60 s (default 5; 0: no drop alarm)\n"
               "  --balance-tolerance P  balanced: no node more than P %% above the mean (default\n"
               "                         10; 0: every node at the mean)\n"
               "  --balance-window-ms MS the window of each shed move (default 10000)\n"
               "  --balance-rounds N     shed rounds at most (default 4; 0: only check)\n"
               "  --out DIR              write DIR/summary.json (default none)\n");
  if (balance_only)
    fprintf(out, "  --dry-run              print the fleet, then exit (default off)\n");
  fprintf(out, "\nExit status: 0 done, 1 error, 2 usage, 3 refused (no headroom), 4 aborted (an\n"
               "alarm, a node that did not leave or come back, Ctrl-C, or not balanced after\n"
               "--balance-rounds). A second Ctrl-C exits at once with 130.\n");
}

static int parse(int argc, char **argv, opts_t *o) {
  const char *cmd = o->balance_only ? "balance" : "roll";
  *o = (opts_t){.batch = 1,
                .settle_s = 10,
                .ready_timeout_s = 120,
                .leave_timeout_s = -1,
                .abort_s = 30,
                .max_util = 65,
                .pause_cpu = 75,
                .abort_cpu = 80,
                .abort_drop = 5,
                .tolerance = 10,
                .balance_window_ms = 10000,
                .balance_rounds = 4,
                .balance_only = o->balance_only,
                .api_key = getenv(ROLL_API_KEY_ENV)};
  struct {
    const char *name;
    long long *v, min, max;
  } ints[] = {{"--batch", &o->batch, 1, 10000},
              {"--interval-s", &o->interval_s, 0, 86400},
              {"--settle-s", &o->settle_s, 0, 86400},
              {"--ready-timeout-s", &o->ready_timeout_s, 1, 86400},
              {"--leave-timeout-s", &o->leave_timeout_s, 1, 86400},
              {"--abort-s", &o->abort_s, 1, 86400},
              {"--max-utilisation", &o->max_util, 1, 100},
              {"--pause-cpu", &o->pause_cpu, 0, 100},
              {"--abort-cpu", &o->abort_cpu, 0, 100},
              {"--abort-drop", &o->abort_drop, 0, 100},
              {"--balance-tolerance", &o->tolerance, 0, 1000},
              {"--balance-window-ms", &o->balance_window_ms, 0, 3600000},
              {"--balance-rounds", &o->balance_rounds, 0, 100}};
  for (int i = 0; i < argc; i++) {
    int missing = 0, done = 0;
    const char *v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout, o->balance_only);
      return 1;
    }
    if (strcmp(argv[i], "--dry-run") == 0) o->dry_run = done = 1;
    if (strcmp(argv[i], "--no-balance") == 0) o->no_balance = done = 1;
    if (strcmp(argv[i], "--balance-only") == 0) o->balance_only = done = 1;
    if (done) continue;
    if ((v = cli_flag_value(argc, argv, &i, "--url", &missing)))
      o->url = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--nodes", &missing)))
      o->nodes = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--api-key", &missing)))
      o->api_key = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--restart-cmd", &missing)))
      o->restart_cmd = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--out", &missing)))
      o->out = v;
    else {
      for (size_t k = 0; k < CV_ARRAY_SIZE(ints) && !done && !missing; k++)
        if ((v = cli_flag_value(argc, argv, &i, ints[k].name, &missing))) {
          if (cli_parse_ll(v, ints[k].min, ints[k].max, ints[k].v) != 0) {
            char m[160];
            snprintf(m, sizeof m, "%s must be an integer from %lld to %lld", ints[k].name,
                     ints[k].min, ints[k].max);
            return cli_usage_error(cmd, m);
          }
          done = 1;
        }
      if (!done && !missing) {
        char m[160];
        snprintf(m, sizeof m, "unknown argument \"%s\"", argv[i]);
        return cli_usage_error(cmd, m);
      }
    }
    if (missing) {
      char m[160];
      snprintf(m, sizeof m, "%s needs a value", argv[i]);
      return cli_usage_error(cmd, m);
    }
  }
  if (!o->url == !o->nodes) return cli_usage_error(cmd, "give one of --url and --nodes");
  if (!o->api_key || !*o->api_key)
    return cli_usage_error(cmd, "--api-key (or $" ROLL_API_KEY_ENV ") is required");
  return 0;
}

/* ---- the sample of each second ---------------------------------------------- */

static uint64_t elapsed_ms(const roll_t *r) { return util_mono_ms() - r->t0; }

#define ABORTF(r, ...)                                                                             \
  do {                                                                                             \
    char why_[400];                                                                                \
    snprintf(why_, sizeof why_, __VA_ARGS__);                                                      \
    abort_with(r, why_);                                                                           \
  } while (0)

/* Abort with `why`; a later reason is added to the first, not put in its
 * place. */
static void abort_with(roll_t *r, const char *why) {
  size_t n = strlen(r->why);
  if (!r->aborted || n == 0)
    snprintf(r->why, sizeof r->why, "%s", why);
  else if (n + 8 < sizeof r->why) { /* "; then " and as much of `why` as fits */
    memcpy(r->why + n, "; then ", 7);
    n += 7;
    size_t len = strlen(why), room = sizeof r->why - n - 1;
    memmove(r->why + n, why, len < room ? len : room);
    r->why[n + (len < room ? len : room)] = '\0';
  }
  r->aborted = 1;
}

static int64_t total(const roll_t *r) {
  int64_t t = 0;
  for (size_t i = 0; i < r->f.n; i++) t += r->f.v[i].up ? r->f.v[i].connections : 0;
  return t;
}

static void progress(roll_t *r, const char *phase) {
  int64_t t = total(r);
  double hot = -1;
  size_t ready = 0;
  char draining[256] = "";
  size_t dl = 0;
  for (size_t i = 0; i < r->f.n; i++) {
    const fleet_node_t *nd = &r->f.v[i];
    ready += nd->ready;
    if (r->pn[i].in_batch && r->cur >= 0) {
      if (dl < sizeof draining - 1)
        dl += (size_t)snprintf(draining + dl, sizeof draining - dl,
                               " [%s %s: told %d moved %d closed %d]", nd->id, nd->state, nd->told,
                               nd->moved, nd->closed);
    } else if (nd->up && nd->ready && nd->cpu > hot) {
      hot = nd->cpu;
    }
  }
  char busiest[32] = "n/a";
  if (hot >= 0) snprintf(busiest, sizeof busiest, "%.0f %%", hot * 100);
  fprintf(stderr, "%s%s: %s ready %zu/%zu, connections %lld (%+lld), busiest survivor %s%s%s",
          r->tty ? "\r\033[K" : "", r->o.balance_only ? "balance" : "roll", phase, ready, r->f.n,
          (long long)t, (long long)(t - r->last_total), busiest, draining, r->tty ? "" : "\n");
  fflush(stderr);
  r->last_total = t;
}

/* Wait for the next second, sample, and ask the policy. */
static rollpolicy_verdict_t step(roll_t *r, int before_batch, const char *phase) {
  uint64_t now = elapsed_ms(r);
  if (now < r->next_sample) {
    uint64_t d = r->next_sample - now;
    struct timespec ts = {(time_t)(d / 1000), (long)(d % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  r->next_sample = (elapsed_ms(r) / 1000 + 1) * 1000;
  int next = r->cur >= 0 ? r->cur : (int)r->batches_done;
  /* The nodes clients are leaving first, then the others: a client that
   * moves (make-before-break: its new connection opens before the old one
   * closes) between two reads is then counted twice, never not at all, and
   * the drop alarm sees no dip that is not there. */
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < r->f.n; i++) {
      int leaving = (r->cur >= 0 && r->batch_of[i] == (size_t)r->cur) ||
                    strcmp(r->f.v[i].state, "draining") == 0 || r->shedding[i];
      if (leaving == (pass == 0)) fleet_sample_node(&r->f, i);
    }
  for (size_t i = 0; i < r->f.n; i++) {
    const fleet_node_t *nd = &r->f.v[i];
    r->pn[i] = (rollpolicy_node_t){.name = nd->id,
                                   .up = nd->up,
                                   .ready = nd->ready,
                                   .connections = nd->connections,
                                   .capacity = nd->capacity,
                                   .cpu = nd->cpu};
  }
  /* the batch under way, or, before one, the next: not survivors */
  rollpolicy_mark_batch(r->pn, r->f.n, r->batch_of,
                        (r->cur >= 0 || before_batch) && !r->o.balance_only ? (size_t)next
                                                                            : ROLLPOLICY_NO_BATCH);
  rollpolicy_verdict_t v = rollpolicy_observe(&r->rp, elapsed_ms(r), r->pn, before_batch, 0);
  int64_t t = total(r);
  if (r->fewest < 0 || t < r->fewest) r->fewest = t;
  if (interrupted && !r->interrupt_seen) {
    r->interrupt_seen = 1;
    abort_with(r, "interrupted (SIGINT)");
  }
  if (v == ROLLPOLICY_ABORT && !r->policy_seen) {
    r->policy_seen = 1;
    abort_with(r, r->rp.why);
  }
  if (v == ROLLPOLICY_PAUSE) {
    if (!r->pausing) {
      r->pauses++;
      fprintf(stderr, "%s%s: %s\n", r->tty ? "\r\033[K" : "",
              r->o.balance_only ? "balance" : "roll", r->rp.why);
    }
    r->pausing = 1;
    r->paused_ms += 1000;
  } else {
    r->pausing = 0;
  }
  progress(r, v == ROLLPOLICY_PAUSE ? "paused;" : phase);
  return r->aborted ? ROLLPOLICY_ABORT : v;
}

/* ---- a batch ---------------------------------------------------------------- */

/* Start argv in a process group of its own, so that a Ctrl-C meant for
 * the roll (which lets the batch under way finish) does not kill it. */
static int spawn(pid_t *pid, char **argv) {
  posix_spawnattr_t a;
  posix_spawnattr_init(&a);
  posix_spawnattr_setflags(&a, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&a, 0);
  int e = posix_spawnp(pid, argv[0], NULL, &a, argv, environ);
  posix_spawnattr_destroy(&a);
  return e;
}

/* Run the restart command for node i and wait for its exit, sampling. 0,
 * or -1 with r->why set. */
static int restart_node(roll_t *r, size_t i, const char *phase) {
  char *copy = strdup(r->o.restart_cmd), *save = NULL, *argv[64];
  int argc = 0;
  char *owned[64];
  int too_long = 0;
  for (char *t = copy ? strtok_r(copy, " \t", &save) : NULL; t; t = strtok_r(NULL, " \t", &save)) {
    if (argc == 63) {
      too_long = 1;
      break;
    }
    /* {id} and {url}, anywhere in the word */
    char buf[1024];
    size_t o = 0;
    for (const char *p = t; *p;) {
      const char *rep = NULL;
      if (strncmp(p, "{id}", 4) == 0)
        rep = r->f.v[i].id, p += 4;
      else if (strncmp(p, "{url}", 5) == 0)
        rep = r->f.v[i].shown, p += 5;
      size_t add = rep ? strlen(rep) : 1;
      if (o + add >= sizeof buf) {
        too_long = 1;
        break;
      }
      if (rep)
        memcpy(buf + o, rep, add);
      else
        buf[o] = *p++;
      o += add;
    }
    buf[o] = '\0';
    if (too_long || !(owned[argc] = strdup(buf))) {
      too_long = 1;
      break;
    }
    argv[argc] = owned[argc];
    argc++;
  }
  argv[argc] = NULL;
  int no_copy = copy == NULL;
  free(copy);
  int rc = -1;
  pid_t pid;
  if (too_long || no_copy) {
    ABORTF(r, "--restart-cmd: more than 63 words, a word longer than 1023 bytes once {id} and "
              "{url} are replaced, or out of memory");
  } else if (argc == 0) {
    ABORTF(r, "--restart-cmd is empty");
  } else if ((errno = spawn(&pid, argv)) != 0) {
    ABORTF(r, "node %s did not come back: cannot run %s: %s", r->f.v[i].id, argv[0],
           strerror(errno));
  } else {
    /* the words as run, {id} and {url} replaced */
    fprintf(stderr, "%sroll: %s: running", r->tty ? "\r\033[K" : "", r->f.v[i].id);
    for (int k = 0; k < argc; k++) fprintf(stderr, " %s", argv[k]);
    fputc('\n', stderr);
    int status = 0, waited = 1;
    for (;;) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) {
        waited = 0;
        break;
      }
      step(r, 0, phase);
    }
    if (!waited)
      ABORTF(r, "node %s: waiting for %s: %s", r->f.v[i].id, argv[0], strerror(errno));
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
      rc = 0;
    else
      ABORTF(r, "node %s did not come back: %s %s %d", r->f.v[i].id, argv[0],
             WIFEXITED(status) ? "exited with status" : "was killed by signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  for (int k = 0; k < argc; k++) free(owned[k]);
  return rc;
}

/* Batch b: drain, leave, restart, ready. 0, or -1 when a node did not
 * leave or come back (r->why says which). */
static int run_batch(roll_t *r, size_t b) {
  char phase[64], err[256];
  snprintf(phase, sizeof phase, "batch %zu/%zu", b + 1, r->nbatches);
  uint64_t began = elapsed_ms(r);
  r->cur = (int)b;
  /* mine[i]: a node of this batch still being worked on; a node that
   * failed (its drain refused, it did not leave, its restart failed) stops
   * being worked on, the others of the batch are still brought back */
  int *mine = calloc(r->f.n, sizeof *mine), *left = calloc(r->f.n, sizeof *left),
      *seen = calloc(r->f.n, sizeof *seen);
  double *started = calloc(r->f.n, sizeof *started);
  int rc = 0, nmine = 0;
  uint64_t leave_ms = 0;
  for (size_t i = 0; i < r->f.n; i++) {
    started[i] = r->f.v[i].started_at;
    if (r->batch_of[i] != b) continue;
    int st = fleet_post(&r->f, i, "/admin/drain", NULL, err, sizeof err);
    if (st != 202 && st != 409) {
      ABORTF(r, "node %.100s: POST /admin/drain: %.200s", r->f.v[i].id, err);
      rc = -1;
      continue;
    }
    mine[i] = 1;
    nmine++;
    uint64_t t = r->o.leave_timeout_s > 0 ? (uint64_t)r->o.leave_timeout_s * 1000
                                          : (uint64_t)r->f.v[i].drain_shutdown_ms + 30000;
    if (t > leave_ms) leave_ms = t;
    fprintf(stderr, "%sroll: %s: draining\n", r->tty ? "\r\033[K" : "", r->f.v[i].id);
  }
  /* leave: it stops answering, or answers as a new process (another
   * start time: a supervisor may restart it between two samples) */
  while (nmine > 0) {
    step(r, 0, phase);
    int all = 1, late = elapsed_ms(r) - began > leave_ms;
    for (size_t i = 0; i < r->f.n; i++) {
      if (!mine[i] || left[i]) continue;
      const fleet_node_t *nd = &r->f.v[i];
      seen[i] |= nd->up && strcmp(nd->state, "draining") == 0;
      left[i] =
          !nd->up || nd->started_at != started[i] ||
          (seen[i] && strcmp(nd->state, "draining") != 0 && strcmp(nd->state, "stopping") != 0);
      if (!left[i] && late) {
        ABORTF(r, "node %s did not leave within %llu s", nd->id,
               (unsigned long long)(leave_ms / 1000));
        mine[i] = 0;
        rc = -1;
        continue;
      }
      all &= left[i];
    }
    if (all) break;
  }
  if (r->o.restart_cmd)
    for (size_t i = 0; i < r->f.n; i++)
      if (mine[i] && restart_node(r, i, phase) != 0) {
        mine[i] = 0; /* the others are restarted all the same */
        rc = -1;
      }
  uint64_t ready_from = elapsed_ms(r);
  for (;;) {
    int all = 1, late = elapsed_ms(r) - ready_from > (uint64_t)r->o.ready_timeout_s * 1000;
    for (size_t i = 0; i < r->f.n; i++) {
      if (!mine[i] || fleet_readyz(&r->f, i)) continue;
      if (late) {
        ABORTF(r, "node %s did not come back: no /readyz 200 within %lld s (--ready-timeout-s)",
               r->f.v[i].id, r->o.ready_timeout_s);
        mine[i] = 0;
        rc = -1;
        continue;
      }
      all = 0;
    }
    if (all) break;
    step(r, 0, phase);
  }
  r->batch_ms[b] = elapsed_ms(r) - began;
  r->batches_done = b + 1;
  fprintf(stderr, "%sroll: batch %zu/%zu %s after %.1f s\n", r->tty ? "\r\033[K" : "", b + 1,
          r->nbatches, rc == 0 ? "ready again" : "done, with a failure",
          (double)r->batch_ms[b] / 1000);
  r->cur = -1;
  free(mine);
  free(left);
  free(seen);
  free(started);
  if (rc != 0) r->aborted = 1;
  return rc;
}

/* ---- balance ---------------------------------------------------------------- */

/* max / mean of the ready nodes' connections (1: even; 0: none). */
static double spread(const roll_t *r, double *mean_out) {
  int64_t sum = 0, max = 0;
  size_t n = 0;
  for (size_t i = 0; i < r->f.n; i++)
    if (r->f.v[i].up && r->f.v[i].ready) {
      sum += r->f.v[i].connections;
      if (r->f.v[i].connections > max) max = r->f.v[i].connections;
      n++;
    }
  double mean = n ? (double)sum / (double)n : 0;
  if (mean_out) *mean_out = mean;
  return mean > 0 ? (double)max / mean : 0;
}

static void balance(roll_t *r) {
  double tol = (double)r->o.tolerance / 100.0, mean;
  step(r, 0, "balance;");
  r->spread_before = spread(r, &mean);
  for (long long round = 0; round <= r->o.balance_rounds && !r->aborted; round++) {
    double s = spread(r, &mean);
    if (s <= 1 + tol) {
      r->balanced = 1;
      break;
    }
    if (round == r->o.balance_rounds) break;
    /* the pause threshold, as before a batch */
    while (!r->aborted && step(r, 1, "balance;") == ROLLPOLICY_PAUSE) {
    }
    if (r->aborted) break;
    s = spread(r, &mean);
    for (size_t i = 0; i < r->f.n; i++) {
      r->shedding[i] = 0;
      const fleet_node_t *nd = &r->f.v[i];
      if (!nd->up || !nd->ready || (double)nd->connections <= mean * (1 + tol)) continue;
      double f = ((double)nd->connections - mean) / (double)nd->connections;
      char body[96], err[400];
      snprintf(body, sizeof body, "{\"fraction\":%.4f,\"windowMs\":%lld}", f,
               r->o.balance_window_ms);
      int st = fleet_post(&r->f, i, "/admin/shed", body, err, sizeof err);
      fprintf(stderr, "%s%s: %s: %lld connection(s), mean %.0f: shed %.1f %% over %lld ms%s%s\n",
              r->tty ? "\r\033[K" : "", r->o.balance_only ? "balance" : "roll", nd->id,
              (long long)nd->connections, mean, f * 100, r->o.balance_window_ms,
              st == 200 ? "" : ": ", st == 200 ? "" : err);
      r->sheds += st == 200;
      r->shedding[i] = st == 200;
    }
    uint64_t until = elapsed_ms(r) + (uint64_t)r->o.balance_window_ms + ROLL_GRACE_MS + 2000;
    while (elapsed_ms(r) < until && !r->aborted) step(r, 0, "balance;");
  }
  r->spread_after = spread(r, &mean);
}

/* ---- plan and summary -------------------------------------------------------- */

static void plan(roll_t *r) {
  printf("fleet: %zu node(s), %lld connection(s), utilisation %.0f %%\n", r->f.n,
         (long long)total(r), rollpolicy_fleet_utilisation(r->pn, r->f.n) * 100);
  if (r->o.balance_only) return;
  double est = 0;
  for (size_t b = 0; b < r->nbatches; b++) {
    printf("batch %zu/%zu:", b + 1, r->nbatches);
    double w = 0;
    for (size_t i = 0; i < r->f.n; i++)
      if (r->batch_of[i] == b) {
        printf(" %s (%lld connection(s))", r->f.v[i].id, (long long)r->f.v[i].connections);
        if (r->f.v[i].drain_window_ms / 1000.0 > w) w = r->f.v[i].drain_window_ms / 1000.0;
      }
    printf("\n");
    double d = w + ROLL_GRACE_MS / 1000.0 + ROLL_RESTART_EST;
    est += (d > (double)r->o.interval_s ? d : (double)r->o.interval_s) +
           (b + 1 < r->nbatches ? (double)r->o.settle_s : 0);
  }
  printf("expected duration: about %.0f s (drain window + %d s grace + ~%d s restart per batch, "
         "%lld s settle between), then the balance\n",
         est, ROLL_GRACE_MS / 1000, ROLL_RESTART_EST, r->o.settle_s);
  fflush(stdout);
}

static int summary(roll_t *r, const char *result, int status) {
  if (r->tty) fprintf(stderr, "\n");
  printf("result: %s%s%s\n", result, r->why[0] ? ": " : "", r->why);
  for (size_t b = 0; b < r->batches_done; b++)
    printf("batch %zu: %.1f s\n", b + 1, (double)r->batch_ms[b] / 1000);
  printf("connections: %lld at the start, fewest %lld, %lld at the end\n",
         (long long)r->start_total, (long long)r->fewest, (long long)total(r));
  printf("pauses: %d (%.0f s)\n", r->pauses, (double)r->paused_ms / 1000);
  if (r->spread_before > 0)
    printf("balance: spread (max/mean) %.2f before, %.2f after, %s (%d shed move(s))\n",
           r->spread_before, r->spread_after, r->balanced ? "balanced" : "not balanced", r->sheds);
  if (r->o.out) {
    json_t *batches = json_array(), *nodes = json_object();
    for (size_t b = 0; b < r->batches_done; b++)
      json_array_append_new(batches, json_real((double)r->batch_ms[b] / 1000));
    for (size_t i = 0; i < r->f.n; i++)
      json_object_set_new(nodes, r->f.v[i].id, json_integer(r->f.v[i].connections));
    json_t *js = json_pack(
        "{s:s, s:s, s:i, s:o, s:I, s:I, s:I, s:i, s:f, s:f, s:f, s:b, s:i, s:o, s:f}", "result",
        result, "why", r->why, "exit_status", status, "batch_s", batches, "start_connections",
        (json_int_t)r->start_total, "fewest_connections", (json_int_t)r->fewest, "end_connections",
        (json_int_t)total(r), "pauses", r->pauses, "paused_s", (double)r->paused_ms / 1000,
        "spread_before", r->spread_before, "spread_after", r->spread_after, "balanced", r->balanced,
        "sheds", r->sheds, "nodes", nodes, "duration_s", (double)elapsed_ms(r) / 1000);
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", r->o.out);
    mkdir(r->o.out, 0755);
    if (json_dump_file(js, path, JSON_INDENT(2)) != 0) {
      fprintf(stderr, "converger roll: cannot write %s: %s\n", path, strerror(errno));
      if (status == 0) status = 1;
    }
    json_decref(js);
  }
  return status;
}

/* ---- main --------------------------------------------------------------------- */

int roll_main(int argc, char **argv, int balance_only) {
  roll_t r = {.cur = -1, .fewest = -1, .tty = isatty(2)};
  r.o.balance_only = balance_only;
  int p = parse(argc, argv, &r.o);
  if (p == 1) return 0;
  if (p != 0) return 2;
  const char *cmd = r.o.balance_only ? "balance" : "roll";
  r.f = (fleet_t){.api_key = r.o.api_key, .timeout_ms = 2000, .interrupted = &interrupted};
  int status = 0;
  char err[600];
  if ((r.o.url ? fleet_from_cluster(&r.f, r.o.url, err, sizeof err)
               : fleet_from_urls(&r.f, r.o.nodes, err, sizeof err)) != 0) {
    fprintf(stderr, "converger %s: cannot read the fleet: %s\n", cmd, err);
    fleet_free(&r.f);
    return 1;
  }
  struct sigaction sa = {.sa_handler = on_sigint};
  sigaction(SIGINT, &sa, NULL);
  rollpolicy_params_t pp;
  rollpolicy_defaults(&pp);
  pp.max_utilisation = (double)r.o.max_util / 100;
  pp.pause_cpu = (double)r.o.pause_cpu / 100;
  pp.abort_cpu = (double)r.o.abort_cpu / 100;
  pp.abort_ms = (uint64_t)r.o.abort_s * 1000;
  pp.drop_alarm = (double)r.o.abort_drop / 100;
  r.batch_of = calloc(r.f.n ? r.f.n : 1, sizeof *r.batch_of);
  r.batch_ms = calloc(r.f.n + 1, sizeof *r.batch_ms); /* at most one batch a node */
  r.pn = calloc(r.f.n, sizeof *r.pn);
  r.shedding = calloc(r.f.n, sizeof *r.shedding);
  if (!r.batch_of || !r.batch_ms || !r.pn || !r.shedding ||
      rollpolicy_init(&r.rp, &pp, r.f.n) != 0) {
    fprintf(stderr, "converger %s: out of memory\n", cmd);
    status = 1;
    goto done;
  }
  r.nbatches = rollpolicy_batches(r.f.n, (size_t)r.o.batch, NULL, r.batch_of); /* listing order */
  r.t0 = util_mono_ms();
  step(&r, 0, "starting;");
  r.start_total = total(&r);
  for (size_t i = 0; i < r.f.n; i++)
    if (!r.f.v[i].up) {
      fprintf(stderr, "converger %s: node %s (%s) does not answer GET /admin/status\n", cmd,
              r.f.v[i].id, r.f.v[i].shown);
      status = summary(&r, "error", 1);
      goto done;
    }
  plan(&r);
  if (!r.o.balance_only) {
    if (rollpolicy_fleet_utilisation(r.pn, r.f.n) < 0)
      fprintf(stderr, "converger roll: warning: no node publishes a capacity or a loop "
                      "utilisation: the headroom cannot be checked\n");
    char why[320];
    if (rollpolicy_headroom(&pp, r.pn, r.f.n, r.batch_of, r.nbatches, why, sizeof why) != 0) {
      fprintf(stderr, "converger roll: refusing to start: %s\n", why);
      snprintf(r.why, sizeof r.why, "%s", why);
      status = summary(&r, "refused", 3);
      goto done;
    }
    printf("headroom: ok (at most %lld %%)\n", r.o.max_util);
    fflush(stdout);
    if (r.o.dry_run) goto done;
    uint64_t last_start = 0, last_ready = 0;
    for (size_t b = 0; b < r.nbatches && !r.aborted; b++) {
      /* the interval since the last start, the settle since it was ready,
       * and no hot survivor */
      for (;;) {
        rollpolicy_verdict_t v = step(&r, 1, "waiting;");
        if (v == ROLLPOLICY_ABORT) break;
        uint64_t now = elapsed_ms(&r);
        int due = b == 0 || (now >= last_start + (uint64_t)r.o.interval_s * 1000 &&
                             now >= last_ready + (uint64_t)r.o.settle_s * 1000);
        if (due && v == ROLLPOLICY_GO) break;
      }
      if (r.aborted) break;
      last_start = elapsed_ms(&r);
      if (run_batch(&r, b) != 0) break;
      last_ready = elapsed_ms(&r);
    }
  } else if (r.o.dry_run) {
    goto done;
  }
  if (!r.aborted && !r.o.no_balance) {
    balance(&r);
    if (!r.balanced && !r.aborted) {
      r.aborted = 1;
      snprintf(r.why, sizeof r.why,
               "not balanced after %lld shed round(s): the busiest node holds %.2f x the mean, "
               "more than %lld %% above it (--balance-tolerance)",
               r.o.balance_rounds, r.spread_after, r.o.tolerance);
    }
  }
  if (r.aborted) {
    fprintf(stderr, "%sconverger %s: aborted: %s\n", r.tty ? "\r\033[K" : "", cmd, r.why);
    status = summary(&r, "aborted", 4);
  } else {
    status = summary(&r, "done", 0);
  }
done:
  rollpolicy_free(&r.rp);
  free(r.batch_of);
  free(r.batch_ms);
  free(r.pn);
  free(r.shedding);
  fleet_free(&r.f);
  return status;
}
