/*
 * send.c: `converger send` (see cli/send.h): parse the command line, build
 * the request once, then attempt it at most 1 + --retries times through
 * net/httpc, waiting between attempts.
 *
 * Waits: after a 503, the node's hint (the body's error.retryAfterMs, else
 * the Retry-After header), capped at SEND_HINT_CAP_MS; after a connection
 * failure, or a 503 without a hint, decorrelated jitter (common/jitter.h) from
 * SEND_BACKOFF_BASE_MS up to SEND_BACKOFF_CAP_MS. Nothing else is retried:
 * a 4xx or another 5xx will not change by asking again.
 */
#include "cli/send.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "cli/args.h"
#include "common/jitter.h"
#include "common/util.h"
#include "net/httpc.h"

#define SEND_DEFAULT_RETRIES    5
#define SEND_MAX_RETRIES        100
#define SEND_DEFAULT_TIMEOUT_MS 10000
#define SEND_MAX_TIMEOUT_MS     600000
#define SEND_BACKOFF_BASE_MS    250
#define SEND_BACKOFF_CAP_MS     5000
#define SEND_HINT_CAP_MS        30000
#define SEND_API_KEY_ENV        "CONVERGER_API_KEY" /* the node's own setting (core/config.c) */
#define SEND_SHOWN_BODY_MAX     2000                /* bytes of an error answer shown on stderr */

typedef struct {
  const char *url, *api_key, *conv, *sender, *key, *body, *tls_ca;
  long long retries, timeout_ms;
} opts_t;

static void usage(FILE *out) {
  fprintf(out,
          "usage: converger send --url HTTP_URL --api-key KEY --conv CONV --sender USER\n"
          "                      [--idempotency-key KEY] [--retries N] [--timeout-ms MS]\n"
          "                      [--tls-ca FILE] BODY_JSON\n\n"
          "Appends one message to a conversation (POST {url}/v1/conversations/CONV/messages)\n"
          "and prints the answer, {\"seq\":N,\"id\":\"...\"}, on stdout.\n\n"
          "  --url              http[s]://host[:port][/prefix] of a node, or of a proxy in\n"
          "                     front of it; https verifies the certificate and the host\n"
          "  --tls-ca           PEM file of the CA certificates to trust for https instead\n"
          "                     of the system's\n"
          "  --api-key          the node's API key; default: $" SEND_API_KEY_ENV "\n"
          "  --conv             the conversation id\n"
          "  --sender           the sender id stored with the message\n"
          "  --idempotency-key  the message id; default: a random UUID. Every attempt sends\n"
          "                     the same key: the message is stored once\n"
          "  --retries          retries after a 503 or a connection failure (default %d,\n"
          "                     at most %d)\n"
          "  --timeout-ms       deadline of each attempt, connect to answer (default %d)\n\n"
          "BODY_JSON is any JSON value, e.g. '{\"text\":\"hello\"}'. Exit status: 0 sent,\n"
          "1 failed (an HTTP error, or retries used up), 2 bad usage.\n",
          SEND_DEFAULT_RETRIES, SEND_MAX_RETRIES, SEND_DEFAULT_TIMEOUT_MS);
}

static int bad_usage(const char *fmt, const char *arg) {
  fputs("converger send: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs(" (see converger send --help)\n", stderr);
  return 2;
}

/* 0 ready, 1 --help printed, 2 bad usage (reported). */
static int parse_args(int argc, char **argv, opts_t *o) {
  const char *retries = NULL, *timeout = NULL;
  int only_positional = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v;
    int missing = 0;
    if (!only_positional && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
      usage(stdout);
      return 1;
    }
    if (only_positional || strncmp(a, "--", 2) != 0) { /* "-1" is JSON, not a flag */
      if (o->body) return bad_usage("unexpected argument \"%s\": give one BODY_JSON", a);
      o->body = a;
      continue;
    }
    if (strcmp(a, "--") == 0)
      only_positional = 1;
    else if ((v = cli_flag_value(argc, argv, &i, "--url", &missing)))
      o->url = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--api-key", &missing)))
      o->api_key = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--conv", &missing)))
      o->conv = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--sender", &missing)))
      o->sender = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--idempotency-key", &missing)))
      o->key = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--retries", &missing)))
      retries = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--tls-ca", &missing)))
      o->tls_ca = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--timeout-ms", &missing)))
      timeout = v;
    else if (!missing)
      return bad_usage("unknown option \"%s\"", a);
    if (missing) return bad_usage("%s needs a value", a);
  }
  if (retries && cli_parse_ll(retries, 0, SEND_MAX_RETRIES, &o->retries) != 0)
    return bad_usage("invalid --retries \"%s\": want an integer in [0, 100]", retries);
  if (timeout && cli_parse_ll(timeout, 1, SEND_MAX_TIMEOUT_MS, &o->timeout_ms) != 0)
    return bad_usage("invalid --timeout-ms \"%s\": want milliseconds in [1, 600000]", timeout);
  if (!o->api_key) o->api_key = getenv(SEND_API_KEY_ENV);
  if (!o->url) return bad_usage("%s", "--url is required");
  if (!o->conv) return bad_usage("%s", "--conv is required");
  if (!o->sender) return bad_usage("%s", "--sender is required");
  if (!o->api_key || !*o->api_key)
    return bad_usage("%s", "--api-key (or " SEND_API_KEY_ENV ") is required");
  for (const unsigned char *s = (const unsigned char *)o->api_key; *s; s++)
    if (*s < 0x20 || *s == 0x7f) return bad_usage("%s", "the API key contains a control character");
  if (!util_id_valid(o->conv))
    return bad_usage("invalid --conv \"%s\": want an id ([A-Za-z0-9._:-]{1,128})", o->conv);
  if (!util_id_valid(o->sender))
    return bad_usage("invalid --sender \"%s\": want an id ([A-Za-z0-9._:-]{1,128})", o->sender);
  if (o->key && !util_id_valid(o->key))
    return bad_usage("invalid --idempotency-key \"%s\": want an id ([A-Za-z0-9._:-]{1,128})",
                     o->key);
  if (!o->body) return bad_usage("%s", "BODY_JSON is required");
  return 0;
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A malloc'ed formatted string, or NULL when out of memory. */
static char *str_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

/* The node's retry hint of a 503 in ms, or -1: the body's
 * error.retryAfterMs (or a top-level retryAfterMs), else Retry-After. */
static int64_t hint_ms(const httpc_response_t *resp) {
  int64_t ms = -1;
  json_t *v = json_loads(resp->body, 0, NULL);
  json_t *h = json_object_get(json_object_get(v, "error"), "retryAfterMs");
  if (!h) h = json_object_get(v, "retryAfterMs");
  if (json_is_integer(h) && json_integer_value(h) >= 0) ms = json_integer_value(h);
  json_decref(v);
  if (ms < 0 && resp->retry_after_s >= 0) ms = (int64_t)resp->retry_after_s * 1000;
  return ms < 0 ? -1 : ms > SEND_HINT_CAP_MS ? SEND_HINT_CAP_MS : ms;
}

/* An error answer, on one line: compact JSON when it is JSON, else the raw
 * text without line breaks; at most SEND_SHOWN_BODY_MAX bytes. malloc'ed. */
static char *shown_body(const httpc_response_t *resp) {
  json_t *v = json_loads(resp->body, JSON_DECODE_ANY, NULL);
  char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : strdup(resp->body);
  json_decref(v);
  if (!s) return NULL;
  for (char *p = s; *p; p++)
    if (*p == '\r' || *p == '\n') *p = ' ';
  if (strlen(s) > SEND_SHOWN_BODY_MAX) strcpy(s + SEND_SHOWN_BODY_MAX - 3, "...");
  return s;
}

/* Print {"seq":N,"id":"..."} from a 200/201 answer. 0, or 1 when the
 * answer does not have them. */
static int print_answer(const httpc_response_t *resp, const char *target) {
  json_t *v = json_loads(resp->body, 0, NULL);
  json_t *seq = json_object_get(v, "seq"), *id = json_object_get(v, "id");
  json_t *out = json_is_integer(seq) && json_is_string(id)
                    ? json_pack("{s:O, s:O}", "seq", seq, "id", id)
                    : NULL;
  char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
  json_decref(out);
  json_decref(v);
  if (!text) {
    char *b = shown_body(resp);
    fprintf(stderr, "converger send: %d from %s without \"seq\" and \"id\": %s\n", resp->status,
            target, b ? b : "");
    free(b);
    return 1;
  }
  printf("%s\n", text);
  free(text);
  return fflush(stdout) == 0 ? 0 : 1;
}

/* Attempt the request until it succeeds, fails for good or the retries
 * are used up. Returns the exit status. */
static int send_with_retries(const opts_t *o, const httpc_request_t *req, const char *target) {
  jitter_rng_t rng;
  jitter_seed_random(&rng);
  int64_t backoff = SEND_BACKOFF_BASE_MS;
  long attempts = o->retries + 1;
  for (long attempt = 1;; attempt++) {
    httpc_response_t resp;
    char why[256], reason[512];
    int st = httpc_request(req, &resp, why, sizeof why);
    if (st == 200 || st == 201) {
      int r = print_answer(&resp, target);
      httpc_response_free(&resp);
      return r;
    }
    int64_t wait;
    if (st == 503) {
      char *b = shown_body(&resp);
      snprintf(reason, sizeof reason, "503 from %s: %s", target, b ? b : "");
      free(b);
      wait = hint_ms(&resp);
    } else if (st < 0 && httpc_retryable(st)) {
      snprintf(reason, sizeof reason, "%s: %s", target, why);
      wait = -1;
    } else if (st < 0) {
      fprintf(stderr, "converger send: %s: %s\n", target, why);
      return 1;
    } else {
      char *b = shown_body(&resp);
      fprintf(stderr, "converger send: HTTP %d from %s: %s\n", st, target, b ? b : "");
      free(b);
      httpc_response_free(&resp);
      return 1;
    }
    httpc_response_free(&resp);
    if (attempt >= attempts) {
      fprintf(stderr, "converger send: giving up after %ld attempt%s: %s\n", attempts,
              attempts == 1 ? "" : "s", reason);
      return 1;
    }
    if (wait < 0)
      wait = backoff =
          jitter_decorrelated(&rng, SEND_BACKOFF_BASE_MS, SEND_BACKOFF_CAP_MS, backoff);
    fprintf(stderr, "converger send: %s, retrying in %lld ms (attempt %ld of %ld)\n", reason,
            (long long)wait, attempt + 1, attempts);
    uv_sleep((unsigned)wait);
  }
}

int send_main(int argc, char **argv) {
  opts_t o = {.retries = SEND_DEFAULT_RETRIES, .timeout_ms = SEND_DEFAULT_TIMEOUT_MS};
  int r = parse_args(argc, argv, &o);
  if (r != 0) return r == 1 ? 0 : 2;

  httpc_url_t url;
  char err[256];
  if (httpc_parse_url(o.url, &url, err, sizeof err) != 0) {
    fprintf(stderr, "converger send: bad --url: %s\n", err);
    return 2;
  }
  if (o.tls_ca && !url.tls) {
    fprintf(stderr, "converger send: --tls-ca is for an https:// --url\n");
    return 2;
  }
  json_error_t jerr;
  json_t *body = json_loads(o.body, JSON_DECODE_ANY, &jerr);
  if (!body) {
    fprintf(stderr, "converger send: BODY_JSON is not valid JSON: %s (line %d, column %d)\n",
            jerr.text, jerr.line, jerr.column);
    return 2;
  }
  json_t *msg = json_pack("{s:s, s:o}", "sender", o.sender, "body", body);
  char *msg_text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
  json_decref(msg);

  char key[37];
  if (!o.key) {
    util_uuid(key);
    o.key = key;
  }
  int v6 = strchr(url.host, ':') != NULL;
  char *path = str_printf("%s/v1/conversations/%s/messages", url.prefix, o.conv);
  char *headers =
      str_printf("Authorization: Bearer %s\r\nIdempotency-Key: %s\r\n", o.api_key, o.key);
  char *target = str_printf("POST http%s://%s%s%s:%d%s", url.tls ? "s" : "", v6 ? "[" : "",
                            url.host, v6 ? "]" : "", url.port, path ? path : "");
  int status = 1;
  if (!msg_text || !path || !headers || !target) {
    fprintf(stderr, "converger send: out of memory\n");
  } else {
    httpc_request_t req = {.host = url.host,
                           .port = url.port,
                           .method = "POST",
                           .path = path,
                           .headers = headers,
                           .body = msg_text,
                           .timeout_ms = (int)o.timeout_ms,
                           .tls = url.tls,
                           .tls_ca_file = o.tls_ca};
    status = send_with_retries(&o, &req, target);
  }
  free(target);
  free(headers);
  free(path);
  free(msg_text);
  return status;
}
