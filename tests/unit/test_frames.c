/* Unit tests for proto/frames: client frame decoding and server frame text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/errors.h"
#include "proto/frames.h"

static int decode(const char *text, frame_client_t *f, char *why) {
  return frame_decode(text, strlen(text), 3, f, why, 200);
}

static void test_hello(void **state) {
  frame_client_t f;
  char why[200];
  assert_int_equal(
      decode("{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"watermark\":5,"
             "\"epoch\":\"9f00aa01\"},"
             "{\"conv\":\"b\",\"watermark\":null},{\"conv\":\"c\"}],\"client\":\"x/1\"}",
             &f, why),
      0);
  assert_int_equal(f.type, FRAME_HELLO);
  assert_string_equal(f.token, "t");
  assert_int_equal(f.nsubs, 3);
  assert_string_equal(f.subs[0].conv, "a");
  assert_int_equal(f.subs[0].watermark, 5);
  assert_int_equal(f.subs[1].watermark, FRAME_WATERMARK_NONE);
  assert_int_equal(f.subs[2].watermark, FRAME_WATERMARK_NONE);
  assert_string_equal(f.subs[0].epoch, "9f00aa01");
  assert_string_equal(f.subs[1].epoch, ""); /* not given */
  frame_client_clear(&f);
  /* protocol 1.1: a hello without subscriptions (the client subscribes later) */
  assert_int_equal(decode("{\"type\":\"hello\",\"token\":\"t\",\"subs\":[]}", &f, why), 0);
  assert_int_equal(f.nsubs, 0);
  assert_null(f.client_id);
  frame_client_clear(&f);
  assert_int_equal(
      decode("{\"type\":\"hello\",\"token\":\"t\",\"subs\":[],\"clientId\":\"tab-7\"}", &f, why),
      0);
  assert_string_equal(f.client_id, "tab-7");
  frame_client_clear(&f);
}

static void test_hello_invalid(void **state) {
  frame_client_t f;
  char why[200];
  const char *bad[] = {
      "{\"type\":\"hello\",\"subs\":[{\"conv\":\"a\"}]}", /* no token */
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":{}}", /* subs not an array */
      "{\"type\":\"hello\",\"token\":\"t\"}",             /* no subs */
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[],\"clientId\":\"a b\"}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[],\"clientId\":7}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\"},{\"conv\":\"b\"},{\"conv\":"
      "\"c\"},{\"conv\":\"d\"}]}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a b\"}]}", /* bad id */
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"watermark\":-1}]}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"watermark\":\"3\"}]}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\"},{\"conv\":\"a\"}]}", /* twice
                                                                                            */
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[\"a\"]}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"epoch\":7}]}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"epoch\":\"\"}]}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"epoch\":\"x\\\"\"}]}",
      "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"epoch\":"
      "\"0123456789abcdef0\"}]}", /* 17 characters */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(decode(bad[i], &f, why), -CV_EINVAL);
    assert_true(f.known_type);
    assert_int_equal(f.type, FRAME_HELLO);
    assert_true(strlen(why) > 0);
  }
}

static void test_malformed_and_unknown(void **state) {
  frame_client_t f;
  char why[200];
  assert_int_equal(decode("{not json", &f, why), -CV_EINVAL);
  assert_false(f.known_type);
  assert_memory_equal(why, "malformed JSON", 14);
  assert_int_equal(decode("[1,2]", &f, why), -CV_EINVAL);
  assert_false(f.known_type);
  assert_int_equal(decode("{\"type\":\"launch\"}", &f, why), -CV_EINVAL);
  assert_false(f.known_type);
  assert_int_equal(decode("{\"type\":7}", &f, why), -CV_EINVAL);
  assert_int_equal(decode("{\"type\":\"ping\",\"type\":\"hello\"}", &f, why), -CV_EINVAL);
}

static void test_sync_send_ping(void **state) {
  frame_client_t f;
  char why[200];
  assert_int_equal(decode("{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":0}", &f, why), 0);
  assert_int_equal(f.type, FRAME_SYNC);
  assert_string_equal(f.conv, "c1");
  assert_int_equal(f.watermark, 0);
  assert_string_equal(f.epoch, "");
  frame_client_clear(&f);
  assert_int_equal(
      decode("{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":4,\"epoch\":\"ab12\"}", &f, why), 0);
  assert_string_equal(f.epoch, "ab12");
  frame_client_clear(&f);
  assert_int_equal(
      decode("{\"type\":\"sync\",\"conv\":\"c1\",\"watermark\":4,\"epoch\":[1]}", &f, why),
      -CV_EINVAL);
  assert_int_equal(decode("{\"type\":\"sync\",\"conv\":\"c1\"}", &f, why), -CV_EINVAL);
  assert_int_equal(f.type, FRAME_SYNC);
  assert_int_equal(
      decode("{\"type\":\"send\",\"conv\":\"c1\",\"id\":\"m-1\",\"body\":{\"t\":[1]}}", &f, why),
      0);
  assert_int_equal(f.type, FRAME_SEND);
  assert_string_equal(f.id, "m-1");
  char *body = frame_dump(f.body);
  assert_string_equal(body, "{\"t\":[1]}");
  free(body);
  frame_client_clear(&f);
  assert_int_equal(decode("{\"type\":\"send\",\"conv\":\"c1\",\"id\":\"m 1\",\"body\":1}", &f, why),
                   -CV_EINVAL);
  assert_int_equal(decode("{\"type\":\"send\",\"conv\":\"c1\",\"id\":\"m1\"}", &f, why),
                   -CV_EINVAL);
  /* protocol 1.1 */
  assert_int_equal(decode("{\"type\":\"subscribe\",\"conv\":\"c2\",\"watermark\":3,"
                          "\"epoch\":\"e1\"}",
                          &f, why),
                   0);
  assert_int_equal(f.type, FRAME_SUBSCRIBE);
  assert_string_equal(f.conv, "c2");
  assert_int_equal(f.watermark, 3);
  assert_string_equal(f.epoch, "e1");
  frame_client_clear(&f);
  assert_int_equal(decode("{\"type\":\"subscribe\",\"conv\":\"c2\"}", &f, why), 0);
  assert_int_equal(f.watermark, FRAME_WATERMARK_NONE);
  frame_client_clear(&f);
  assert_int_equal(decode("{\"type\":\"unsubscribe\",\"conv\":\"c2\"}", &f, why), 0);
  assert_int_equal(f.type, FRAME_UNSUBSCRIBE);
  frame_client_clear(&f);
  assert_int_equal(decode("{\"type\":\"refresh\",\"token\":\"x.y.z\"}", &f, why), 0);
  assert_int_equal(f.type, FRAME_REFRESH);
  assert_string_equal(f.token, "x.y.z");
  frame_client_clear(&f);
  /* each with the conv its error carries: the frame's own when it was
   * valid and a later field was not, none when conv itself was bad */
  const struct {
    const char *text, *conv;
  } bad11[] = {{"{\"type\":\"subscribe\"}", ""},
               {"{\"type\":\"subscribe\",\"conv\":\"a b\"}", ""},
               {"{\"type\":\"subscribe\",\"conv\":7,\"watermark\":1}", ""},
               {"{\"type\":\"subscribe\",\"conv\":\"c\",\"watermark\":-2}", "c"},
               {"{\"type\":\"subscribe\",\"conv\":\"c\",\"epoch\":5}", "c"},
               {"{\"type\":\"subscribe\",\"conv\":\"c-3\",\"presenceEvents\":2}", "c-3"},
               {"{\"type\":\"sync\",\"conv\":\"c4\"}", "c4"},
               {"{\"type\":\"send\",\"conv\":\"c5\",\"id\":\"m1\"}", "c5"},
               {"{\"type\":\"unsubscribe\"}", ""},
               {"{\"type\":\"refresh\"}", ""},
               {"{\"type\":\"refresh\",\"token\":1}", ""},
               {"{\"type\":\"hello\",\"token\":1,\"conv\":\"c\"}", ""}};
  for (size_t i = 0; i < sizeof bad11 / sizeof bad11[0]; i++) {
    assert_int_equal(decode(bad11[i].text, &f, why), -CV_EINVAL);
    assert_true(f.known_type);
    assert_string_equal(f.bad_conv, bad11[i].conv);
  }
  /* a frame that is not one (malformed, unknown type) names no conv either */
  assert_int_equal(decode("{\"type\":\"launch\",\"conv\":\"c\"}", &f, why), -CV_EINVAL);
  assert_string_equal(f.bad_conv, "");
  assert_int_equal(decode("{\"type\":\"sync\",\"conv\":\"c\",", &f, why), -CV_EINVAL);
  assert_string_equal(f.bad_conv, "");
  char *sub = frame_subscribed("c2", 4, "e1", 0, 1, 0);
  assert_string_equal(sub, "{\"type\":\"subscribed\",\"conv\":\"c2\",\"head\":4,\"epoch\":\"e1\","
                           "\"presence\":false,\"reset\":true}");
  free(sub);
  char *ref = frame_refreshed(1500);
  assert_string_equal(ref, "{\"type\":\"refreshed\",\"expiresInMs\":1500}");
  free(ref);
  assert_int_equal(decode("{\"type\":\"ping\"}", &f, why), 0);
  assert_int_equal(f.type, FRAME_PING);
  frame_client_clear(&f);
}

static void test_server_frames(void **state) {
  store_msg_t m = {.seq = 7,
                   .id = "m1",
                   .sender = "o'brien\"; DROP TABLE x; --",
                   .body = "{\"text\":\"h\\u00e9\"}",
                   .ts_ms = 1800000000123LL};
  char *s = frame_msg("room.1", &m);
  assert_string_equal(
      s, "{\"type\":\"msg\",\"conv\":\"room.1\",\"seq\":7,\"id\":\"m1\","
         "\"sender\":\"o'brien\\\"; DROP TABLE x; --\",\"ts\":\"2027-01-15T08:00:00.123Z\","
         "\"body\":{\"text\":\"h\\u00e9\"}}");
  free(s);
  s = frame_synced("c", 12, NULL, 0);
  assert_string_equal(s, "{\"type\":\"synced\",\"conv\":\"c\",\"head\":12}");
  free(s);
  s = frame_synced("c", 12, "0a1b2c3d", 0);
  assert_string_equal(s, "{\"type\":\"synced\",\"conv\":\"c\",\"head\":12,\"epoch\":\"0a1b2c3d\"}");
  free(s);
  s = frame_synced("c", 3, "0a1b2c3d", 1);
  assert_string_equal(
      s, "{\"type\":\"synced\",\"conv\":\"c\",\"head\":3,\"epoch\":\"0a1b2c3d\",\"reset\":true}");
  free(s);
  /* the epoch follows seq when the message has one */
  strcpy(m.epoch, "0a1b2c3d");
  s = frame_msg("c", &m);
  assert_non_null(strstr(s, "\"conv\":\"c\",\"seq\":7,\"epoch\":\"0a1b2c3d\",\"id\":\"m1\","));
  free(s);
  s = frame_sent("c", "i", 3);
  assert_string_equal(s, "{\"type\":\"sent\",\"conv\":\"c\",\"id\":\"i\",\"seq\":3}");
  free(s);
  s = frame_error("replay_unavailable", "later", "c", 2500, json_pack("{s:i}", "watermark", 4));
  json_t *v = json_loads(s, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(v, "type")), "error");
  assert_string_equal(json_string_value(json_object_get(v, "code")), "replay_unavailable");
  assert_int_equal(json_integer_value(json_object_get(v, "retryAfterMs")), 2500);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(v, "details"), "watermark")),
                   4);
  json_decref(v);
  free(s);
  s = frame_error("bad_request", "x", NULL, 0, NULL);
  assert_string_equal(s, "{\"type\":\"error\",\"code\":\"bad_request\",\"message\":\"x\"}");
  free(s);
}

/* ---- v1.2: presence and signals ---------------------------------------------- */

/* Decode `text`, expecting a refusal of a known frame type with a why. */
static void expect_bad(const char *text, frame_type_t type, const char *why_part) {
  frame_client_t f;
  char why[200] = "";
  if (decode(text, &f, why) != -CV_EINVAL) fail_msg("accepted: %s", text);
  assert_true(f.known_type);
  assert_int_equal(f.type, type);
  if (!strstr(why, why_part)) fail_msg("%s: why \"%s\" lacks \"%s\"", text, why, why_part);
}

static void test_presence_frame(void **state) {
  frame_client_t f;
  char why[200];
  /* the defaults: limit 100, the first page, with members */
  assert_int_equal(decode("{\"type\":\"presence\",\"conv\":\"room.1\"}", &f, why), 0);
  assert_int_equal(f.type, FRAME_PRESENCE);
  assert_string_equal(f.conv, "room.1");
  assert_int_equal(f.limit, FRAME_PRESENCE_PAGE);
  assert_int_equal(f.limit, 100);
  assert_null(f.cursor);
  assert_int_equal(f.members, 1);
  frame_client_clear(&f);
  assert_int_equal(decode("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":1,\"cursor\":\"bob\","
                          "\"members\":false}",
                          &f, why),
                   0);
  assert_int_equal(f.limit, 1);
  assert_string_equal(f.cursor, "bob");
  assert_int_equal(f.members, 0);
  frame_client_clear(&f);
  assert_int_equal(decode("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":1000,\"cursor\":null,"
                          "\"members\":true}",
                          &f, why),
                   0);
  assert_int_equal(f.limit, FRAME_PRESENCE_PAGE_MAX);
  assert_null(f.cursor);
  assert_int_equal(f.members, 1);
  frame_client_clear(&f);
  expect_bad("{\"type\":\"presence\"}", FRAME_PRESENCE, "conv");
  expect_bad("{\"type\":\"presence\",\"conv\":\"a b\"}", FRAME_PRESENCE, "conv");
  expect_bad("{\"type\":\"presence\",\"conv\":7}", FRAME_PRESENCE, "conv");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":0}", FRAME_PRESENCE, "limit");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":1001}", FRAME_PRESENCE, "limit");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":-5}", FRAME_PRESENCE, "limit");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":\"10\"}", FRAME_PRESENCE, "limit");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":10.5}", FRAME_PRESENCE, "limit");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"limit\":null}", FRAME_PRESENCE, "limit");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"cursor\":5}", FRAME_PRESENCE, "cursor");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"cursor\":\"\"}", FRAME_PRESENCE, "cursor");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"cursor\":\"a b\"}", FRAME_PRESENCE, "cursor");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"members\":1}", FRAME_PRESENCE, "members");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"members\":\"true\"}", FRAME_PRESENCE,
             "members");
  expect_bad("{\"type\":\"presence\",\"conv\":\"c\",\"members\":null}", FRAME_PRESENCE, "members");
}

static void test_signal_frame(void **state) {
  frame_client_t f;
  char why[200];
  assert_int_equal(
      decode("{\"type\":\"signal\",\"conv\":\"c\",\"body\":{\"typing\":true,\"n\":[1,2]}}", &f,
             why),
      0);
  assert_int_equal(f.type, FRAME_SIGNAL);
  assert_string_equal(f.conv, "c");
  char *body = frame_dump(f.body);
  assert_string_equal(body, "{\"typing\":true,\"n\":[1,2]}");
  free(body);
  frame_client_clear(&f);
  /* any JSON value is a body, null and scalars included */
  const char *bodies[] = {"null", "1", "\"x\"", "[]", "false"};
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"type\":\"signal\",\"conv\":\"c\",\"body\":%s}", bodies[i]);
    assert_int_equal(decode(text, &f, why), 0);
    body = frame_dump(f.body);
    assert_string_equal(body, bodies[i]);
    free(body);
    frame_client_clear(&f);
  }
  expect_bad("{\"type\":\"signal\",\"conv\":\"c\"}", FRAME_SIGNAL, "body");
  expect_bad("{\"type\":\"signal\",\"body\":{}}", FRAME_SIGNAL, "conv");
  expect_bad("{\"type\":\"signal\",\"conv\":\"c d\",\"body\":{}}", FRAME_SIGNAL, "conv");
}

/* presenceEvents on a hello's subscriptions and on subscribe: true and
 * "users" are the users' edges, "clients" every client, false, null and
 * absent none; anything else is refused. */
static void test_presence_events(void **state) {
  frame_client_t f;
  char why[200];
  assert_int_equal(
      decode("{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"presenceEvents\":"
             "true},{\"conv\":\"b\",\"presenceEvents\":\"users\"},{\"conv\":\"c\","
             "\"presenceEvents\":\"clients\"}]}",
             &f, why),
      0);
  assert_int_equal(f.subs[0].presence_events, FRAME_EVENTS_USERS);
  assert_int_equal(f.subs[1].presence_events, FRAME_EVENTS_USERS);
  assert_int_equal(f.subs[2].presence_events, FRAME_EVENTS_CLIENTS);
  frame_client_clear(&f);
  assert_int_equal(
      decode("{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\",\"presenceEvents\":"
             "false},{\"conv\":\"b\"},{\"conv\":\"c\",\"presenceEvents\":null}]}",
             &f, why),
      0);
  assert_int_equal(f.nsubs, 3);
  assert_int_equal(f.subs[0].presence_events, FRAME_EVENTS_NONE);
  assert_int_equal(f.subs[1].presence_events, FRAME_EVENTS_NONE);
  assert_int_equal(f.subs[2].presence_events, FRAME_EVENTS_NONE);
  frame_client_clear(&f);
  const char *hello_bad[] = {"1", "0", "\"all\"", "\"Users\"", "\"\"", "[]", "{}"};
  for (size_t i = 0; i < sizeof hello_bad / sizeof hello_bad[0]; i++) {
    char text[200];
    snprintf(text, sizeof text,
             "{\"type\":\"hello\",\"token\":\"t\",\"subs\":[{\"conv\":\"a\"},{\"conv\":\"b\","
             "\"presenceEvents\":%s}]}",
             hello_bad[i]);
    expect_bad(text, FRAME_HELLO, "subs[1].presenceEvents");
  }
  struct {
    const char *v;
    int want;
  } sub_ok[] = {{"true", FRAME_EVENTS_USERS},
                {"\"users\"", FRAME_EVENTS_USERS},
                {"\"clients\"", FRAME_EVENTS_CLIENTS},
                {"false", FRAME_EVENTS_NONE},
                {"null", FRAME_EVENTS_NONE}};
  for (size_t i = 0; i < sizeof sub_ok / sizeof sub_ok[0]; i++) {
    char text[200];
    snprintf(text, sizeof text, "{\"type\":\"subscribe\",\"conv\":\"c\",\"presenceEvents\":%s}",
             sub_ok[i].v);
    assert_int_equal(decode(text, &f, why), 0);
    assert_int_equal(f.type, FRAME_SUBSCRIBE);
    assert_int_equal(f.presence_events, sub_ok[i].want);
    frame_client_clear(&f);
  }
  assert_int_equal(decode("{\"type\":\"subscribe\",\"conv\":\"c\"}", &f, why), 0);
  assert_int_equal(f.presence_events, FRAME_EVENTS_NONE);
  frame_client_clear(&f);
  for (size_t i = 0; i < sizeof hello_bad / sizeof hello_bad[0]; i++) {
    char text[200];
    snprintf(text, sizeof text, "{\"type\":\"subscribe\",\"conv\":\"c\",\"presenceEvents\":%s}",
             hello_bad[i]);
    expect_bad(text, FRAME_SUBSCRIBE, "presenceEvents");
  }
}

static void test_presence_server_frames(void **state) {
  store_member_t m[2] = {{.user = "alice", .clients = 2, .since_ms = 1800000000123LL, .rank = 1},
                         {.user = "bob", .clients = 1, .since_ms = 1800000000456LL, .rank = 2}};
  char *s = frame_presence("room.1", m, 2, 5, 1, "bob", 0);
  assert_string_equal(s, "{\"type\":\"presence\",\"conv\":\"room.1\",\"count\":5,\"members\":["
                         "{\"user\":\"alice\",\"clients\":2,\"since\":1800000000123},"
                         "{\"user\":\"bob\",\"clients\":1,\"since\":1800000000456}],"
                         "\"cursor\":\"bob\"}");
  free(s);
  /* the last page: cursor null; truncated when users past the bound were counted */
  s = frame_presence("c", m, 1, 3, 1, NULL, 1);
  json_t *v = json_loads(s, 0, NULL);
  assert_non_null(v);
  assert_string_equal(json_string_value(json_object_get(v, "type")), "presence");
  assert_int_equal(json_integer_value(json_object_get(v, "count")), 3);
  assert_int_equal(json_array_size(json_object_get(v, "members")), 1);
  assert_true(json_is_null(json_object_get(v, "cursor")));
  assert_true(json_is_true(json_object_get(v, "truncated")));
  json_decref(v);
  free(s);
  /* nobody present: an empty array */
  s = frame_presence("c", NULL, 0, 0, 1, NULL, 0);
  assert_string_equal(
      s, "{\"type\":\"presence\",\"conv\":\"c\",\"count\":0,\"members\":[],\"cursor\":null}");
  free(s);
  /* the count alone: neither members nor cursor */
  s = frame_presence("c", m, 2, 2, 0, "bob", 0);
  assert_string_equal(s, "{\"type\":\"presence\",\"conv\":\"c\",\"count\":2}");
  free(s);

  s = frame_presence_event(1, "room.1", "alice", "tab-7");
  assert_string_equal(s, "{\"type\":\"join\",\"conv\":\"room.1\",\"user\":\"alice\","
                         "\"client\":\"tab-7\"}");
  free(s);
  s = frame_presence_event(0, "room.1", "alice", "tab-7");
  assert_string_equal(s, "{\"type\":\"leave\",\"conv\":\"room.1\",\"user\":\"alice\","
                         "\"client\":\"tab-7\"}");
  free(s);
}

static void test_signal_server_frame(void **state) {
  /* the body goes in as its text, byte for byte */
  const char *body = "{\"typing\":true,\"x\":[1,{\"y\":\"h\\u00e9\"}],\"z\":null}";
  char *s = frame_signal("room.1", "alice", 1800000000123LL, body);
  assert_string_equal(s, "{\"type\":\"signal\",\"conv\":\"room.1\",\"sender\":\"alice\","
                         "\"ts\":1800000000123,\"body\":{\"typing\":true,\"x\":[1,{\"y\":"
                         "\"h\\u00e9\"}],\"z\":null}}");
  json_error_t err;
  json_t *v = json_loads(s, 0, &err);
  if (!v) fail_msg("not JSON (%s): %s", err.text, s);
  assert_string_equal(json_string_value(json_object_get(v, "type")), "signal");
  assert_string_equal(json_string_value(json_object_get(v, "conv")), "room.1");
  assert_string_equal(json_string_value(json_object_get(v, "sender")), "alice");
  assert_int_equal(json_integer_value(json_object_get(v, "ts")), 1800000000123LL);
  json_t *b = json_object_get(v, "body");
  assert_true(json_is_true(json_object_get(b, "typing")));
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(json_object_get(b, "x"), 1), "y")),
      "h\xc3\xa9");
  json_decref(v);
  free(s);
  /* scalar bodies, and a sender that needs escaping (REST: any string) */
  const char *scalars[] = {"null", "7", "\"hi\"", "[]"};
  for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
    s = frame_signal("c", "o'brien \"x\"", 0, scalars[i]);
    v = json_loads(s, 0, &err);
    if (!v) fail_msg("not JSON (%s): %s", err.text, s);
    assert_string_equal(json_string_value(json_object_get(v, "sender")), "o'brien \"x\"");
    char *back = frame_dump(json_object_get(v, "body"));
    assert_string_equal(back, scalars[i]);
    free(back);
    json_decref(v);
    free(s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello),
      cmocka_unit_test(test_hello_invalid),
      cmocka_unit_test(test_malformed_and_unknown),
      cmocka_unit_test(test_sync_send_ping),
      cmocka_unit_test(test_server_frames),
      cmocka_unit_test(test_presence_frame),
      cmocka_unit_test(test_signal_frame),
      cmocka_unit_test(test_presence_events),
      cmocka_unit_test(test_presence_server_frames),
      cmocka_unit_test(test_signal_server_frame),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
