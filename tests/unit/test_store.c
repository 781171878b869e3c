/*
 * Unit tests for the SQLite store (src/store/sqlite.c) against real files in
 * a temporary directory, removed again by each test's teardown.
 */
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/errors.h"
#include "core/log.h"
#include "store/store.h"

#define SQL_EVIL "'; DROP TABLE messages; --"

typedef struct {
  char dir[PATH_MAX];
  char path[PATH_MAX + 32]; /* the database file */
  char url[PATH_MAX + 64];  /* "sqlite:" + path */
  store_t *s;               /* opened and migrated by setup() */
} fx_t;

/* Fast and patient: these tests are about semantics, not fsync. */
static const store_options_t test_opt = {.sync = STORE_SYNC_NORMAL, .busy_timeout_ms = 30000};

static int setup_dir(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (f == NULL) return -1;
  const char *tmp = getenv("TMPDIR");
  if (tmp == NULL || tmp[0] == '\0') tmp = "/tmp";
  snprintf(f->dir, sizeof f->dir, "%s/cv-test-store-XXXXXX", tmp);
  if (mkdtemp(f->dir) == NULL) {
    free(f);
    return -1;
  }
  snprintf(f->path, sizeof f->path, "%s/store.db", f->dir);
  snprintf(f->url, sizeof f->url, "sqlite:%s", f->path);
  *state = f;
  return 0;
}

static int setup(void **state) {
  if (setup_dir(state) != 0) return -1;
  fx_t *f = *state;
  if (store_open(f->url, &test_opt, &f->s) != 0) return -1;
  return store_migrate(f->s) == 0 ? 0 : -1;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static int teardown(void **state) {
  fx_t *f = *state;
  store_close(f->s);
  int rc = nftw(f->dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
  return rc;
}

/* A raw connection for looking under the store, and for holding locks. */
static sqlite3 *raw_open(const fx_t *f) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 30000);
  return db;
}

static int64_t raw_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

static void mk_conv(store_t *s, const char *ch, const char *conv) {
  assert_int_equal(store_channel_create(s, ch, "a channel", 0, NULL), 0);
  assert_int_equal(store_conv_create(s, conv, ch, NULL), 0);
}

static int64_t append_ok(store_t *s, const char *conv, const char *id, const char *body) {
  store_msg_t m;
  int created = -1;
  assert_int_equal(store_append(s, conv, id, "alice", body, 1000, &m, &created), 0);
  assert_int_equal(created, 1);
  int64_t seq = m.seq;
  store_msg_clear(&m);
  return seq;
}

static int64_t head_of(store_t *s, const char *conv) {
  store_conv_t c;
  assert_int_equal(store_conv_get(s, conv, &c), 0);
  return c.head;
}

/* ---- open and schema ---------------------------------------------------- */

static void test_open_bad_args(void **state) {
  fx_t *f = *state;
  store_t *s = (store_t *)&s; /* must be reset to NULL on failure */
  char url[PATH_MAX + 64];
  assert_int_equal(store_open("postgres://localhost/cv", NULL, &s), -CV_EINVAL);
  assert_null(s);
  assert_int_equal(store_open("sqlite:", NULL, &s), -CV_EINVAL);
  assert_int_equal(store_open(NULL, NULL, &s), -CV_EINVAL);
  assert_int_equal(store_open(f->url, NULL, NULL), -CV_EINVAL);
  store_options_t bad = {.sync = (store_sync_t)7};
  assert_int_equal(store_open(f->url, &bad, &s), -CV_EINVAL);
  bad = (store_options_t){.sync = STORE_SYNC_FULL, .busy_timeout_ms = -1};
  assert_int_equal(store_open(f->url, &bad, &s), -CV_EINVAL);
  /* the directory must exist */
  snprintf(url, sizeof url, "sqlite:%s/missing/x.db", f->dir);
  assert_int_equal(store_open(url, NULL, &s), -CV_ESTORE);
  assert_null(s);
  store_close(NULL);
}

static void test_open_defaults_wal(void **state) {
  fx_t *f = *state;
  store_t *s = NULL;
  assert_int_equal(store_open(f->url, NULL, &s), 0);
  assert_int_equal(store_ping(s), 0);
  assert_int_equal(store_schema_version(s), 0); /* open does not migrate */
  sqlite3 *db = raw_open(f);
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
  store_close(s);
}

static void test_migrate_idempotent(void **state) {
  fx_t *f = *state;
  store_t *s = NULL;
  assert_int_equal(store_open(f->url, &test_opt, &s), 0);
  assert_int_equal(store_migrate(s), 0);
  int v = store_schema_version(s);
  assert_true(v >= 1);
  assert_int_equal(store_migrate(s), 0);
  assert_int_equal(store_migrate(s), 0);
  assert_int_equal(store_schema_version(s), v);

  sqlite3 *db = raw_open(f);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM schema_version"), v);
  assert_int_equal(raw_int(db, "SELECT min(version) FROM schema_version"), 1);
  assert_int_equal(raw_int(db, "SELECT max(version) FROM schema_version"), v);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM schema_version WHERE applied_at"
                               " LIKE '____-__-__T__:__:__.___Z'"),
                   v);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM sqlite_schema WHERE"
                               " type = 'table' AND name IN ('channels',"
                               " 'conversations', 'messages', 'revocations')"),
                   4);
  sqlite3_close(db);
  store_close(s);
}

typedef struct {
  const char *url;
  pthread_barrier_t *bar;
  int open_rc, migrate_rc, version;
} migrator_t;

static void *migrator_main(void *arg) {
  migrator_t *m = arg;
  store_t *s = NULL;
  m->open_rc = store_open(m->url, &test_opt, &s);
  pthread_barrier_wait(m->bar);
  if (m->open_rc == 0) {
    m->migrate_rc = store_migrate(s);
    m->version = store_schema_version(s);
  }
  store_close(s);
  return NULL;
}

/* Several connections opening and migrating a fresh file at once: all
 * succeed, each step is applied once. Many rounds, because the race it
 * guards (opens switching a new file to WAL at the same moment, where SQLite
 * answers SQLITE_BUSY without consulting the busy handler) is narrow. */
static void test_migrate_concurrent(void **state) {
  fx_t *f = *state;
  enum { N = 6, ROUNDS = 50 };
  for (int r = 0; r < ROUNDS; r++) {
    char url[PATH_MAX + 64];
    pthread_t th[N];
    migrator_t m[N];
    pthread_barrier_t bar;
    snprintf(url, sizeof url, "sqlite:%s/race-%d.db", f->dir, r);
    pthread_barrier_init(&bar, NULL, N);
    for (int i = 0; i < N; i++) {
      m[i] = (migrator_t){.url = url, .bar = &bar};
      assert_int_equal(pthread_create(&th[i], NULL, migrator_main, &m[i]), 0);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < N; i++) {
      if (m[i].open_rc != 0 || m[i].migrate_rc != 0)
        print_error("round %d, connection %d: open %s, migrate %s\n", r, i,
                    cv_strerror(m[i].open_rc), cv_strerror(m[i].migrate_rc));
      assert_int_equal(m[i].open_rc, 0);
      assert_int_equal(m[i].migrate_rc, 0);
      assert_true(m[i].version >= 1);
      assert_int_equal(m[i].version, m[0].version);
    }
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(url + strlen("sqlite:"), &db), SQLITE_OK);
    assert_int_equal(raw_int(db, "SELECT count(*) FROM schema_version"), m[0].version);
    sqlite3_close(db);
  }
}

/* ---- channels and conversations --------------------------------------- */

static void test_channels(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  store_channel_t c;
  assert_int_equal(store_channel_create(s, "general", "General", 1, &c), 0);
  assert_string_equal(c.id, "general");
  assert_string_equal(c.name, "General");
  assert_int_equal(c.presence, 1);
  assert_int_equal(c.active, 1);

  memset(&c, 0, sizeof c);
  assert_int_equal(store_channel_get(s, "general", &c), 0);
  assert_string_equal(c.id, "general");
  assert_string_equal(c.name, "General");
  assert_int_equal(c.presence, 1);
  assert_int_equal(c.active, 1);
  assert_int_equal(store_channel_get(s, "general", NULL), 0);

  assert_int_equal(store_channel_create(s, "general", "again", 0, NULL), -CV_EEXISTS);
  assert_int_equal(store_channel_get(s, "nope", &c), -CV_ENOTFOUND);

  assert_int_equal(store_channel_set_active(s, "general", 0, &c), 0);
  assert_int_equal(c.active, 0);
  assert_string_equal(c.name, "General");
  assert_int_equal(store_channel_get(s, "general", &c), 0);
  assert_int_equal(c.active, 0);
  assert_int_equal(store_channel_set_active(s, "general", 1, NULL), 0);
  assert_int_equal(store_channel_get(s, "general", &c), 0);
  assert_int_equal(c.active, 1);
  assert_int_equal(store_channel_set_active(s, "nope", 1, &c), -CV_ENOTFOUND);

  /* presence is stored as 0/1 */
  assert_int_equal(store_channel_create(s, "quiet", "", 42, &c), 0);
  assert_int_equal(c.presence, 1);
  assert_int_equal(store_channel_get(s, "quiet", &c), 0);
  assert_int_equal(c.presence, 1);
  assert_string_equal(c.name, "");

  /* name bound: STORE_NAME_MAX bytes fit, one more does not */
  char name[STORE_NAME_MAX + 2];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  assert_int_equal(store_channel_create(s, "long", name, 0, NULL), -CV_EINVAL);
  name[STORE_NAME_MAX] = '\0';
  assert_int_equal(store_channel_create(s, "long", name, 0, NULL), 0);
  assert_int_equal(store_channel_get(s, "long", &c), 0);
  assert_string_equal(c.name, name);

  assert_int_equal(store_channel_create(s, "", "x", 0, NULL), -CV_EINVAL);
  assert_int_equal(store_channel_create(s, "a b", "x", 0, NULL), -CV_EINVAL);
  assert_int_equal(store_channel_create(s, "ok", NULL, 0, NULL), -CV_EINVAL);
}

static void test_conversations(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  store_conv_t v;
  assert_int_equal(store_conv_create(s, "c1", "missing", &v), -CV_ENOTFOUND);
  assert_int_equal(store_channel_create(s, "ch", "Ch", 1, NULL), 0);
  assert_int_equal(store_conv_create(s, "c1", "ch", &v), 0);
  assert_string_equal(v.id, "c1");
  assert_string_equal(v.channel, "ch");
  assert_int_equal(v.head, 0);
  assert_int_equal(v.channel_active, 1);
  assert_int_equal(v.presence, 1);
  assert_int_equal(store_conv_create(s, "c1", "ch", &v), -CV_EEXISTS);
  assert_int_equal(store_conv_create(s, "c2", "ch", NULL), 0);

  memset(&v, 0, sizeof v);
  assert_int_equal(store_conv_get(s, "c1", &v), 0);
  assert_string_equal(v.id, "c1");
  assert_string_equal(v.channel, "ch");
  assert_int_equal(v.head, 0);
  assert_int_equal(v.channel_active, 1);
  assert_int_equal(v.presence, 1);
  assert_int_equal(store_conv_get(s, "c9", &v), -CV_ENOTFOUND);

  /* the channel's flags are read with the conversation */
  assert_int_equal(store_channel_set_active(s, "ch", 0, NULL), 0);
  assert_int_equal(store_conv_get(s, "c1", &v), 0);
  assert_int_equal(v.channel_active, 0);
  assert_int_equal(store_conv_create(s, "c3", "ch", &v), 0);
  assert_int_equal(v.channel_active, 0);
}

/* ---- append ------------------------------------------------------------ */

static void test_append_seq(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  mk_conv(s, "ch2", "c2");
  store_msg_t m;
  int created = 0;
  assert_int_equal(store_append(s, "c1", "m1", "alice", "{\"t\":1}", 1234, &m, &created), 0);
  assert_int_equal(created, 1);
  assert_int_equal(m.seq, 1);
  assert_string_equal(m.id, "m1");
  assert_string_equal(m.sender, "alice");
  assert_string_equal(m.body, "{\"t\":1}");
  assert_int_equal(m.ts_ms, 1234);
  store_msg_clear(&m);
  assert_null(m.sender);
  store_msg_clear(&m); /* clearing twice is harmless */

  assert_int_equal(append_ok(s, "c1", "m2", "{}"), 2);
  assert_int_equal(append_ok(s, "c1", "m3", "{}"), 3);
  /* seq is per conversation */
  assert_int_equal(append_ok(s, "c2", "m1", "{}"), 1);
  assert_int_equal(append_ok(s, "c1", "m4", "{}"), 4);
  assert_int_equal(head_of(s, "c1"), 4);
  assert_int_equal(head_of(s, "c2"), 1);

  /* arguments */
  assert_int_equal(store_append(s, "c1", "", "a", "{}", 1, &m, &created), -CV_EINVAL);
  assert_int_equal(store_append(s, "c1", "x", NULL, "{}", 1, &m, &created), -CV_EINVAL);
  assert_int_equal(store_append(s, "c1", "x", "a", NULL, 1, &m, &created), -CV_EINVAL);
  assert_int_equal(store_append(s, "c1", "x", "a", "{}", 1, NULL, &created), -CV_EINVAL);
  assert_int_equal(head_of(s, "c1"), 4);
}

static void test_append_idempotent(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  assert_int_equal(store_conv_create(s, "c2", "ch", NULL), 0);
  assert_int_equal(append_ok(s, "c1", "a", "{\"n\":1}"), 1);
  assert_int_equal(append_ok(s, "c1", "b", "{\"n\":2}"), 2);

  store_msg_t m;
  int created = 1;
  assert_int_equal(store_append(s, "c1", "a", "mallory", "{\"n\":99}", 5, &m, &created), 0);
  assert_int_equal(created, 0);
  assert_int_equal(m.seq, 1);
  assert_string_equal(m.id, "a");
  assert_string_equal(m.sender, "alice"); /* the first message, unchanged */
  assert_string_equal(m.body, "{\"n\":1}");
  assert_int_equal(m.ts_ms, 1000);
  store_msg_clear(&m);
  assert_int_equal(head_of(s, "c1"), 2);

  /* the key is per conversation */
  assert_int_equal(append_ok(s, "c2", "a", "{}"), 1);
  /* and the next new id continues the sequence without a hole */
  assert_int_equal(append_ok(s, "c1", "c", "{}"), 3);

  store_msg_t *v = NULL;
  size_t n = 0;
  assert_int_equal(store_replay(s, "c1", 0, -1, 100, 0, &v, &n), 0);
  assert_int_equal(n, 3);
  assert_string_equal(v[0].body, "{\"n\":1}");
  store_msgs_free(v, n);
}

static void test_append_inactive_and_missing(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  assert_int_equal(append_ok(s, "c1", "m1", "{}"), 1);
  assert_int_equal(store_channel_set_active(s, "ch", 0, NULL), 0);

  store_msg_t m;
  int created = 1;
  assert_int_equal(store_append(s, "c1", "m2", "a", "{}", 1, &m, &created), -CV_EINACTIVE);
  assert_int_equal(created, 0);
  assert_null(m.sender);
  assert_int_equal(head_of(s, "c1"), 1);
  /* a retry of an acknowledged message still gets its answer */
  assert_int_equal(store_append(s, "c1", "m1", "a", "{}", 1, &m, &created), 0);
  assert_int_equal(created, 0);
  assert_int_equal(m.seq, 1);
  store_msg_clear(&m);

  assert_int_equal(store_channel_set_active(s, "ch", 1, NULL), 0);
  assert_int_equal(append_ok(s, "c1", "m2", "{}"), 2);

  assert_int_equal(store_append(s, "nope", "m1", "a", "{}", 1, &m, &created), -CV_ENOTFOUND);
  store_msg_t *v = NULL;
  size_t n = 1;
  assert_int_equal(store_replay(s, "nope", 0, -1, 10, 0, &v, &n), -CV_ENOTFOUND);
  assert_null(v);
  assert_int_equal(n, 0);
  sqlite3 *db = raw_open(*state);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM messages WHERE conv = 'nope'"), 0);
  sqlite3_close(db);
}

/* SQL metacharacters are data: invalid as ids, stored verbatim elsewhere. */
static void test_sql_metacharacters(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  const char *name = SQL_EVIL " \"quoted\" \\ %s%n ☃";
  const char *sender = "O'Brien\"); DELETE FROM channels; --";
  const char *body = "{\"text\":\"" SQL_EVIL "\",\"q\":\"'\\\"\",\"u\":\"🚀\"}";
  store_msg_t m;
  int created;

  assert_int_equal(store_channel_create(s, SQL_EVIL, "x", 0, NULL), -CV_EINVAL);
  assert_int_equal(store_channel_get(s, SQL_EVIL, NULL), -CV_EINVAL);
  assert_int_equal(store_channel_create(s, "ch", name, 0, NULL), 0);
  assert_int_equal(store_conv_create(s, SQL_EVIL, "ch", NULL), -CV_EINVAL);
  assert_int_equal(store_conv_create(s, "c1", SQL_EVIL, NULL), -CV_EINVAL);
  assert_int_equal(store_conv_create(s, "c1", "ch", NULL), 0);
  assert_int_equal(store_append(s, "c1", SQL_EVIL, sender, body, 7, &m, &created), -CV_EINVAL);
  assert_int_equal(store_append(s, SQL_EVIL, "m1", sender, body, 7, &m, &created), -CV_EINVAL);

  store_channel_t c;
  assert_int_equal(store_channel_get(s, "ch", &c), 0);
  assert_string_equal(c.name, name);

  assert_int_equal(store_append(s, "c1", "m1", sender, body, 7, &m, &created), 0);
  assert_int_equal(created, 1);
  store_msg_clear(&m);
  assert_int_equal(store_revoke(s, SQL_EVIL, 100), 0);

  store_msg_t *v = NULL;
  size_t n = 0;
  assert_int_equal(store_replay(s, "c1", 0, -1, 10, 0, &v, &n), 0);
  assert_int_equal(n, 1);
  assert_string_equal(v[0].sender, sender);
  assert_string_equal(v[0].body, body);
  store_msgs_free(v, n);

  char **j = NULL;
  assert_int_equal(store_revocations(s, 0, &j, &n), 0);
  assert_int_equal(n, 1);
  assert_string_equal(j[0], SQL_EVIL);
  store_strings_free(j, n);

  sqlite3 *db = raw_open(*state);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM messages"), 1);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM channels"), 1);
  sqlite3_close(db);
}

/* ---- replay ------------------------------------------------------------ */

static void expect_page(store_t *s, const char *conv, int64_t after, int64_t upto, int limit,
                        int64_t first, size_t count) {
  store_msg_t *v = (store_msg_t *)&v;
  size_t n = 12345;
  assert_int_equal(store_replay(s, conv, after, upto, limit, 0, &v, &n), 0);
  assert_int_equal(n, count);
  if (count == 0) assert_null(v);
  for (size_t i = 0; i < n; i++) {
    char id[32];
    assert_int_equal(v[i].seq, first + (int64_t)i);
    snprintf(id, sizeof id, "m%lld", (long long)v[i].seq);
    assert_string_equal(v[i].id, id);
  }
  store_msgs_free(v, n);
}

static void fill(store_t *s, const char *conv, int count) {
  for (int i = 1; i <= count; i++) {
    char id[32];
    snprintf(id, sizeof id, "m%d", i);
    assert_int_equal(append_ok(s, conv, id, "{}"), i);
  }
}

static void test_replay_ranges(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  assert_int_equal(store_conv_create(s, "empty", "ch", NULL), 0);
  expect_page(s, "empty", 0, -1, 10, 0, 0); /* exists, nothing in it */
  fill(s, "c1", 10);

  expect_page(s, "c1", 0, -1, 100, 1, 10);
  expect_page(s, "c1", 3, 7, 100, 4, 4); /* after < seq <= upto */
  expect_page(s, "c1", 3, 3, 100, 0, 0);
  expect_page(s, "c1", 7, 3, 100, 0, 0);
  expect_page(s, "c1", 0, 0, 100, 0, 0);
  expect_page(s, "c1", 9, -1, 100, 10, 1);
  expect_page(s, "c1", 10, -1, 100, 0, 0); /* watermark == head */
  expect_page(s, "c1", 42, -1, 100, 0, 0);
  expect_page(s, "c1", -5, 2, 100, 1, 2);
  expect_page(s, "c1", 0, 1000, 100, 1, 10);
  /* paging with a limit */
  expect_page(s, "c1", 0, -1, 3, 1, 3);
  expect_page(s, "c1", 3, -1, 3, 4, 3);
  expect_page(s, "c1", 6, -1, 3, 7, 3);
  expect_page(s, "c1", 9, -1, 3, 10, 1);
  expect_page(s, "c1", 2, 8, 4, 3, 4);
  /* limits below 1 are clamped to 1 */
  expect_page(s, "c1", 0, -1, 0, 1, 1);
  expect_page(s, "c1", 4, -1, -7, 5, 1);

  store_msg_t *v;
  size_t n;
  assert_int_equal(store_replay(s, "c1", 0, -1, 10, 0, NULL, &n), -CV_EINVAL);
  assert_int_equal(store_replay(s, "c1", 0, -1, 10, 0, &v, NULL), -CV_EINVAL);
}

static void test_replay_clamp(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  fill(s, "c1", 2500);
  assert_int_equal(head_of(s, "c1"), 2500);
  expect_page(s, "c1", 0, -1, 5000, 1, 1000);
  expect_page(s, "c1", 1000, -1, INT32_MAX, 1001, 1000);
  expect_page(s, "c1", 2000, -1, 1001, 2001, 500);
  expect_page(s, "c1", 2500, -1, 5000, 0, 0);
  expect_page(s, "c1", 100, 1600, 5000, 101, 1000);
  expect_page(s, "c1", 1100, 1600, 5000, 1101, 500);
}

/* A page stops once it holds max_bytes of bodies and senders, and always
 * holds at least one message so that paging progresses. */
static void test_replay_byte_budget(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  char body[1003];
  memset(body, 'x', sizeof body);
  body[0] = '"';
  body[1001] = '"';
  body[1002] = '\0'; /* a 1002-byte JSON string; sender "alice" adds 5 */
  for (int i = 1; i <= 20; i++) {
    char id[32];
    snprintf(id, sizeof id, "m%d", i);
    assert_int_equal(append_ok(s, "c1", id, body), i);
  }
  store_msg_t *v;
  size_t n;
  assert_int_equal(store_replay(s, "c1", 0, -1, 1000, 5000, &v, &n), 0);
  assert_int_equal(n, 5); /* 5 x 1007 >= 5000 */
  assert_int_equal(v[4].seq, 5);
  store_msgs_free(v, n);
  assert_int_equal(store_replay(s, "c1", 5, -1, 1000, 1, &v, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].seq, 6);
  store_msgs_free(v, n);
  assert_int_equal(store_replay(s, "c1", 6, -1, 3, 1 << 20, &v, &n), 0);
  assert_int_equal(n, 3); /* the count limit still applies */
  store_msgs_free(v, n);
}

/* ---- revocations ------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void expect_revoked(store_t *s, int64_t now_s, const char *want) {
  char **v = (char **)&v;
  size_t n = 99;
  char got[256] = "";
  assert_int_equal(store_revocations(s, now_s, &v, &n), 0);
  if (n == 0) assert_null(v);
  if (n > 0) qsort(v, n, sizeof *v, cmp_str);
  for (size_t i = 0; i < n; i++) {
    if (i > 0) strcat(got, ",");
    strcat(got, v[i]);
  }
  assert_string_equal(got, want);
  store_strings_free(v, n);
}

static void test_revocations(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  expect_revoked(s, 0, "");
  assert_int_equal(store_revoke(s, "jti-b", 200), 0);
  assert_int_equal(store_revoke(s, "jti-a", 100), 0);
  assert_int_equal(store_revoke(s, "jti-c", 300), 0);
  assert_int_equal(store_revoke(s, "jti-a", 100), 0); /* idempotent */
  assert_int_equal(store_revoke(s, "", 100), -CV_EINVAL);
  assert_int_equal(store_revoke(s, NULL, 100), -CV_EINVAL);

  expect_revoked(s, 0, "jti-a,jti-b,jti-c");
  expect_revoked(s, 100, "jti-a,jti-b,jti-c"); /* exp_s >= now_s */
  expect_revoked(s, 101, "jti-b,jti-c");
  expect_revoked(s, 300, "jti-c");
  expect_revoked(s, 301, "");

  /* revoking again never shortens the entry's life */
  assert_int_equal(store_revoke(s, "jti-a", 400), 0);
  assert_int_equal(store_revoke(s, "jti-a", 50), 0);
  expect_revoked(s, 350, "jti-a");

  sqlite3 *db = raw_open(*state);
  assert_int_equal(raw_int(db, "SELECT count(*) FROM revocations"), 3);
  sqlite3_close(db);
}

/* ---- locks -------------------------------------------------------------- */

/* A write lock held elsewhere: -CV_EBUSY after the busy timeout, nothing
 * left half done, reads still served (WAL), and the connection fine after. */
static void test_busy(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  assert_int_equal(append_ok(f->s, "c1", "m1", "{}"), 1);

  store_options_t quick = {.sync = STORE_SYNC_NORMAL, .busy_timeout_ms = 50};
  store_t *s2 = NULL;
  assert_int_equal(store_open(f->url, &quick, &s2), 0);
  sqlite3 *db = raw_open(f);
  assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);

  store_msg_t m;
  int created = 1;
  assert_int_equal(store_append(s2, "c1", "m2", "a", "{}", 1, &m, &created), -CV_EBUSY);
  assert_int_equal(created, 0);
  assert_int_equal(store_channel_create(s2, "ch2", "x", 0, NULL), -CV_EBUSY);
  assert_int_equal(store_conv_create(s2, "c2", "ch", NULL), -CV_EBUSY);
  assert_int_equal(store_revoke(s2, "j", 1), -CV_EBUSY);
  assert_int_equal(head_of(s2, "c1"), 1);
  expect_page(s2, "c1", 0, -1, 10, 1, 1);

  assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);

  /* no transaction was left open on s2 */
  assert_int_equal(store_append(s2, "c1", "m2", "a", "{}", 1, &m, &created), 0);
  assert_int_equal(m.seq, 2);
  store_msg_clear(&m);
  assert_int_equal(store_channel_create(s2, "ch2", "x", 0, NULL), 0);
  assert_int_equal(head_of(f->s, "c1"), 2);
  store_close(s2);
}

/* ---- concurrency ------------------------------------------------------- */

enum { WRITERS = 8, PER_WRITER = 200 };

typedef struct {
  const char *url;
  pthread_barrier_t *bar;
  int w;
  int err;     /* first error, 0 if none */
  int not_new; /* appends that came back with created == 0 */
  int64_t seq[PER_WRITER];
} writer_t;

static void *writer_main(void *arg) {
  writer_t *wr = arg;
  store_t *s = NULL;
  wr->err = store_open(wr->url, &test_opt, &s);
  pthread_barrier_wait(wr->bar); /* even on failure, or the others hang */
  for (int i = 0; wr->err == 0 && i < PER_WRITER; i++) {
    char id[32], body[64];
    store_msg_t m;
    int created = 0;
    snprintf(id, sizeof id, "w%d-m%d", wr->w, i);
    snprintf(body, sizeof body, "{\"w\":%d,\"i\":%d}", wr->w, i);
    wr->err = store_append(s, "hot", id, "writer", body, 1, &m, &created);
    if (wr->err == 0) {
      wr->seq[i] = m.seq;
      if (!created) wr->not_new++;
      store_msg_clear(&m);
    }
  }
  store_close(s);
  return NULL;
}

static void test_concurrent_writers_gapless(void **state) {
  fx_t *f = *state;
  enum { TOTAL = WRITERS * PER_WRITER };
  mk_conv(f->s, "ch", "hot");

  static writer_t wr[WRITERS];
  pthread_t th[WRITERS];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, WRITERS);
  for (int w = 0; w < WRITERS; w++) {
    wr[w] = (writer_t){.url = f->url, .bar = &bar, .w = w};
    assert_int_equal(pthread_create(&th[w], NULL, writer_main, &wr[w]), 0);
  }
  for (int w = 0; w < WRITERS; w++) pthread_join(th[w], NULL);
  pthread_barrier_destroy(&bar);
  for (int w = 0; w < WRITERS; w++) {
    if (wr[w].err != 0) print_error("writer %d: %s\n", w, cv_strerror(wr[w].err));
    assert_int_equal(wr[w].err, 0);
    assert_int_equal(wr[w].not_new, 0);
    /* one writer's appends are sequential, so its seqs ascend */
    for (int i = 1; i < PER_WRITER; i++) assert_true(wr[w].seq[i] > wr[w].seq[i - 1]);
  }
  assert_int_equal(head_of(f->s, "hot"), TOTAL);

  static unsigned char seen[WRITERS][PER_WRITER];
  memset(seen, 0, sizeof seen);
  int64_t next = 1;
  for (;;) {
    store_msg_t *v = NULL;
    size_t n = 0;
    assert_int_equal(store_replay(f->s, "hot", next - 1, -1, STORE_REPLAY_PAGE_MAX, 0, &v, &n), 0);
    if (n == 0) break;
    for (size_t i = 0; i < n; i++, next++) {
      int w = -1, k = -1;
      assert_int_equal(v[i].seq, next); /* no gap, no duplicate */
      assert_int_equal(sscanf(v[i].id, "w%d-m%d", &w, &k), 2);
      assert_in_range(w, 0, WRITERS - 1);
      assert_in_range(k, 0, PER_WRITER - 1);
      assert_int_equal(seen[w][k], 0);
      seen[w][k] = 1;
      assert_int_equal(wr[w].seq[k], v[i].seq); /* what the writer was told */
    }
    store_msgs_free(v, n);
  }
  assert_int_equal(next - 1, TOTAL);
  for (int w = 0; w < WRITERS; w++)
    for (int k = 0; k < PER_WRITER; k++) assert_int_equal(seen[w][k], 1);
}

int main(void) {
  log_set_level(LOG_WARN); /* one "migrated" line per fixture is noise */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_open_bad_args, setup_dir, teardown),
      cmocka_unit_test_setup_teardown(test_open_defaults_wal, setup_dir, teardown),
      cmocka_unit_test_setup_teardown(test_migrate_idempotent, setup_dir, teardown),
      cmocka_unit_test_setup_teardown(test_migrate_concurrent, setup_dir, teardown),
      cmocka_unit_test_setup_teardown(test_channels, setup, teardown),
      cmocka_unit_test_setup_teardown(test_conversations, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_seq, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_idempotent, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_inactive_and_missing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sql_metacharacters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replay_ranges, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replay_clamp, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replay_byte_budget, setup, teardown),
      cmocka_unit_test_setup_teardown(test_revocations, setup, teardown),
      cmocka_unit_test_setup_teardown(test_busy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_writers_gapless, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
