/* Unit tests for store/notify: the NOTIFY payloads' own format, written by
 * the PostgreSQL store and read by every node's listener. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* Presence changes: "p j|l CONV CLIENT EDGE USER", round trips with the
 * edge as 0 or 1, and what the encoder refuses. */
static void test_presence_payloads(void **state) {
  notify_t n;
  char *j = notify_presence(1, "room.1", "tab-7", 1, "alice");
  assert_string_equal(j, "p j room.1 tab-7 1 alice");
  assert_int_equal(notify_decode(j, &n), NOTIFY_PRESENCE_JOIN);
  assert_string_equal(n.conv, "room.1");
  assert_string_equal(n.client, "tab-7");
  assert_string_equal(n.user, "alice");
  assert_int_equal(n.edge, 1);
  free(j);
  char *l = notify_presence(0, "room.1", "0f7c9a52-3d1e:x_y", 0, "bob");
  assert_string_equal(l, "p l room.1 0f7c9a52-3d1e:x_y 0 bob");
  assert_int_equal(notify_decode(l, &n), NOTIFY_PRESENCE_LEAVE);
  assert_string_equal(n.conv, "room.1");
  assert_string_equal(n.client, "0f7c9a52-3d1e:x_y");
  assert_string_equal(n.user, "bob");
  assert_int_equal(n.edge, 0);
  free(l);
  /* any non-zero edge is written as 1 */
  char *e = notify_presence(0, "c", "k", 7, "u");
  assert_string_equal(e, "p l c k 1 u");
  assert_int_equal(notify_decode(e, &n), NOTIFY_PRESENCE_LEAVE);
  assert_int_equal(n.edge, 1);
  free(e);
  /* the longest ids fit and come back whole */
  char id[STORE_ID_MAX + 1];
  memset(id, 'z', STORE_ID_MAX);
  id[STORE_ID_MAX] = '\0';
  char *big = notify_presence(1, id, id, 0, id);
  assert_non_null(big);
  assert_int_equal(notify_decode(big, &n), NOTIFY_PRESENCE_JOIN);
  assert_string_equal(n.conv, id);
  assert_string_equal(n.client, id);
  assert_string_equal(n.user, id);
  free(big);
  /* ids that are not ids are not written */
  char too_long[STORE_ID_MAX + 2];
  memset(too_long, 'z', STORE_ID_MAX + 1);
  too_long[STORE_ID_MAX + 1] = '\0';
  assert_null(notify_presence(1, "a b", "k", 0, "u"));
  assert_null(notify_presence(1, "c", "", 0, "u"));
  assert_null(notify_presence(1, "c", "k", 0, "two words"));
  assert_null(notify_presence(1, "c", "k", 0, "new\nline"));
  assert_null(notify_presence(1, too_long, "k", 0, "u"));
  assert_null(notify_presence(1, "c", too_long, 0, "u"));
  assert_null(notify_presence(1, "c", "k", 0, too_long));
}

static void test_presence_malformed(void **state) {
  notify_t n;
  char longest[600];
  snprintf(longest, sizeof longest, "p j c k 0 %0*d", STORE_ID_MAX + 1, 0); /* user of 129 */
  const char *bad[] = {
      "p",
      "p ",
      "p j",
      "p j ",
      "p x c k 1 u",  /* neither j nor l */
      "p jc k 1 u",   /* no space after the action */
      "p J c k 1 u",  /* case matters */
      "p j c k 2 u",  /* edge 2 */
      "p j c k -1 u", /* a negative edge */
      "p j c k +1 u", /* a sign is no digit */
      "p j c k +0 u",
      "p j c k -0 u",
      "p j c k x u",       /* an edge that is no number */
      "p j c k 1",         /* no user */
      "p j c k 1 ",        /* an empty user */
      "p j c k",           /* no edge, no user */
      "p j c",             /* only the conversation */
      "p j c k 1 u extra", /* a field too many */
      "p j c k 1 u\n",     /* a line after */
      "p j c k 1 u\nbody",
      "p j  c k 1 u",  /* an empty conversation */
      "p j c  k 1 u",  /* an empty client */
      "p j c/1 k 1 u", /* a conversation that is no id */
      "p j c k/1 1 u", /* a client that is no id */
      "p j c k 1 u/1", /* a user that is no id */
      "p j c k 1 u\t", /* a control character */
      "p l c k 99999999999999999999999 u",
      longest,
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (notify_decode(bad[i], &n) != NOTIFY_BAD) fail_msg("decoded: \"%s\"", bad[i]);
  }
}

/* Signals: "s CONV TS SENDER\nBODY", BODY as it is (any bytes, newlines
 * too); what would not fit in a NOTIFY is not written. */
static void test_signal_payloads(void **state) {
  notify_t n;
  char *s = notify_signal("room.1", 1800000000123LL, "alice", "{\"typing\":true,\"t\":\"a\\nb\"}");
  assert_string_equal(s, "s room.1 1800000000123 alice\n{\"typing\":true,\"t\":\"a\\nb\"}");
  assert_int_equal(notify_decode(s, &n), NOTIFY_SIGNAL);
  assert_string_equal(n.conv, "room.1");
  assert_int_equal(n.ts_ms, 1800000000123LL);
  assert_string_equal(n.sender, "alice");
  assert_string_equal(n.body, "{\"typing\":true,\"t\":\"a\\nb\"}");
  free(s);
  /* a body on several lines, and a ts of 0 */
  s = notify_signal("c", 0, "bob", "[1,\n2]");
  assert_int_equal(notify_decode(s, &n), NOTIFY_SIGNAL);
  assert_int_equal(n.ts_ms, 0);
  assert_string_equal(n.body, "[1,\n2]");
  free(s);
  assert_null(notify_signal("a b", 1, "s", "1"));
  assert_null(notify_signal("c", 1, "two words", "1"));
  assert_null(notify_signal("c", 1, "", "1"));
  assert_null(notify_signal("c", -1, "s", "1"));
  assert_null(notify_signal("c", 1, "s", NULL));
  /* the size: a payload of exactly STORE_NOTIFY_PAYLOAD_MAX bytes is
   * written, one byte more is not */
  const char *head = "s c 1 s\n";
  size_t room = STORE_NOTIFY_PAYLOAD_MAX - strlen(head);
  char *body = malloc(room + 2);
  memset(body, '1', room + 1);
  body[room] = '\0';
  s = notify_signal("c", 1, "s", body);
  assert_non_null(s);
  assert_int_equal(strlen(s), STORE_NOTIFY_PAYLOAD_MAX);
  assert_int_equal(notify_decode(s, &n), NOTIFY_SIGNAL);
  assert_int_equal(strlen(n.body), room);
  free(s);
  body[room] = '1';
  body[room + 1] = '\0';
  assert_null(notify_signal("c", 1, "s", body));
  free(body);
  /* a body far over it */
  body = malloc(20000);
  memset(body, '"', 19999);
  body[19999] = '\0';
  assert_null(notify_signal("c", 1, "s", body));
  free(body);
}

static void test_signal_malformed(void **state) {
  notify_t n;
  const char *bad[] = {
      "s",
      "s ",
      "s c",
      "s c 1",
      "s c 1 alice", /* no body line */
      "s c 1 x\n",   /* an empty body */
      "s c 1 alice\n",
      "s c 1 alice body",
      "s c 1 \n{}",       /* no sender */
      "s c  alice\n{}",   /* no ts */
      "s c x alice\n{}",  /* a ts that is no number */
      "s c -5 alice\n{}", /* a negative ts */
      "s c +5 alice\n{}", /* a sign is no digit */
      "s c -0 alice\n{}",
      "s c 99999999999999999999999 alice\n{}",
      "s  1 alice\n{}",      /* no conversation */
      "s c/d 1 alice\n{}",   /* a conversation that is no id */
      "s c 1 al/ice\n{}",    /* a sender that is no id */
      "s c 1 alice bob\n{}", /* a field too many */
      "s c 1\nalice\n{}",
      "sc 1 alice\n{}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (notify_decode(bad[i], &n) != NOTIFY_BAD) fail_msg("decoded: \"%s\"", bad[i]);
  }
}

/* A group commit's payload: records split by their lengths, each an
 * ordinary message payload; a template without an epoch has the epoch
 * mark; a malformed frame stops the reader without reading past it. */
static void test_batch_payloads(void **state) {
  (void)state;
  char *tpl = notify_message_template("c1", NULL, "m1", "alice", "{\"t\":\"a b\\nc\"}", 7);
  assert_non_null(strchr(tpl, NOTIFY_EPOCH_MARK));
  free(tpl);
  const char *r1 = "m 4 c1 ab12cd34 7 m1 alice\n{\"t\":\"a b\\nc\"}";
  const char *r2 = "m 9 c2 ab12cd34";
  char payload[256], buf[STORE_NOTIFY_PAYLOAD_MAX + 1];
  snprintf(payload, sizeof payload, "b\n%zu %s%zu %s", strlen(r1), r1, strlen(r2), r2);
  assert_true(notify_is_batch(payload));
  assert_false(notify_is_batch(r1));
  const char *p = payload + 2;
  notify_t n;
  assert_int_equal(notify_batch_next(&p, buf, sizeof buf), 1);
  assert_string_equal(buf, r1);
  assert_int_equal(notify_decode(buf, &n), NOTIFY_MESSAGE);
  assert_int_equal(n.seq, 4);
  assert_string_equal(n.body, "{\"t\":\"a b\\nc\"}");
  assert_int_equal(notify_batch_next(&p, buf, sizeof buf), 1);
  assert_int_equal(notify_decode(buf, &n), NOTIFY_HINT);
  assert_int_equal(n.seq, 9);
  assert_string_equal(n.conv, "c2");
  assert_int_equal(notify_batch_next(&p, buf, sizeof buf), 0);

  const char *bad[] = {"x", "5", "5 ab", "0 ", "-1 m", "1234567 m", "3m 1 c"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    p = bad[i];
    assert_int_equal(notify_batch_next(&p, buf, sizeof buf), -1);
    assert_ptr_equal(p, bad[i]);
  }
  p = "3 abc";
  assert_int_equal(notify_batch_next(&p, buf, 3), -1); /* does not fit the buffer */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_message_round_trip),
      cmocka_unit_test(test_large_message_is_a_hint),
      cmocka_unit_test(test_earlier_frames_are_read),
      cmocka_unit_test(test_channels_and_foreign_payloads),
      cmocka_unit_test(test_user_controls),
      cmocka_unit_test(test_presence_payloads),
      cmocka_unit_test(test_presence_malformed),
      cmocka_unit_test(test_signal_payloads),
      cmocka_unit_test(test_signal_malformed),
      cmocka_unit_test(test_batch_payloads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
