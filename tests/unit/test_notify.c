/* Unit tests for store/notify: the NOTIFY payloads' own format, written by
 * the PostgreSQL store and read by every node's listener. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store/notify.h"

/* The template with its seq mark replaced, as the append statement does. */
static char *with_seq(const char *tpl, const char *seq) {
  size_t n = strlen(tpl) + strlen(seq) * 4 + 1;
  char *out = malloc(n), *o = out;
  for (const char *p = tpl; *p; p++) {
    if (*p == NOTIFY_SEQ_MARK) {
      strcpy(o, seq);
      o += strlen(seq);
    } else {
      *o++ = *p;
    }
  }
  *o = '\0';
  return out;
}

static void test_message_round_trip(void **state) {
  char *tpl = notify_message_template("room.1", "9c4e01af", "m-1", "alice",
                                      "{\"text\":\"a b\\nc\"}", 1800000000123LL);
  char *p = with_seq(tpl, "42");
  assert_string_equal(p, "m 42 room.1 9c4e01af 1800000000123 m-1 alice\n{\"text\":\"a b\\nc\"}");
  notify_t n;
  assert_int_equal(notify_decode(p, &n), NOTIFY_MESSAGE);
  assert_int_equal(n.seq, 42);
  assert_string_equal(n.conv, "room.1");
  assert_string_equal(n.epoch, "9c4e01af");
  assert_int_equal(n.ts_ms, 1800000000123LL);
  assert_string_equal(n.id, "m-1");
  assert_string_equal(n.sender, "alice");
  assert_string_equal(n.body, "{\"text\":\"a b\\nc\"}");
  free(p);
  free(tpl);
}

static void test_large_message_is_a_hint(void **state) {
  char *body = malloc(9000);
  memset(body, 'x', 8990);
  body[0] = '"';
  body[8989] = '"';
  body[8990] = '\0';
  char *tpl = notify_message_template("c", "e1", "i", "s", body, 1);
  char *p = with_seq(tpl, "7");
  assert_string_equal(p, "m 7 c e1");
  notify_t n;
  assert_int_equal(notify_decode(p, &n), NOTIFY_HINT);
  assert_int_equal(n.seq, 7);
  assert_string_equal(n.epoch, "e1");
  assert_int_equal(notify_decode("m 7 c", &n), NOTIFY_HINT); /* no epoch: unknown */
  assert_string_equal(n.epoch, "");
  free(p);
  free(tpl);
  free(body);
  /* a sender that is not an id cannot go in the header: a hint too */
  tpl = notify_message_template("c", "e1", "i", "two words", "1", 1);
  assert_non_null(strstr(tpl, "e1"));
  assert_null(strchr(tpl, '\n'));
  free(tpl);
}

/* What earlier versions wrote is still read: the frame JSON after the
 * header, with or without an epoch (a node of each version in one cluster
 * during a rolling upgrade). */
static void test_earlier_frames_are_read(void **state) {
  notify_t n;
  assert_int_equal(notify_decode("m 9 room {\"type\":\"msg\"}", &n), NOTIFY_BAD);
  assert_int_equal(notify_decode("m 9 room\n{\"type\":\"msg\",\"seq\":9}", &n), NOTIFY_FRAME);
  assert_int_equal(n.seq, 9);
  assert_string_equal(n.conv, "room");
  assert_string_equal(n.epoch, "");
  assert_string_equal(n.body, "{\"type\":\"msg\",\"seq\":9}");
  assert_int_equal(notify_decode("m 9 room e1\n{\"seq\":9}", &n), NOTIFY_FRAME);
  assert_string_equal(n.epoch, "e1");
  assert_string_equal(n.body, "{\"seq\":9}");
}

static void test_channels_and_foreign_payloads(void **state) {
  notify_t n;
  assert_int_equal(notify_decode("c 0 general", &n), NOTIFY_CHANNEL);
  assert_string_equal(n.conv, "general");
  assert_int_equal(n.active, 0);
  assert_int_equal(notify_decode("c 1 general", &n), NOTIFY_CHANNEL);
  assert_int_equal(n.active, 1);
  const char *bad[] = {"",
                       "c",
                       "m",
                       "m 5",
                       "m 0 c",
                       "m -1 c",
                       "m 99999999999999999999 c",
                       "m 7 bad/id",
                       "c 2 x",
                       "hello",
                       "m 7 c e1 x",
                       "m 7 c e1 1 i s",
                       "m 7 c e1 1 i s x\nbody",
                       "m 7 c bad/epoch"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(notify_decode(bad[i], &n), NOTIFY_BAD);
}

/* The user controls of POST /admin/users/...: round trips, and payloads
 * with a code, hint or reason the route would refuse are not read. */
static void test_user_controls(void **state) {
  notify_t n;
  char *d = notify_user_disconnect("gw-1:8080", "kim", 4001, 2000, "moderated, bye");
  assert_string_equal(d, "u d gw-1:8080 kim 4001 2000\nmoderated, bye");
  assert_int_equal(notify_decode(d, &n), NOTIFY_USER_DISCONNECT);
  assert_string_equal(n.origin, "gw-1:8080");
  assert_string_equal(n.user, "kim");
  assert_int_equal(n.code, 4001);
  assert_int_equal(n.retry_ms, 2000);
  assert_string_equal(n.reason, "moderated, bye");
  free(d);
  char *u = notify_user_unsubscribe("gw-1", "kim", "room-7");
  assert_int_equal(notify_decode(u, &n), NOTIFY_USER_UNSUBSCRIBE);
  assert_string_equal(n.conv, "room-7");
  free(u);
  assert_null(notify_user_disconnect("gw 1", "kim", 1008, 0, ""));
  assert_null(notify_user_disconnect("gw", "kim", 1008, 0, "two\nlines"));
  const char *bad[] = {"u d gw kim 1005 0\n",
                       "u d gw kim 2000 0\n",
                       "u d gw kim 1008 0\nbell\a",
                       "u d gw kim 1008 99999999\n",
                       "u d gw kim 1008 0",
                       "u u gw kim",
                       "u u gw kim a b",
                       "u x gw kim c"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(notify_decode(bad[i], &n), NOTIFY_BAD);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_message_round_trip),
      cmocka_unit_test(test_large_message_is_a_hint),
      cmocka_unit_test(test_earlier_frames_are_read),
      cmocka_unit_test(test_channels_and_foreign_payloads),
      cmocka_unit_test(test_user_controls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
