/*
 * shardset.c: a throwaway sharded cluster's servers (bench/shardset.h).
 */
#include "bench/shardset.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/node.h"
#include "bench/pgtmp.h"
#include "bench/run.h"
#include "core/errors.h"

#define REDIS_WAIT_MS 10000 /* for a redis-server to answer PING */

/* PING the redis-server at 127.0.0.1:port once; 0 when it answers +PONG. */
static int redis_ping(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {.tv_sec = 1};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[16] = {0};
  int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "PING\r\n", 6) == 6 &&
           read(fd, buf, sizeof buf - 1) >= 5 && strncmp(buf, "+PONG", 5) == 0;
  close(fd);
  return ok ? 0 : -1;
}

/* Bus instance i: a redis-server on a free loopback port, no persistence,
 * stopped by its pid (and SIGKILLed by the kernel if the bench dies). */
static int redis_start(shardset_t *s, const char *cmd, int i) {
  char port[16];
  if ((s->redis_port[i] = bnode_free_port()) < 0) {
    fprintf(stderr, "%s: no free port for redis-server\n", cmd);
    return -1;
  }
  snprintf(port, sizeof port, "%d", s->redis_port[i]);
  char *const argv[] = {"redis-server", "--port", port,           "--bind", "127.0.0.1",
                        "--save",       "",       "--appendonly", "no",     NULL};
  run_spawn_opts_t so = {
      .out_fd = -1, .err_fd = -1, .death_sig = SIGKILL, .own_group = 1, .cpu = -1};
  if ((s->redis_pid[i] = run_spawn(argv, &so)) < 0) {
    s->redis_pid[i] = 0;
    fprintf(stderr, "%s: cannot start redis-server: %s\n", cmd, strerror(errno));
    return -1;
  }
  uint64_t until = run_now_ns() + (uint64_t)REDIS_WAIT_MS * 1000000u;
  while (redis_ping(s->redis_port[i]) != 0) {
    int st;
    if (waitpid(s->redis_pid[i], &st, WNOHANG) == s->redis_pid[i]) {
      s->redis_pid[i] = 0;
      fprintf(stderr, "%s: redis-server exited at once (is it installed? scripts/setup)\n", cmd);
      return -1;
    }
    if (run_now_ns() >= until || run_interrupted) {
      fprintf(stderr, "%s: redis-server did not answer PING on port %d within %d s\n", cmd,
              s->redis_port[i], REDIS_WAIT_MS / 1000);
      return -1;
    }
    run_sleep_ms(20);
  }
  return 0;
}

int shardset_start(shardset_t *s, const char *cmd, const char *pg_tmp, int ninst, int nbus,
                   int fast) {
  if (ninst < 1 || ninst > SHARDSET_MAX_INSTANCES || nbus < 1 || nbus > SHARDSET_MAX_BUS) {
    fprintf(stderr, "%s: %d instances and %d bus instances: want 1..%d and 1..%d\n", cmd, ninst,
            nbus, SHARDSET_MAX_INSTANCES, SHARDSET_MAX_BUS);
    return -1;
  }
  if (access(pg_tmp, X_OK) != 0) {
    fprintf(stderr, "%s: cannot run %s (%s); give --pg-tmp PATH\n", cmd, pg_tmp, strerror(errno));
    return -1;
  }
  s->ninst = ninst;
  for (int i = 0; i < ninst; i++)
    if (pgtmp_start(cmd, pg_tmp, fast, s->dir[i], sizeof s->dir[i], s->url[i], sizeof s->url[i]) !=
        0)
      return -1;
  s->nbus = nbus;
  size_t len = 0;
  for (int i = 0; i < nbus; i++) {
    if (redis_start(s, cmd, i) != 0) return -1;
    len += (size_t)snprintf(s->bus + len, sizeof s->bus - len, "%sredis://127.0.0.1:%d",
                            i ? "," : "", s->redis_port[i]);
  }
  /* as `converger shards init`: every instance migrated, then the map in
   * the control database (instance 0) */
  const char *urls[SHARDSET_MAX_INSTANCES];
  store_t *ctl = NULL;
  store_options_t so = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 5000};
  int err = 0;
  for (int i = 0; i < ninst && !err; i++) {
    store_t *st = NULL;
    urls[i] = s->url[i];
    if ((err = store_open(s->url[i], &so, &st)) == 0) err = store_migrate(st);
    if (i == 0 && !err)
      ctl = st;
    else
      store_close(st);
  }
  store_shardmap_t map = {0};
  if (!err) err = store_shardmap_init(ctl, urls, ninst);
  if (!err) err = store_shardmap_get(ctl, &map);
  store_close(ctl);
  if (err) {
    fprintf(stderr, "%s: writing the shard map over %d instances failed: %s\n", cmd, ninst,
            cv_strerror(err));
    return -1;
  }
  memcpy(s->map, map.map, sizeof s->map);
  store_shardmap_clear(&map);
  return 0;
}

void shardset_stop(shardset_t *s, const char *cmd, const char *pg_tmp) {
  for (int i = 0; i < SHARDSET_MAX_BUS; i++) {
    if (s->redis_pid[i] > 0) run_stop_child(s->redis_pid[i], 5000, NULL);
    s->redis_pid[i] = 0;
  }
  for (int i = 0; i < SHARDSET_MAX_INSTANCES; i++) pgtmp_stop(cmd, pg_tmp, s->dir[i]);
}

int shardset_instance_of(const shardset_t *s, const char *conv) { return s->map[shard_of(conv)]; }
