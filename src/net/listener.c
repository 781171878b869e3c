/*
 * listener.c: accept loop, descriptor exhaustion, reporting (listener.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4 */
#endif
#include "net/listener.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/metrics.h"
#include "core/log.h"
#include "common/util.h"

static const char *reason_of(int err) {
  switch (err) {
  case EMFILE:
    return "emfile";
  case ENFILE:
    return "enfile";
  case ENOBUFS:
    return "enobufs";
  case ENOMEM:
    return "enomem";
  default:
    return "other";
  }
}

/* accept(2): errors of the connection itself, passed on by accept; the
 * socket is fine and the next accept may succeed. */
static int transient(int err) {
  return err == EINTR || err == ECONNABORTED || err == EPROTO || err == ENETDOWN ||
         err == ENOPROTOOPT || err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH ||
         err == EOPNOTSUPP || err == ENETUNREACH || err == EPERM;
}

static void report(listener_t *l, uint64_t now) {
  if (l->n_errors == 0) return;
  double secs = l->report_ms ? (double)(now - l->report_ms) / 1000.0 : 0.0;
  char since[48] = "";
  if (l->report_ms) snprintf(since, sizeof since, " in the last %.1f s", secs);
  log_warn("accept: %s (%s): %llu failed accept(s)%s; closed %llu idle connection(s) to make "
           "room and %llu new one(s) unanswered",
           strerror(l->last_errno), reason_of(l->last_errno), (unsigned long long)l->n_errors,
           since, (unsigned long long)l->n_reclaimed, (unsigned long long)l->n_refused);
  l->report_ms = now;
  l->n_errors = l->n_reclaimed = l->n_refused = 0;
}

static void count_error(listener_t *l, int err) {
  char labels[32];
  snprintf(labels, sizeof labels, "reason=\"%s\"", reason_of(err));
  metrics_add(l->metrics, "converger_accept_errors_total", labels, 1);
  l->n_errors++;
  l->last_errno = err;
}

/* A connection waits to be accepted. accept() says EMFILE before it looks
 * at the queue, so the error alone does not say that anyone is waiting. */
static int pending(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

static void readable_cb(uv_poll_t *p, int status, int events);

static void pause_cb(uv_timer_t *t) {
  listener_t *l = container_of(t, listener_t, pause_timer);
  l->paused = 0;
  if (l->fd < 0) return;
  if (l->spare_fd < 0) l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  uv_poll_start(&l->poll, UV_READABLE, readable_cb);
}

static void pause_accepting(listener_t *l) {
  if (l->paused) return;
  l->paused = 1;
  uv_poll_stop(&l->poll);
  uv_timer_start(&l->pause_timer, pause_cb, LISTENER_PAUSE_MS, 0);
}

/* The spare-descriptor trick: with the spare given up, accept what is
 * pending and close it at once, then take the spare back. */
static void refuse_pending(listener_t *l) {
  if (l->spare_fd < 0) return;
  close(l->spare_fd);
  l->spare_fd = -1;
  for (int i = 0; i < LISTENER_ACCEPT_BATCH; i++) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (transient(errno)) continue;
      break; /* EAGAIN: nothing left; EMFILE: another thread took the spare's slot */
    }
    close(fd);
    l->n_refused++;
    metrics_add(l->metrics, "converger_fd_limit_closed_total", "kind=\"pending\"", 1);
  }
  l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* else again when the pause ends */
}

static void readable_cb(uv_poll_t *p, int status, int events) {
  listener_t *l = container_of(p, listener_t, poll);
  if (status < 0) {
    log_error("accept: polling the listening socket: %s", uv_strerror(status));
    pause_accepting(l);
    return;
  }
  for (int i = 0; i < LISTENER_ACCEPT_BATCH && l->fd >= 0 && !l->paused; i++) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      l->on_conn(l, fd);
      continue;
    }
    int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (transient(err)) continue;
    if ((err == EMFILE || err == ENFILE) && !pending(l->fd)) break; /* full, but no one waits */
    count_error(l, err);
    if (err == EMFILE || err == ENFILE) {
      int freed = l->reclaim ? l->reclaim(l) : 0;
      if (freed > 0) {
        l->n_reclaimed += (uint64_t)freed;
        metrics_add(l->metrics, "converger_fd_limit_closed_total", "kind=\"idle\"",
                    (uint64_t)freed);
        continue;
      }
      refuse_pending(l);
    }
    pause_accepting(l);
    break;
  }
  uint64_t now = util_mono_ms();
  if (l->n_errors && (l->report_ms == 0 || now - l->report_ms >= LISTENER_REPORT_MS))
    report(l, now);
}

int listener_start(listener_t *l, uv_loop_t *loop, const struct sockaddr *addr, int backlog,
                   listener_conn_cb on_conn, listener_reclaim_cb reclaim, metrics_t *metrics,
                   void *data) {
  memset(l, 0, sizeof *l);
  l->fd = l->spare_fd = -1;
  l->loop = loop;
  l->on_conn = on_conn;
  l->reclaim = reclaim;
  l->metrics = metrics;
  l->data = data;
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int on = 1;
  socklen_t len =
      addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 || bind(fd, addr, len) != 0 ||
      listen(fd, backlog) != 0) {
    int r = -errno;
    close(fd);
    return r;
  }
  int r = uv_poll_init_socket(loop, &l->poll, fd);
  if (r != 0) {
    close(fd);
    return r;
  }
  uv_timer_init(loop, &l->pause_timer);
  l->fd = fd;
  l->started = 1;
  l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (l->spare_fd < 0) log_warn("accept: no spare descriptor (/dev/null: %s)", strerror(errno));
  uv_poll_start(&l->poll, UV_READABLE, readable_cb);
  return 0;
}

int listener_port(const listener_t *l) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (l->fd < 0) return -EBADF;
  if (getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0) return -errno;
  if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

void listener_tick(listener_t *l, uint64_t now) {
  if (l->n_errors && now - l->report_ms >= LISTENER_REPORT_MS) report(l, now);
}

void listener_stop(listener_t *l) {
  if (!l->started) return;
  l->started = 0;
  report(l, util_mono_ms());
  uv_close((uv_handle_t *)&l->poll, NULL); /* stops polling at once */
  uv_close((uv_handle_t *)&l->pause_timer, NULL);
  close(l->fd);
  l->fd = -1;
  if (l->spare_fd >= 0) close(l->spare_fd);
  l->spare_fd = -1;
}
