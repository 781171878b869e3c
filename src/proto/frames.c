#include "proto/frames.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "common/util.h"

#define WHY(...) snprintf(why, why_len, __VA_ARGS__)

/* An optional epoch: absent or null is "", else a string of 1 to
 * STORE_EPOCH_MAX characters of an id. -1 when it is anything else. */
static int get_epoch(json_t *v, char out[STORE_EPOCH_MAX + 1]) {
  out[0] = '\0';
  if (v == NULL || json_is_null(v)) return 0;
  const char *e = json_string_value(v);
  if (!e || strlen(e) > STORE_EPOCH_MAX || !util_id_valid(e)) return -1;
  strcpy(out, e);
  return 0;
}

/* presenceEvents: absent, null, false, true, "users" or "clients". -1 else. */
static int get_events(json_t *v, int *out) {
  const char *str = json_string_value(v);
  if (v == NULL || json_is_false(v) || json_is_null(v))
    *out = FRAME_EVENTS_NONE;
  else if (json_is_true(v) || (str && strcmp(str, "users") == 0))
    *out = FRAME_EVENTS_USERS;
  else if (str && strcmp(str, "clients") == 0)
    *out = FRAME_EVENTS_CLIENTS;
  else
    return -1;
  return 0;
}

static int get_watermark(json_t *v, int64_t *out) {
  if (v == NULL || json_is_null(v)) {
    *out = FRAME_WATERMARK_NONE;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
  *out = json_integer_value(v);
  return 0;
}

int frame_decode(const char *text, size_t len, int max_subs, frame_client_t *out, char *why,
                 size_t why_len) {
  json_error_t jerr;
  memset(out, 0, sizeof *out);
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    WHY("malformed JSON: %s", jerr.text);
    return -CV_EINVAL;
  }
  out->root = root;
  const char *type = NULL;
  if (!json_is_object(root)) {
    WHY("a frame must be a JSON object");
    goto bad;
  }
  type = json_string_value(json_object_get(root, "type"));
  if (!type) {
    WHY("missing string field \"type\"");
    goto bad;
  }
  if (strcmp(type, "hello") == 0) {
    out->type = FRAME_HELLO;
    out->token = json_string_value(json_object_get(root, "token"));
    json_t *subs = json_object_get(root, "subs");
    if (!out->token) {
      WHY("hello needs a string \"token\"");
      goto bad;
    }
    /* 1.1: none at all is fine, the client subscribes later */
    if (!json_is_array(subs) || json_array_size(subs) > (size_t)max_subs) {
      WHY("hello needs \"subs\": an array of 0 to %d subscriptions", max_subs);
      goto bad;
    }
    json_t *client = json_object_get(root, "client");
    if (client && !json_is_string(client)) {
      WHY("\"client\" must be a string");
      goto bad;
    }
    json_t *cid = json_object_get(root, "clientId");
    if (cid && !json_is_null(cid) && !util_id_valid(json_string_value(cid))) {
      WHY("\"clientId\" must be an id matching [A-Za-z0-9._:-]{1,128}");
      goto bad;
    }
    out->client_id = json_string_value(cid);
    out->nsubs = json_array_size(subs);
    out->subs = calloc(out->nsubs, sizeof *out->subs);
    if (!out->subs) {
      WHY("out of memory");
      goto bad;
    }
    for (size_t i = 0; i < out->nsubs; i++) {
      json_t *s = json_array_get(subs, i);
      const char *conv = json_string_value(json_object_get(s, "conv"));
      if (!json_is_object(s) || !util_id_valid(conv)) {
        WHY("subs[%zu].conv must be an id matching [A-Za-z0-9._:-]{1,128}", i);
        goto bad;
      }
      if (get_watermark(json_object_get(s, "watermark"), &out->subs[i].watermark) != 0) {
        WHY("subs[%zu].watermark must be null or an integer >= 0", i);
        goto bad;
      }
      if (get_events(json_object_get(s, "presenceEvents"), &out->subs[i].presence_events) != 0) {
        WHY("subs[%zu].presenceEvents must be a boolean, \"users\" or \"clients\"", i);
        goto bad;
      }
      if (get_epoch(json_object_get(s, "epoch"), out->subs[i].epoch) != 0) {
        WHY("subs[%zu].epoch must be null or a string of 1 to %d characters [A-Za-z0-9._:-]", i,
            STORE_EPOCH_MAX);
        goto bad;
      }
      for (size_t k = 0; k < i; k++)
        if (strcmp(out->subs[k].conv, conv) == 0) {
          WHY("conversation %s appears twice in subs", conv);
          goto bad;
        }
      strcpy(out->subs[i].conv, conv);
    }
    return 0;
  }
  /* The frames about one conversation: `conv` first, then their own fields. */
  static const struct {
    const char *name;
    frame_type_t type;
  } conv_frames[] = {{"sync", FRAME_SYNC},           {"send", FRAME_SEND},
                     {"subscribe", FRAME_SUBSCRIBE}, {"unsubscribe", FRAME_UNSUBSCRIBE},
                     {"presence", FRAME_PRESENCE},   {"signal", FRAME_SIGNAL}};
  for (size_t k = 0; k < sizeof conv_frames / sizeof conv_frames[0]; k++) {
    if (strcmp(type, conv_frames[k].name) != 0) continue;
    out->type = conv_frames[k].type;
    out->conv = json_string_value(json_object_get(root, "conv"));
    if (!util_id_valid(out->conv)) {
      WHY("%s needs \"conv\": an id matching [A-Za-z0-9._:-]{1,128}", type);
      goto bad;
    }
    switch (out->type) {
    case FRAME_SYNC: {
      json_t *w = json_object_get(root, "watermark");
      if (!w || get_watermark(w, &out->watermark) != 0 || out->watermark < 0) {
        WHY("sync needs \"watermark\": an integer >= 0");
        goto bad;
      }
      break;
    }
    case FRAME_SUBSCRIBE:
      if (get_watermark(json_object_get(root, "watermark"), &out->watermark) != 0) {
        WHY("subscribe's \"watermark\" must be null or an integer >= 0");
        goto bad;
      }
      if (get_events(json_object_get(root, "presenceEvents"), &out->presence_events) != 0) {
        WHY("subscribe's \"presenceEvents\" must be a boolean, \"users\" or \"clients\"");
        goto bad;
      }
      break;
    case FRAME_PRESENCE: {
      json_t *limit = json_object_get(root, "limit");
      json_t *cursor = json_object_get(root, "cursor");
      json_t *members = json_object_get(root, "members");
      out->limit = FRAME_PRESENCE_PAGE;
      out->members = 1;
      if (limit && (!json_is_integer(limit) || json_integer_value(limit) < 1 ||
                    json_integer_value(limit) > FRAME_PRESENCE_PAGE_MAX)) {
        WHY("presence's \"limit\" must be an integer from 1 to %d", FRAME_PRESENCE_PAGE_MAX);
        goto bad;
      }
      if (limit) out->limit = (int)json_integer_value(limit);
      if (cursor && !json_is_null(cursor) && !util_id_valid(json_string_value(cursor))) {
        WHY("presence's \"cursor\" must be null or the cursor of the page before");
        goto bad;
      }
      out->cursor = json_string_value(cursor);
      if (members && !json_is_boolean(members)) {
        WHY("presence's \"members\" must be a boolean");
        goto bad;
      }
      if (members) out->members = json_is_true(members);
      return 0;
    }
    case FRAME_SIGNAL:
      out->body = json_object_get(root, "body");
      if (!out->body) {
        WHY("signal needs a \"body\"");
        goto bad;
      }
      return 0;
    case FRAME_SEND:
      out->id = json_string_value(json_object_get(root, "id"));
      out->body = json_object_get(root, "body");
      if (!util_id_valid(out->id)) {
        WHY("send needs \"id\": an id matching [A-Za-z0-9._:-]{1,128}");
        goto bad;
      }
      if (!out->body) {
        WHY("send needs a \"body\"");
        goto bad;
      }
      return 0;
    default: /* unsubscribe: conv only */
      return 0;
    }
    /* sync and subscribe: the epoch their watermark is in */
    if (get_epoch(json_object_get(root, "epoch"), out->epoch) != 0) {
      WHY("%s's \"epoch\" must be null or a string of 1 to %d characters [A-Za-z0-9._:-]", type,
          STORE_EPOCH_MAX);
      goto bad;
    }
    return 0;
  }
  if (strcmp(type, "ping") == 0) {
    out->type = FRAME_PING;
    return 0;
  }
  if (strcmp(type, "refresh") == 0) {
    out->type = FRAME_REFRESH;
    out->token = json_string_value(json_object_get(root, "token"));
    if (!out->token) {
      WHY("refresh needs a string \"token\"");
      goto bad;
    }
    return 0;
  }
  WHY("unknown frame type \"%.40s\"", type);
  frame_client_clear(out);
  return -CV_EINVAL;
bad : {
  frame_type_t t = out->type;
  /* `type` and `conv` point into root: decide and copy before clearing. */
  int known = type != NULL && (t != FRAME_HELLO || strcmp(type, "hello") == 0);
  char conv[STORE_ID_MAX + 1] = "";
  if (known && util_id_valid(out->conv)) /* util_id_valid bounds it to STORE_ID_MAX */
    strcpy(conv, out->conv);
  frame_client_clear(out);
  out->type = t;
  out->known_type = known;
  strcpy(out->bad_conv, conv);
  return -CV_EINVAL;
}
}

void frame_client_clear(frame_client_t *f) {
  free(f->subs);
  json_decref(f->root);
  memset(f, 0, sizeof *f);
}

char *frame_dump(json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); }

static char *dump_steal(json_t *v) {
  if (!v) return NULL;
  char *s = frame_dump(v);
  json_decref(v);
  return s;
}

/* A JSON string literal for `s`: ids (the usual case) need no escaping and
 * are quoted directly; anything else goes through jansson. Heap; NULL on
 * OOM. */
static char *quote(const char *s) {
  if (util_id_valid(s)) {
    size_t n = strlen(s);
    char *q = malloc(n + 3);
    if (q) {
      q[0] = '"';
      memcpy(q + 1, s, n);
      q[n + 1] = '"';
      q[n + 2] = '\0';
    }
    return q;
  }
  return dump_steal(json_string(s));
}

char *frame_msg(const char *conv, const store_msg_t *m) {
  /* The body is stored as JSON text: splice it in rather than re-parse it. */
  char ts[25];
  util_format_ts(m->ts_ms, ts);
  char *conv_s = quote(conv);
  char *id_s = quote(m->id);
  char *sender_s = quote(m->sender ? m->sender : "");
  char *out = NULL;
  if (conv_s && id_s && sender_s) {
    size_t n = strlen(conv_s) + strlen(id_s) + strlen(sender_s) + strlen(m->body) + 160;
    out = malloc(n);
    if (out)
      snprintf(out, n,
               "{\"type\":\"msg\",\"conv\":%s,\"seq\":%lld%s%s%s,\"id\":%s,\"sender\":%s,"
               "\"ts\":\"%s\",\"body\":%s}",
               conv_s, (long long)m->seq, m->epoch[0] ? ",\"epoch\":\"" : "", m->epoch,
               m->epoch[0] ? "\"" : "", id_s, sender_s, ts, m->body);
  }
  free(conv_s);
  free(id_s);
  free(sender_s);
  return out;
}

char *frame_error(const char *code, const char *message, const char *conv, long retry_after_ms,
                  json_t *details) {
  json_t *v = json_pack("{s:s, s:s, s:s}", "type", "error", "code", code, "message", message);
  if (!v) {
    json_decref(details);
    return NULL;
  }
  if (conv) json_object_set_new(v, "conv", json_string(conv));
  if (retry_after_ms > 0) json_object_set_new(v, "retryAfterMs", json_integer(retry_after_ms));
  if (details) json_object_set_new(v, "details", details);
  return dump_steal(v);
}

char *frame_synced(const char *conv, int64_t head, const char *epoch, int reset) {
  json_t *v =
      json_pack("{s:s, s:s, s:I}", "type", "synced", "conv", conv, "head", (json_int_t)head);
  if (v && epoch && epoch[0]) json_object_set_new(v, "epoch", json_string(epoch));
  if (v && reset) json_object_set_new(v, "reset", json_true());
  return dump_steal(v);
}

char *frame_sent(const char *conv, const char *id, int64_t seq) {
  return dump_steal(json_pack("{s:s, s:s, s:s, s:I}", "type", "sent", "conv", conv, "id", id, "seq",
                              (json_int_t)seq));
}

char *frame_subscribed(const char *conv, int64_t head, const char *epoch, int presence, int reset,
                       int already) {
  json_t *v = json_pack("{s:s, s:s, s:I, s:s, s:b}", "type", "subscribed", "conv", conv, "head",
                        (json_int_t)head, "epoch", epoch, "presence", presence);
  if (v && reset) json_object_set_new(v, "reset", json_true());
  if (v && already) json_object_set_new(v, "already", json_true());
  return dump_steal(v);
}

char *frame_unsubscribed(const char *conv) {
  return dump_steal(json_pack("{s:s, s:s}", "type", "unsubscribed", "conv", conv));
}

char *frame_refreshed(int64_t expires_in_ms) {
  return dump_steal(
      json_pack("{s:s, s:I}", "type", "refreshed", "expiresInMs", (json_int_t)expires_in_ms));
}

char *frame_pong(void) { return strdup("{\"type\":\"pong\"}"); }

char *frame_drain(int64_t after_ms, const char *reconnect_to, int64_t deadline_ms) {
  char *url = reconnect_to ? quote(reconnect_to) : strdup("null"), *out = NULL;
  if (url && asprintf(&out, "{\"type\":\"drain\",\"afterMs\":%lld,\"reconnectTo\":%s,\"deadlineMs\":%lld}",
                      (long long)after_ms, url, (long long)deadline_ms) < 0)
    out = NULL;
  free(url);
  return out;
}

char *frame_presence(const char *conv, const store_member_t *m, size_t n, int64_t count,
                     int with_members, const char *cursor, int truncated) {
  json_t *f =
      json_pack("{s:s, s:s, s:I}", "type", "presence", "conv", conv, "count", (json_int_t)count);
  if (!f) return NULL;
  if (with_members) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
      json_array_append_new(a, json_pack("{s:s, s:I, s:I}", "user", m[i].user, "clients",
                                         (json_int_t)m[i].clients, "since",
                                         (json_int_t)m[i].since_ms));
    json_object_set_new(f, "members", a ? a : json_null());
    json_object_set_new(f, "cursor", cursor ? json_string(cursor) : json_null());
  }
  if (truncated) json_object_set_new(f, "truncated", json_true());
  return dump_steal(f);
}

char *frame_presence_event(int join, const char *conv, const char *user, const char *client) {
  return dump_steal(json_pack("{s:s, s:s, s:s, s:s}", "type", join ? "join" : "leave", "conv", conv,
                              "user", user, "client", client));
}

char *frame_signal(const char *conv, const char *sender, int64_t ts_ms, const char *body) {
  /* The body is JSON text already (the client's, or a notification's): put
   * in as it is, as frame_msg does with a stored body. */
  json_t *f = json_pack("{s:s, s:s, s:s, s:I}", "type", "signal", "conv", conv, "sender", sender,
                        "ts", (json_int_t)ts_ms);
  char *head = dump_steal(f), *out = NULL;
  if (!head) return NULL;
  size_t hl = strlen(head); /* ends with '}' */
  if (asprintf(&out, "%.*s,\"body\":%s}", (int)(hl - 1), head, body) < 0) out = NULL;
  free(head);
  return out;
}
