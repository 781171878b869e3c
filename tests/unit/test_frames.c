/* Unit tests for proto/frames: client frame decoding and server frame text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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
  const char *bad11[] = {"{\"type\":\"subscribe\"}",
                         "{\"type\":\"subscribe\",\"conv\":\"a b\"}",
                         "{\"type\":\"subscribe\",\"conv\":\"c\",\"watermark\":-2}",
                         "{\"type\":\"subscribe\",\"conv\":\"c\",\"epoch\":5}",
                         "{\"type\":\"unsubscribe\"}",
                         "{\"type\":\"refresh\"}",
                         "{\"type\":\"refresh\",\"token\":1}"};
  for (size_t i = 0; i < sizeof bad11 / sizeof bad11[0]; i++) {
    assert_int_equal(decode(bad11[i], &f, why), -CV_EINVAL);
    assert_true(f.known_type);
  }
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello),
      cmocka_unit_test(test_hello_invalid),
      cmocka_unit_test(test_malformed_and_unknown),
      cmocka_unit_test(test_sync_send_ping),
      cmocka_unit_test(test_server_frames),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
