/* fleet.c: see fleet.h. */
#include "cli/fleet.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/urlauth.h"

/* One request to `url` + `path`; the answer's JSON object (caller
 * decrefs) when it is `want`, else NULL with the reason in err. */
static json_t *call(const fleet_t *f, const httpc_url_t *url, const char *method, const char *path,
                    const char *body, int want, int *status, char *err, size_t len) {
  char full[HTTPC_PREFIX_MAX + 64], headers[600];
  snprintf(full, sizeof full, "%s%s", url->prefix, path);
  snprintf(headers, sizeof headers, "Authorization: Bearer %s\r\n", f->api_key ? f->api_key : "");
  httpc_request_t req = {.host = url->host,
                         .port = url->port,
                         .method = method,
                         .path = full,
                         .headers = headers,
                         .body = body,
                         .timeout_ms = f->timeout_ms > 0 ? f->timeout_ms : 2000,
                         .interrupted = f->interrupted,
                         .tls = url->tls};
  httpc_response_t resp;
  int st = httpc_request(&req, &resp, err, len);
  if (status) *status = st;
  if (st < 0) return NULL;
  json_t *js = json_loads(resp.body, 0, NULL);
  if (st != want || !json_is_object(js)) {
    snprintf(err, len, "%s %s: HTTP %d %.200s", method, path, st, resp.body);
    json_decref(js);
    js = NULL;
  }
  httpc_response_free(&resp);
  return js;
}

static int add(fleet_t *f, const char *id, const char *base, char *err, size_t len) {
  fleet_node_t *v = realloc(f->v, (f->n + 1) * sizeof *v);
  if (!v) {
    snprintf(err, len, "out of memory");
    return -1;
  }
  f->v = v;
  fleet_node_t *nd = &v[f->n];
  memset(nd, 0, sizeof *nd);
  char why[256];
  if (httpc_parse_url(base, &nd->url, why, sizeof why) != 0) {
    snprintf(err, len, "node %s: %s: %s", id ? id : "?", base, why);
    return -1;
  }
  snprintf(nd->id, sizeof nd->id, "%s", id ? id : base);
  snprintf(nd->shown, sizeof nd->shown, "%s", base);
  nd->cpu = -1;
  f->n++;
  return 0;
}

/* The id node i says it is (GET /admin/status's "node") into out[outlen];
 * 0, or -1 with why[whylen] (no answer, or no id in it). */
static int status_id(fleet_t *f, size_t i, char *out, size_t outlen, char *why, size_t whylen) {
  json_t *js = call(f, &f->v[i].url, "GET", "/admin/status", NULL, 200, NULL, why, whylen);
  const char *id = js ? json_string_value(json_object_get(js, "node")) : NULL;
  if (id)
    snprintf(out, outlen, "%s", id);
  else if (js)
    snprintf(why, whylen, "no node id in /admin/status");
  json_decref(js);
  return id ? 0 : -1;
}

int fleet_from_cluster(fleet_t *f, const char *url, char *err, size_t len) {
  httpc_url_t u;
  if (httpc_parse_url(url, &u, err, len) != 0) return -1;
  json_t *js = call(f, &u, "GET", "/admin/cluster", NULL, 200, NULL, err, len);
  if (!js) return -1;
  json_t *nodes = json_object_get(js, "nodes"), *nd;
  size_t i;
  int r = 0;
  json_array_foreach(nodes, i, nd) {
    const char *id = json_string_value(json_object_get(nd, "id"));
    const char *pub = json_string_value(json_object_get(nd, "publicUrl"));
    const char *adm = json_string_value(json_object_get(nd, "adminUrl"));
    if (!id || !pub) continue;
    if (adm && adm[0]) { /* its admin listener (CONVERGER_ADMIN_LISTEN) */
      if ((r = add(f, id, adm, err, len)) != 0) break;
      continue;
    }
    /* no admin listener: ws[s]://host:port/prefix/v1/ws -> http[s]://host:port/prefix */
    char base[600];
    int tls;
    size_t scheme = urlauth_ws_scheme(pub, &tls);
    if (!scheme) {
      snprintf(err, len,
               "node %s: publicUrl %s is not ws:// or wss:// (use --nodes with its admin URL)", id,
               pub);
      r = -1;
      break;
    }
    snprintf(base, sizeof base, "http%s://%s", tls ? "s" : "", pub + scheme);
    size_t bl = strlen(base);
    if (bl > 6 && strcmp(base + bl - 6, "/v1/ws") == 0) base[bl - 6] = '\0';
    if ((r = add(f, id, base, err, len)) != 0) break;
  }
  json_decref(js);
  if (r == 0 && f->n == 0) {
    snprintf(err, len, "%s/admin/cluster lists no live node", url);
    r = -1;
  }
  /* Each URL must reach the node its row names: an admin listener on
   * another host's loopback, say, would not. */
  for (size_t i = 0; r == 0 && i < f->n; i++) {
    char why[400], id[FLEET_ID_MAX + 1];
    int ok = status_id(f, i, id, sizeof id, why, sizeof why) == 0;
    if (!ok || strcmp(id, f->v[i].id) != 0) {
      snprintf(err, len,
               "node %s: %s %s%s (its admin listener must be reachable from here: "
               "CONVERGER_ADMIN_LISTEN on an address this host reaches, or --nodes)",
               f->v[i].id, f->v[i].shown,
               ok ? "answers as node " : "does not answer: ", ok ? id : why);
      r = -1;
    }
  }
  return r;
}

int fleet_from_urls(fleet_t *f, const char *csv, char *err, size_t len) {
  char *copy = strdup(csv), *save = NULL;
  if (!copy) {
    snprintf(err, len, "out of memory");
    return -1;
  }
  int r = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok && r == 0; tok = strtok_r(NULL, ",", &save))
    if (*tok) r = add(f, NULL, tok, err, len);
  free(copy);
  if (r != 0) return r;
  if (f->n == 0) {
    snprintf(err, len, "--nodes names no URL");
    return -1;
  }
  for (size_t i = 0; i < f->n; i++) { /* their ids */
    char why[400];
    if (status_id(f, i, f->v[i].id, sizeof f->v[i].id, why, sizeof why) != 0) {
      snprintf(err, len, "%s: %s", f->v[i].shown, why);
      return -1;
    }
  }
  return 0;
}

static int64_t get_int(json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}

void fleet_sample_node(fleet_t *f, size_t i) {
  {
    fleet_node_t *nd = &f->v[i];
    char why[400];
    int st = 0;
    json_t *js = call(f, &nd->url, "GET", "/admin/status", NULL, 200, &st, why, sizeof why);
    if (!js && st != -ECONNREFUSED && nd->up && ++nd->missed < FLEET_MISSES)
      return; /* slow, not gone: the last figures stand */
    nd->missed = 0;
    nd->up = js != NULL;
    if (!js) {
      nd->ready = 0;
      nd->connections = 0;
      nd->cpu = -1;
      snprintf(nd->state, sizeof nd->state, "down");
      return;
    }
    nd->ready = json_is_true(json_object_get(js, "ready"));
    snprintf(nd->state, sizeof nd->state, "%s",
             json_string_value(json_object_get(js, "state")) ?: "?");
    nd->connections = get_int(js, "connections");
    nd->capacity = get_int(js, "capacity");
    json_t *u = json_object_get(js, "loopUtilisation");
    nd->cpu = json_is_number(u) ? json_number_value(u) : -1;
    json_t *dp = json_object_get(js, "drainProgress");
    nd->told = (int)get_int(dp, "told");
    nd->moved = (int)get_int(dp, "moved");
    nd->closed = (int)get_int(dp, "closed");
    nd->remaining = (int)get_int(dp, "remaining");
    nd->drain_window_ms = (int)get_int(js, "drainWindowMs");
    nd->drain_shutdown_ms = (int)get_int(js, "drainShutdownMs");
    nd->started_at = json_number_value(json_object_get(js, "startedAt"));
    json_decref(js);
  }
}

int fleet_readyz(fleet_t *f, size_t i) {
  char why[400];
  int st = 0;
  json_t *js = call(f, &f->v[i].url, "GET", "/readyz", NULL, 200, &st, why, sizeof why);
  json_decref(js);
  return st == 200;
}

int fleet_post(fleet_t *f, size_t i, const char *path, const char *body, char *err, size_t len) {
  int st = 0;
  json_t *js = call(f, &f->v[i].url, "POST", path, body, 0, &st, err, len);
  json_decref(js);
  return st;
}

void fleet_free(fleet_t *f) {
  free(f->v);
  f->v = NULL;
  f->n = 0;
}
