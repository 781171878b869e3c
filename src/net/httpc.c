/*
 * httpc.c: blocking HTTP/1.1 client (see net/httpc.h).
 *
 * The socket is non-blocking and every wait is a poll() bounded by what is
 * left of the request's deadline, so connect, send and receive together
 * never take longer than timeout_ms. The answer goes through llhttp in
 * HTTP_RESPONSE mode; the parser pauses at the end of the first final
 * (non-1xx) answer. The llhttp settings live on the stack of each call:
 * nothing is shared between calls or threads.
 *
 * https: OpenSSL on the same non-blocking socket (SSL_set_fd), each
 * SSL_ERROR_WANT_READ / _WRITE waited for with poll() under the deadline.
 * The socket BIO writes with write(2), which raises SIGPIPE on a closed
 * peer: SIGPIPE is blocked in the calling thread for the request and one
 * that became pending is taken before it is unblocked.
 */
#include "net/httpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <llhttp.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/tlsclient.h"
#include "common/urlauth.h"
#include "common/util.h"

#define FIELD_MAX 16 /* longest header name we look at ("Retry-After") */
#define VALUE_MAX 24 /* longest Retry-After value we parse */

static int fail(char *err, size_t err_len, int e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t err_len, int e, const char *fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return e;
}

/* ---- waiting under the deadline -------------------------------------------------- */

/* Wait until fd is ready for `events`. 0, -ETIMEDOUT, -EINTR or -errno. */
static int wait_fd(int fd, short events, uint64_t deadline, volatile sig_atomic_t *interrupted) {
  for (;;) {
    uint64_t now = util_mono_ms();
    if (now >= deadline) return -ETIMEDOUT;
    uint64_t left = deadline - now;
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
    if (n > 0) return 0; /* POLLERR/POLLHUP too: the next call says what happened */
    if (n == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
    if (interrupted && *interrupted) return -EINTR;
  }
}

/* ---- connecting ------------------------------------------------------------------- */

/* "host:port", or "[v6]:port" when host is an IPv6 literal. */
static void host_port(const char *host, int port, char *out, size_t len) {
  snprintf(out, len, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

static int connect_one(const struct addrinfo *ai, uint64_t deadline,
                       volatile sig_atomic_t *interrupted, int *fd_out) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) return -errno;
  int e = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    e = -errno;
    if (e == -EINPROGRESS || (e == -EINTR && !(interrupted && *interrupted))) {
      e = wait_fd(fd, POLLOUT, deadline, interrupted);
      if (e == 0) {
        int so = 0;
        socklen_t sl = sizeof so;
        e = getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0 ? -errno : -so;
      }
    }
  }
  if (e != 0) {
    close(fd);
    return e;
  }
  *fd_out = fd;
  return 0;
}

/* Resolve and connect to the first address that accepts. Returns the fd
 * (>= 0) or a negative errno with err set. */
static int connect_host(const httpc_request_t *req, uint64_t deadline, char *err, size_t err_len) {
  char hp[HTTPC_HOST_MAX + 16], port_s[8];
  host_port(req->host, req->port, hp, sizeof hp);
  snprintf(port_s, sizeof port_s, "%d", req->port);
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  int g = getaddrinfo(req->host, port_s, &hints, &res);
  if (g != 0) {
    int e = g == EAI_AGAIN    ? -EAGAIN
            : g == EAI_MEMORY ? -ENOMEM
            : g == EAI_SYSTEM ? -errno
                              : -ENOENT;
    if (e == 0) e = -ENOENT;
    return fail(err, err_len, e, "cannot resolve \"%s\": %s", req->host,
                g == EAI_SYSTEM ? strerror(-e) : gai_strerror(g));
  }
  int e = -ECONNREFUSED, fd = -1;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    e = connect_one(ai, deadline, req->interrupted, &fd);
    if (e == 0 || e == -ETIMEDOUT || e == -EINTR) break;
  }
  freeaddrinfo(res);
  if (e == 0) return fd;
  if (e == -ETIMEDOUT)
    return fail(err, err_len, e, "connect to %s: no answer within %d ms", hp, req->timeout_ms);
  if (e == -EINTR) return fail(err, err_len, e, "connect to %s: interrupted", hp);
  return fail(err, err_len, e, "connect to %s: %s", hp, strerror(-e));
}

/* ---- the link: a socket, or TLS on it --------------------------------------------- */

typedef struct {
  int fd;
  SSL_CTX *ctx; /* NULL: plain TCP */
  SSL *ssl;
  char why[200]; /* the last TLS failure, for the error line */
} link_t;

/* errno of a failed SSL call; `want` gets what to wait for on EAGAIN. */
static int tls_errno(link_t *l, int r, short *want) {
  int e = SSL_get_error(l->ssl, r);
  switch (e) {
  case SSL_ERROR_WANT_READ:
    *want = POLLIN;
    return EAGAIN;
  case SSL_ERROR_WANT_WRITE:
    *want = POLLOUT;
    return EAGAIN;
  case SSL_ERROR_ZERO_RETURN:
    return 0; /* close_notify: the end of the stream */
  case SSL_ERROR_SYSCALL:
    ERR_clear_error();
    return errno ? errno : EPIPE; /* 0: an EOF that broke the protocol */
  default: {
    unsigned long code = ERR_peek_last_error();
    long v = SSL_get_verify_result(l->ssl);
    if (ERR_GET_REASON(code) == SSL_R_CERTIFICATE_VERIFY_FAILED && v != X509_V_OK)
      snprintf(l->why, sizeof l->why, "certificate verify failed: %s",
               X509_verify_cert_error_string(v));
    else if (ERR_GET_REASON(code) == SSL_R_WRONG_VERSION_NUMBER)
      snprintf(l->why, sizeof l->why, "the server does not speak TLS (an http:// port?)");
    else if (ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
      ERR_clear_error(); /* a peer gone without close_notify: as a reset, worth a retry */
      return EPIPE;
    } else if (code)
      ERR_error_string_n(code, l->why, sizeof l->why);
    else
      snprintf(l->why, sizeof l->why, "TLS failed");
    ERR_clear_error();
    return EPROTO;
  }
  }
}

/* Like send(2) with MSG_NOSIGNAL: bytes sent, or -1 with errno (EAGAIN:
 * wait for *want). */
static ssize_t link_send(link_t *l, const char *buf, size_t len, short *want) {
  *want = POLLOUT;
  if (!l->ssl) return send(l->fd, buf, len, MSG_NOSIGNAL);
  int r = SSL_write(l->ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
  if (r > 0) return r;
  errno = tls_errno(l, r, want);
  return -1;
}

/* Like recv(2): bytes read, 0 at the end, or -1 with errno. */
static ssize_t link_recv(link_t *l, char *buf, size_t len, short *want) {
  *want = POLLIN;
  if (!l->ssl) return recv(l->fd, buf, len, 0);
  int r = SSL_read(l->ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
  if (r > 0) return r;
  int e = tls_errno(l, r, want);
  if (e == 0) return 0;
  errno = e;
  return -1;
}

/* TLS 1.2 or later on l->fd, verifying the certificate chain (the CA file
 * or directory of the request, else the system's) and that it names
 * req->host (RFC 6125; an IP address against its IP SANs), with SNI for a
 * name. 0, or a negative errno with the reason in err. */
static int tls_connect(link_t *l, const httpc_request_t *req, uint64_t deadline, char *err,
                       size_t err_len) {
  l->ctx = tlsclient_ctx(req->tls_ca_file, req->tls_ca_dir);
  if (!l->ctx) {
    ERR_clear_error();
    if (!req->tls_ca_file && !req->tls_ca_dir)
      return fail(err, err_len, -EINVAL, "TLS: cannot load the system's CA certificates");
    return fail(err, err_len, -EINVAL, "TLS: cannot load the CA certificates from %s",
                req->tls_ca_file ? req->tls_ca_file : req->tls_ca_dir);
  }
  l->ssl = SSL_new(l->ctx);
  if (!l->ssl || SSL_set_fd(l->ssl, l->fd) != 1)
    return fail(err, err_len, -ENOMEM, "TLS: out of memory");
  if (!tlsclient_expect_host(l->ssl, req->host))
    return fail(err, err_len, -EINVAL, "TLS: cannot verify the host \"%s\"", req->host);
  for (;;) {
    int r = SSL_connect(l->ssl);
    if (r == 1) return 0;
    short want = POLLIN;
    int e = -tls_errno(l, r, &want);
    if (e == 0) e = -EPIPE; /* close_notify before the handshake ended */
    if (e == -EAGAIN) e = wait_fd(l->fd, want, deadline, req->interrupted);
    if (e == 0) continue;
    if (e == -ETIMEDOUT)
      return fail(err, err_len, e, "TLS: no handshake within %d ms", req->timeout_ms);
    if (e == -EINTR) return fail(err, err_len, e, "interrupted");
    if (e == -EPROTO) return fail(err, err_len, e, "TLS: %s for %s", l->why, req->host);
    return fail(err, err_len, e, "TLS handshake with %s: %s", req->host,
                e == -EPIPE ? "the server closed the connection (does it speak TLS?)"
                            : strerror(-e));
  }
}

static void link_close(link_t *l) {
  if (l->ssl) SSL_free(l->ssl);
  if (l->ctx) SSL_CTX_free(l->ctx);
  if (l->fd >= 0) close(l->fd);
}

/* ---- reading the answer ----------------------------------------------------------- */

typedef struct {
  httpc_response_t *resp;
  size_t cap, max;
  int done, too_large, nomem, head;
  char field[FIELD_MAX + 1];
  size_t field_len;
  int field_long, in_retry_after;
  char value[VALUE_MAX + 1];
  size_t value_len;
  int value_long;
} reader_t;

static int on_message_begin(llhttp_t *p) {
  reader_t *r = p->data;
  r->resp->body_len = 0;
  r->resp->retry_after_s = -1;
  r->field_len = 0;
  r->field_long = 0;
  return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len) {
  reader_t *r = p->data;
  if (r->field_len + len > FIELD_MAX) {
    r->field_long = 1;
    return 0;
  }
  memcpy(r->field + r->field_len, at, len);
  r->field_len += len;
  return 0;
}

static int on_header_field_complete(llhttp_t *p) {
  reader_t *r = p->data;
  r->field[r->field_len] = '\0';
  r->in_retry_after = !r->field_long && strcasecmp(r->field, "Retry-After") == 0;
  r->field_len = 0;
  r->field_long = 0;
  r->value_len = 0;
  r->value_long = 0;
  return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len) {
  reader_t *r = p->data;
  if (!r->in_retry_after) return 0;
  if (r->value_len + len > VALUE_MAX) {
    r->value_long = 1;
    return 0;
  }
  memcpy(r->value + r->value_len, at, len);
  r->value_len += len;
  return 0;
}

/* Retry-After: delta-seconds only (an HTTP-date counts as absent). */
static int on_header_value_complete(llhttp_t *p) {
  reader_t *r = p->data;
  if (!r->in_retry_after) return 0;
  r->in_retry_after = 0;
  if (r->value_long) return 0;
  r->value[r->value_len] = '\0';
  const char *v = r->value;
  while (*v == ' ' || *v == '\t') v++;
  long s = 0;
  int digits = 0;
  for (; *v >= '0' && *v <= '9' && digits < 9; v++, digits++) s = s * 10 + (*v - '0');
  while (*v == ' ' || *v == '\t') v++;
  if (digits > 0 && *v == '\0') r->resp->retry_after_s = s;
  return 0;
}

static int on_headers_complete(llhttp_t *p) {
  return ((reader_t *)p->data)->head ? 1 : 0; /* 1: an answer to HEAD has no body */
}

static int on_body(llhttp_t *p, const char *at, size_t len) {
  reader_t *r = p->data;
  httpc_response_t *resp = r->resp;
  if (len > r->max - resp->body_len) {
    r->too_large = 1;
    return -1;
  }
  if (resp->body_len + len + 1 > r->cap) {
    size_t cap = r->cap ? r->cap : 1024;
    while (cap < resp->body_len + len + 1) cap *= 2;
    char *b = realloc(resp->body, cap);
    if (!b) {
      r->nomem = 1;
      return -1;
    }
    resp->body = b;
    r->cap = cap;
  }
  memcpy(resp->body + resp->body_len, at, len);
  resp->body_len += len;
  resp->body[resp->body_len] = '\0';
  return 0;
}

static int on_message_complete(llhttp_t *p) {
  reader_t *r = p->data;
  int st = llhttp_get_status_code(p);
  if (st >= 100 && st < 200 && st != 101) return 0; /* interim answer: read on */
  r->done = 1;
  return HPE_PAUSED;
}

/* Feed `len` bytes (len 0: end of stream). 0 or a negative errno. */
static int feed(llhttp_t *p, reader_t *r, const char *buf, size_t len, char *err, size_t err_len) {
  llhttp_errno_t e = len ? llhttp_execute(p, buf, len) : llhttp_finish(p);
  if (r->done) return 0;
  if (r->too_large)
    return fail(err, err_len, -EMSGSIZE, "the answer's body is larger than %zu bytes", r->max);
  if (r->nomem) return fail(err, err_len, -ENOMEM, "out of memory");
  if (len == 0)
    return fail(err, err_len, -EPIPE, "the server closed the connection before a complete answer");
  if (e != HPE_OK && e != HPE_PAUSED)
    return fail(err, err_len, -EPROTO, "bad HTTP answer: %s", llhttp_get_error_reason(p));
  return 0;
}

static int read_answer(link_t *l, const httpc_request_t *req, uint64_t deadline,
                       httpc_response_t *resp, char *err, size_t err_len) {
  llhttp_settings_t settings;
  llhttp_settings_init(&settings);
  settings.on_message_begin = on_message_begin;
  settings.on_header_field = on_header_field;
  settings.on_header_field_complete = on_header_field_complete;
  settings.on_header_value = on_header_value;
  settings.on_header_value_complete = on_header_value_complete;
  settings.on_headers_complete = on_headers_complete;
  settings.on_body = on_body;
  settings.on_message_complete = on_message_complete;
  llhttp_t parser;
  llhttp_init(&parser, HTTP_RESPONSE, &settings);
  reader_t r = {.resp = resp, .max = req->max_body ? req->max_body : HTTPC_MAX_BODY_BYTES};
  r.head = strcmp(req->method, "HEAD") == 0;
  parser.data = &r;
  char buf[16384];
  while (!r.done) {
    short want;
    ssize_t k = link_recv(l, buf, sizeof buf, &want);
    if (k < 0) {
      int e = -errno;
      if (e == -EAGAIN || e == -EWOULDBLOCK)
        e = wait_fd(l->fd, want, deadline, req->interrupted);
      else if (e == -EINTR && !(req->interrupted && *req->interrupted))
        e = 0;
      if (e == 0) continue;
      if (e == -ETIMEDOUT)
        return fail(err, err_len, e, "no complete answer within %d ms", req->timeout_ms);
      if (e == -ECONNRESET) return fail(err, err_len, e, "connection reset by the server");
      if (e == -EINTR) return fail(err, err_len, e, "interrupted");
      if (e == -EPROTO) return fail(err, err_len, e, "TLS: %s", l->why);
      return fail(err, err_len, e, "recv: %s", strerror(-e));
    }
    int e = feed(&parser, &r, buf, (size_t)k, err, err_len); /* k == 0: end of stream */
    if (e != 0) return e;
  }
  resp->status = llhttp_get_status_code(&parser);
  if (!resp->body && !(resp->body = calloc(1, 1)))
    return fail(err, err_len, -ENOMEM, "out of memory");
  return resp->status;
}

/* ---- the request ------------------------------------------------------------------ */

static int is_tchar(int c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Extra headers: "" or complete "Name: value\r\n" lines, no blank line. */
static int headers_ok(const char *h) {
  if (!h || !*h) return 1;
  size_t n = strlen(h);
  if (n < 2 || h[n - 2] != '\r' || h[n - 1] != '\n') return 0;
  for (size_t i = 0; i < n; i++) {
    if (h[i] == '\r' && h[i + 1] != '\n') return 0;
    if (h[i] == '\n' && (i == 0 || h[i - 1] != '\r')) return 0;
    if (h[i] == '\n' && i + 1 < n && (h[i + 1] == '\r' || h[i + 1] == ' ' || h[i + 1] == '\t'))
      return 0; /* blank line or obsolete folding */
  }
  return h[0] != '\r' && h[0] != ' ' && h[0] != '\t';
}

static int validate(const httpc_request_t *req, char *err, size_t err_len) {
  if (!req->host || !*req->host || strlen(req->host) > HTTPC_HOST_MAX ||
      strpbrk(req->host, " \t\r\n/"))
    return fail(err, err_len, -EINVAL, "bad host");
  if (req->port < 1 || req->port > 65535)
    return fail(err, err_len, -EINVAL, "port %d is outside 1..65535", req->port);
  if (!req->method || !*req->method) return fail(err, err_len, -EINVAL, "no method");
  for (const char *m = req->method; *m; m++)
    if (!is_tchar((unsigned char)*m)) return fail(err, err_len, -EINVAL, "bad method");
  if (!req->path || req->path[0] != '/')
    return fail(err, err_len, -EINVAL, "path must start with /");
  for (const unsigned char *s = (const unsigned char *)req->path; *s; s++)
    if (*s <= 0x20 || *s == 0x7f)
      return fail(err, err_len, -EINVAL, "path contains a space or control character");
  if (!headers_ok(req->headers))
    return fail(err, err_len, -EINVAL, "extra headers must be \"Name: value\\r\\n\" lines");
  if (req->timeout_ms <= 0) return fail(err, err_len, -EINVAL, "timeout_ms must be > 0");
  return 0;
}

/* Write all of buf. 0 or a negative errno (err set). */
static int send_all(link_t *l, const char *buf, size_t len, const httpc_request_t *req,
                    uint64_t deadline, char *err, size_t err_len) {
  for (size_t off = 0; off < len;) {
    short want;
    ssize_t k = link_send(l, buf + off, len - off, &want);
    if (k >= 0) {
      off += (size_t)k;
      continue;
    }
    int e = -errno;
    if (e == -EAGAIN || e == -EWOULDBLOCK)
      e = wait_fd(l->fd, want, deadline, req->interrupted);
    else if (e == -EINTR && !(req->interrupted && *req->interrupted))
      e = 0;
    if (e == 0) continue;
    if (e == -ETIMEDOUT)
      return fail(err, err_len, e, "could not send the request within %d ms", req->timeout_ms);
    if (e == -EINTR) return fail(err, err_len, e, "interrupted");
    if (e == -ECONNRESET) return fail(err, err_len, e, "connection reset by the server");
    if (e == -EPIPE)
      return fail(err, err_len, e, "the server closed the connection during the request");
    if (e == -EPROTO) return fail(err, err_len, e, "TLS: %s", l->why);
    return fail(err, err_len, e, "send: %s", strerror(-e));
  }
  return 0;
}

static int request(const httpc_request_t *req, httpc_response_t *resp, char *err, size_t err_len) {
  *resp = (httpc_response_t){.status = 0, .body = NULL, .body_len = 0, .retry_after_s = -1};
  if (err && err_len) err[0] = '\0';
  int e = validate(req, err, err_len);
  if (e != 0) return e;
  uint64_t deadline = util_mono_ms() + (uint64_t)req->timeout_ms;

  char hp[HTTPC_HOST_MAX + 16];
  host_port(req->host, req->port, hp, sizeof hp);
  size_t blen = req->body ? strlen(req->body) : 0;
  const char *ctype = req->body ? "Content-Type: application/json\r\n" : "";
  const char *extra = req->headers ? req->headers : "";
  const char *fmt = "%s %s HTTP/1.1\r\nHost: %s\r\n%s%sContent-Length: %zu\r\n"
                    "Connection: close\r\n\r\n";
  int hlen = snprintf(NULL, 0, fmt, req->method, req->path, hp, extra, ctype, blen);
  char *msg = hlen < 0 ? NULL : malloc((size_t)hlen + blen + 1);
  if (!msg) return fail(err, err_len, -ENOMEM, "out of memory");
  snprintf(msg, (size_t)hlen + 1, fmt, req->method, req->path, hp, extra, ctype, blen);
  if (blen) memcpy(msg + hlen, req->body, blen);

  link_t l = {.fd = connect_host(req, deadline, err, err_len)};
  if (l.fd < 0) {
    free(msg);
    return l.fd;
  }
  e = req->tls ? tls_connect(&l, req, deadline, err, err_len) : 0;
  if (e != 0) {
    free(msg);
    link_close(&l);
    return e;
  }
  /* After a failed send the server may still have answered (an early 413,
   * say): read what is there, and report the send error if there is none. */
  char send_err[260] = "";
  e = send_all(&l, msg, (size_t)hlen + blen, req, deadline, send_err, sizeof send_err);
  free(msg);
  if (e == 0) {
    e = read_answer(&l, req, deadline, resp, err, err_len);
  } else {
    int st = e == -EPIPE || e == -ECONNRESET ? read_answer(&l, req, deadline, resp, NULL, 0) : e;
    if (st >= 0)
      e = st;
    else
      fail(err, err_len, e, "%s", send_err);
  }
  link_close(&l);
  if (e < 0) {
    httpc_response_free(resp);
    resp->status = 0;
    resp->retry_after_s = -1;
  }
  return e;
}

int httpc_request(const httpc_request_t *req, httpc_response_t *resp, char *err, size_t err_len) {
  if (!req->tls) return request(req, resp, err, err_len);
  /* OpenSSL's socket BIO write(2)s: keep a closed peer's SIGPIPE from
   * killing the process, and take one that came before unblocking. */
  sigset_t pipe, old;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  int r = request(req, resp, err, err_len);
  sigset_t pending;
  if (!sigismember(&old, SIGPIPE) && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
    struct timespec zero = {0, 0};
    sigtimedwait(&pipe, NULL, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return r;
}

void httpc_response_free(httpc_response_t *resp) {
  if (!resp) return;
  free(resp->body);
  resp->body = NULL;
  resp->body_len = 0;
}

int httpc_retryable(int e) {
  switch (e) {
  case -ECONNREFUSED:
  case -ECONNRESET:
  case -ECONNABORTED:
  case -EPIPE:
  case -ETIMEDOUT:
  case -EAGAIN:
  case -ENETUNREACH:
  case -EHOSTUNREACH:
  case -ENETDOWN:
  case -EHOSTDOWN:
    return 1;
  default:
    return 0;
  }
}

/* ---- URLs ------------------------------------------------------------------------- */

#define URL_SHAPE "want http://host:port[/prefix] or https://..."

static int path_char_ok(int c) {
  /* RFC 3986 pchar (unreserved, sub-delims, ':', '@', pct-encoded) and '/' */
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         (c && strchr("-._~!$&'()*+,;=:@%/", c));
}

int httpc_parse_url(const char *url, httpc_url_t *out, char *err, size_t err_len) {
  if (!url || !*url) return fail(err, err_len, -EINVAL, "empty URL: " URL_SHAPE);
  for (const unsigned char *s = (const unsigned char *)url; *s; s++)
    if (*s <= 0x20 || *s >= 0x7f)
      return fail(err, err_len, -EINVAL,
                  "the URL contains a space, a control or a non-ASCII character");
  const char *sep = strstr(url, "://");
  if (!sep) return fail(err, err_len, -EINVAL, "\"%s\" is not a URL: " URL_SHAPE, url);
  size_t slen = (size_t)(sep - url);
  out->tls = slen == 5 && strncasecmp(url, "https", 5) == 0;
  if (!out->tls && (slen != 4 || strncasecmp(url, "http", 4) != 0))
    return fail(err, err_len, -EINVAL, "unsupported URL scheme \"%.*s\": " URL_SHAPE, (int)slen,
                url);

  const char *auth = sep + 3;
  size_t alen = strcspn(auth, "/?#");
  urlauth_t a;
  if (urlauth_parse(url, auth, alen, &a, err, err_len) != 0) return -EINVAL;
  snprintf(out->host, sizeof out->host, "%s", a.host);
  out->port = a.port ? a.port : out->tls ? HTTPC_DEFAULT_TLS_PORT : HTTPC_DEFAULT_PORT;
  const char *end = auth + alen;

  const char *path = end;
  if (strchr(path, '?'))
    return fail(err, err_len, -EINVAL, "a query string (?...) is not allowed in the URL");
  if (strchr(path, '#'))
    return fail(err, err_len, -EINVAL, "a fragment (#...) is not allowed in the URL");
  size_t plen = strlen(path);
  for (size_t i = 0; i < plen; i++)
    if (!path_char_ok((unsigned char)path[i]))
      return fail(err, err_len, -EINVAL, "bad character '%c' in the path of \"%s\"", path[i], url);
  while (plen > 0 && path[plen - 1] == '/') plen--;
  if (plen > HTTPC_PREFIX_MAX) return fail(err, err_len, -EINVAL, "URL path prefix too long");
  memcpy(out->prefix, path, plen);
  out->prefix[plen] = '\0';
  return 0;
}
