/*
 * Unit tests for the store (src/store/store.h) against a real database, one
 * source for both backends:
 *
 *   test_store        SQLite: files in a temporary directory, removed again
 *                     by each test's teardown;
 *   test_store --pg   PostgreSQL: every test gets a fresh database in the
 *                     cluster at PG_TMP_URL, dropped by its teardown. CTest
 *                     runs it as `scripts/pg-tmp run --fast -- test_store --pg`,
 *                     which starts a throwaway cluster and stops it after.
 *                     Without PG_TMP_URL it fails: never a silent skip.
 *
 * The shared suite checks the semantics store.h promises; where the two
 * databases differ underneath (locks, looking under the store) the helpers
 * below (raw_*, lock_all) speak each one's dialect. The PostgreSQL run adds
 * tests of its own: row locks per conversation, fail-fast connects, and
 * reconnecting after the server dropped a connection.
 */
#include <arpa/inet.h>
#include <ftw.h>
#include <libpq-fe.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/errors.h"
#include "core/dburl.h"
#include "core/shard.h"
#include "core/log.h"
#include "common/util.h"
#include "core/metrics.h"
#include "store/notify.h"
#include "store/sharded.h"
#include "store/store.h"

#define SQL_EVIL "'; DROP TABLE messages; --"
#define URL_MAX  (PATH_MAX + 64)

static int use_pg;             /* --pg */
static PGconn *pg_admin;       /* to PG_TMP_URL: creates and drops databases */
static char pg_host[256];      /* of PG_TMP_URL */
static char pg_port[16];       /* of PG_TMP_URL */
static char pg_user[128];      /* of PG_TMP_URL */
static unsigned pg_db_counter; /* fresh database names */

enum { FX_DBS_MAX = 64 };

typedef struct {
  char dir[PATH_MAX];
  char url[URL_MAX];        /* the store of this test: setup() opens and migrates it */
  char path[URL_MAX];       /* SQLite: its file */
  char dbs[FX_DBS_MAX][64]; /* PostgreSQL: databases to drop at teardown */
  int ndbs;
  store_t *s;
} fx_t;

/* Fast and patient: these tests are about semantics, not fsync. */
static const store_options_t test_opt = {.sync = STORE_SYNC_NORMAL, .busy_timeout_ms = 30000};

static void pg_admin_exec(const char *sql) {
  PGresult *r = PQexec(pg_admin, sql);
  if (PQresultStatus(r) != PGRES_COMMAND_OK) print_error("%s: %s\n", sql, PQresultErrorMessage(r));
  assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
  PQclear(r);
}

/* A URL for a new, empty database named after `name`: a file in the test's
 * directory, or a fresh database in the cluster (dropped at teardown). */
static void new_db(fx_t *f, const char *name, char *url, size_t cap) {
  if (!use_pg) {
    snprintf(url, cap, "sqlite:%s/%s.db", f->dir, name);
    return;
  }
  char sql[128];
  assert_true(f->ndbs < FX_DBS_MAX);
  char *db = f->dbs[f->ndbs++];
  snprintf(db, sizeof f->dbs[0], "cvt_%d_%u", (int)getpid(), ++pg_db_counter);
  snprintf(sql, sizeof sql, "CREATE DATABASE %s", db);
  pg_admin_exec(sql);
  /* libpq's keyword form here; the URL form is tried in test_open_defaults. */
  snprintf(url, cap, "host=%s port=%s user=%s dbname=%s", pg_host, pg_port, pg_user, db);
}

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
  new_db(f, "store", f->url, sizeof f->url);
  if (!use_pg) snprintf(f->path, sizeof f->path, "%s", f->url + strlen("sqlite:"));
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
  for (int i = 0; i < f->ndbs; i++) {
    char sql[128];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", f->dbs[i]);
    PGresult *r = PQexec(pg_admin, sql);
    PQclear(r);
  }
  int rc = nftw(f->dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  free(f);
  return rc;
}

/* A raw connection to the test's database, for looking under the store and
 * for holding locks: one of the two is set. */
typedef struct {
  sqlite3 *lite;
  PGconn *pg;
} raw_t;

static raw_t raw_open_url(const char *url) {
  raw_t r = {0};
  if (strncmp(url, "sqlite:", 7) == 0) {
    assert_int_equal(sqlite3_open(url + 7, &r.lite), SQLITE_OK);
    sqlite3_busy_timeout(r.lite, 30000);
  } else {
    r.pg = PQconnectdb(url);
    if (PQstatus(r.pg) != CONNECTION_OK) print_error("%s: %s\n", url, PQerrorMessage(r.pg));
    assert_int_equal(PQstatus(r.pg), CONNECTION_OK);
  }
  return r;
}

static raw_t raw_open(const fx_t *f) { return raw_open_url(f->url); }

static void raw_close(raw_t *r) {
  if (r->lite != NULL) sqlite3_close(r->lite);
  PQfinish(r->pg);
  memset(r, 0, sizeof *r);
}

static int64_t raw_int(raw_t *r, const char *sql) {
  int64_t v = 0;
  if (r->lite != NULL) {
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(r->lite, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  } else {
    PGresult *res = PQexec(r->pg, sql);
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
      print_error("%s: %s\n", sql, PQresultErrorMessage(res));
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    assert_true(PQntuples(res) >= 1);
    v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
  }
  return v;
}

/* Statements whose results do not matter (PostgreSQL: one or several). */
static void raw_exec(raw_t *r, const char *sql) {
  if (r->lite != NULL) {
    assert_int_equal(sqlite3_exec(r->lite, sql, NULL, NULL, NULL), SQLITE_OK);
  } else {
    PGresult *res = PQexec(r->pg, sql);
    ExecStatusType st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
      print_error("%s: %s\n", sql, PQresultErrorMessage(res));
    assert_true(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK);
    PQclear(res);
  }
}

/* What SQLite's write lock is: no writer gets in, readers do. PostgreSQL's
 * EXCLUSIVE table lock is the same shape (it admits ACCESS SHARE only). */
static void raw_lock_writes(raw_t *r) {
  if (r->lite != NULL)
    raw_exec(r, "BEGIN IMMEDIATE");
  else
    raw_exec(r, "BEGIN; LOCK TABLE channels, conversations, messages, revocations"
                " IN EXCLUSIVE MODE");
}

static uint64_t mono_ms(void) { return util_mono_ms(); }

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
  char url[URL_MAX];
  assert_int_equal(store_open("mysql://localhost/cv", NULL, &s), -CV_EINVAL);
  assert_null(s);
  assert_int_equal(store_open("", NULL, &s), -CV_EINVAL);
  assert_int_equal(store_open("sqlite:", NULL, &s), -CV_EINVAL);
  assert_int_equal(store_open(NULL, NULL, &s), -CV_EINVAL);
  assert_int_equal(store_open(f->url, NULL, NULL), -CV_EINVAL);
  store_options_t bad = {.sync = (store_sync_t)7};
  assert_int_equal(store_open(f->url, &bad, &s), -CV_EINVAL);
  bad = (store_options_t){.sync = STORE_SYNC_FULL, .busy_timeout_ms = -1};
  assert_int_equal(store_open(f->url, &bad, &s), -CV_EINVAL);
  if (!use_pg) {
    /* the directory must exist */
    snprintf(url, sizeof url, "sqlite:%s/missing/x.db", f->dir);
    assert_int_equal(store_open(url, NULL, &s), -CV_ESTORE);
    assert_null(s);
  } else {
    /* the database must exist */
    snprintf(url, sizeof url, "host=%s port=%s user=%s dbname=cvt_missing", pg_host, pg_port,
             pg_user);
    assert_int_equal(store_open(url, NULL, &s), -CV_ESTORE);
    assert_null(s);
    /* libpq cannot parse these at all */
    assert_int_equal(store_open("postgres://localhost/cv?nonsense=1", NULL, &s), -CV_EINVAL);
    assert_int_equal(store_open("host=localhost dbname='open", NULL, &s), -CV_EINVAL);
    assert_null(s);
  }
  store_close(NULL);
  assert_int_equal(store_migrate(NULL), -CV_EINVAL);
  assert_int_equal(store_ping(NULL), -CV_EINVAL);
  assert_int_equal(store_read_begin(NULL), -CV_EINVAL);
  store_read_end(NULL);
}

/* Which backend a URL selects, and what logs show of it. */
static void test_url_forms(void **state) {
  (void)state;
  assert_string_equal(dburl_backend("sqlite:x.db"), "sqlite");
  assert_string_equal(dburl_backend("postgres://u@h:5432/db"), "postgres");
  assert_string_equal(dburl_backend("postgresql://"), "postgres");
  assert_string_equal(dburl_backend("host=h dbname=d"), "postgres");
  assert_string_equal(dburl_backend("  dbname = d"), "postgres");
  assert_null(dburl_backend("sqlite:"));
  assert_null(dburl_backend("mysql://h/db"));
  assert_null(dburl_backend("mysql://h/db?x=1"));
  assert_null(dburl_backend("data/converger.db"));
  assert_null(dburl_backend(""));
  assert_null(dburl_backend(NULL));

  char out[256];
  dburl_redact("postgres://alice:s3cret@db.example:5432/cv?sslmode=require", out, sizeof out);
  assert_string_equal(out, "postgres://alice:***@db.example:5432/cv?sslmode=require");
  dburl_redact("postgresql://alice@db/cv?password=s3cret&application_name=x", out, sizeof out);
  assert_string_equal(out, "postgresql://alice@db/cv?password=***&application_name=x");
  dburl_redact("postgres://a:b:c@h/db", out, sizeof out);
  assert_string_equal(out, "postgres://a:***@h/db");
  dburl_redact("postgres://h/db", out, sizeof out);
  assert_string_equal(out, "postgres://h/db");
  dburl_redact("host=h password=s3cret user=u", out, sizeof out);
  assert_string_equal(out, "host=h password=*** user=u");
  dburl_redact("password = 'it\\'s a secret' dbname=d", out, sizeof out);
  assert_string_equal(out, "password = *** dbname=d");
  dburl_redact("password='a b\\'c' dbname=d", out, sizeof out);
  assert_string_equal(out, "password=*** dbname=d");
  dburl_redact("mysql://root:hunter2@h/db", out, sizeof out);
  assert_string_equal(out, "mysql://root:***@h/db");
  dburl_redact("sqlite:data/x.db", out, sizeof out);
  assert_string_equal(out, "sqlite:data/x.db");
  dburl_redact("postgres://alice:s3cret@db.example:5432/cv", out, 12);
  assert_string_equal(out, "postgres://");
  /* a '?' in the password is still the password (libpq reads it so) */
  dburl_redact("postgres://user:s3cr?et@db.example/cv", out, sizeof out);
  assert_string_equal(out, "postgres://user:***@db.example/cv");
  dburl_redact("postgres://u@h?sslpassword=k3y&%70assword=pw&sslmode=require", out, sizeof out);
  assert_string_equal(out, "postgres://u@h?sslpassword=***&%70assword=***&sslmode=require");
  dburl_redact("host=h sslpassword=k3y", out, sizeof out);
  assert_string_equal(out, "host=h sslpassword=***");
}

static void test_open_defaults(void **state) {
  fx_t *f = *state;
  store_t *s = NULL;
  assert_int_equal(store_open(f->url, NULL, &s), 0);
  assert_int_equal(store_ping(s), 0);
  assert_int_equal(store_schema_version(s), 0); /* open does not migrate */
  raw_t raw = raw_open(f);
  if (!use_pg) {
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(raw.lite, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
  } else {
    /* the URL forms reach the same database */
    const char *db = f->dbs[0];
    const char *schemes[] = {"postgres", "postgresql"};
    for (int i = 0; i < 2; i++) {
      char url[URL_MAX];
      store_t *s2 = NULL;
      snprintf(url, sizeof url, "%s://%s@%s:%s/%s?connect_timeout=5", schemes[i], pg_user, pg_host,
               pg_port, db);
      assert_int_equal(store_open(url, NULL, &s2), 0);
      assert_int_equal(store_ping(s2), 0);
      store_close(s2);
    }
    /* the session is named after us (the URL may say otherwise) */
    assert_true(raw_int(&raw, "SELECT count(*) FROM pg_stat_activity"
                              " WHERE datname = current_database()"
                              " AND application_name = 'converger'") >= 1);
  }
  raw_close(&raw);
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

  raw_t raw = raw_open(f);
  assert_int_equal(raw_int(&raw, "SELECT count(*) FROM schema_version"), v);
  assert_int_equal(raw_int(&raw, "SELECT min(version) FROM schema_version"), 1);
  assert_int_equal(raw_int(&raw, "SELECT max(version) FROM schema_version"), v);
  assert_int_equal(raw_int(&raw, "SELECT count(*) FROM schema_version WHERE applied_at"
                                 " LIKE '____-__-__T__:__:__.___Z'"),
                   v);
  assert_int_equal(raw_int(&raw, use_pg ? "SELECT count(*) FROM information_schema.tables WHERE"
                                          " table_schema = current_schema() AND table_name IN"
                                          " ('channels', 'conversations', 'messages',"
                                          " 'revocations')"
                                        : "SELECT count(*) FROM sqlite_schema WHERE"
                                          " type = 'table' AND name IN ('channels',"
                                          " 'conversations', 'messages', 'revocations')"),
                   4);
  raw_close(&raw);
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

/* Several connections opening and migrating a fresh database at once: all
 * succeed, each step is applied once. Many rounds, because the race it
 * guards (SQLite: opens switching a new file to WAL at the same moment,
 * where SQLite answers SQLITE_BUSY without consulting the busy handler;
 * PostgreSQL: two CREATE TABLE IF NOT EXISTS at once) is narrow. */
static void test_migrate_concurrent(void **state) {
  fx_t *f = *state;
  enum { N = 6 };
  int rounds = use_pg ? 10 : 50; /* a PostgreSQL round creates a database */
  for (int r = 0; r < rounds; r++) {
    char url[URL_MAX], name[32];
    pthread_t th[N];
    migrator_t m[N];
    pthread_barrier_t bar;
    snprintf(name, sizeof name, "race-%d", r);
    new_db(f, name, url, sizeof url);
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
    raw_t raw = raw_open_url(url);
    assert_int_equal(raw_int(&raw, "SELECT count(*) FROM schema_version"), m[0].version);
    raw_close(&raw);
  }
}

/* ---- channels and conversations --------------------------------------- */

static void test_channels(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  store_channel_t c;
  store_conv_t v;
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

  /* the flags: presence and signals, each stored as 0/1; others refused */
  assert_int_equal(store_channel_create(s, "odd", "", 4, &c), -CV_EINVAL);
  assert_int_equal(
      store_channel_create(s, "quiet", "", STORE_CHANNEL_PRESENCE | STORE_CHANNEL_SIGNALS, &c), 0);
  assert_int_equal(c.presence, 1);
  assert_int_equal(c.signals, 1);
  assert_int_equal(store_channel_get(s, "quiet", &c), 0);
  assert_int_equal(c.presence, 1);
  assert_int_equal(c.signals, 1);
  assert_int_equal(store_channel_create(s, "typing", "", STORE_CHANNEL_SIGNALS, &c), 0);
  assert_int_equal(store_channel_get(s, "typing", &c), 0);
  assert_int_equal(c.presence, 0);
  assert_int_equal(c.signals, 1);
  assert_int_equal(store_channel_set_active(s, "typing", 0, &c), 0);
  assert_int_equal(c.signals, 1);
  assert_int_equal(store_conv_create(s, "t1", "typing", &v), 0);
  assert_int_equal(v.signals, 1);
  assert_int_equal(store_conv_get(s, "t1", &v), 0);
  assert_int_equal(v.signals, 1);
  assert_int_equal(v.presence, 0);
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

/* ---- epochs ------------------------------------------------------------ */

static int is_epoch(const char *e) {
  if (strlen(e) != 8) return 0;
  for (; *e; e++)
    if (!((*e >= '0' && *e <= '9') || (*e >= 'a' && *e <= 'f'))) return 0;
  return 1;
}

/* Every conversation has an epoch from its creation; appends and replays
 * carry it; rotating draws a new one for one conversation or for all. */
static void test_epochs(void **state) {
  fx_t *f = *state;
  store_t *s = f->s;
  store_conv_t a, b, v;
  assert_int_equal(store_channel_create(s, "ch", "Ch", 0, NULL), 0);
  assert_int_equal(store_conv_create(s, "c1", "ch", &a), 0);
  assert_int_equal(store_conv_create(s, "c2", "ch", &b), 0);
  assert_true(is_epoch(a.epoch));
  assert_true(is_epoch(b.epoch));
  assert_string_not_equal(a.epoch, b.epoch); /* drawn at random: 2^-32 */
  assert_int_equal(store_conv_get(s, "c1", &v), 0);
  assert_string_equal(v.epoch, a.epoch);

  store_msg_t m;
  int created = 0;
  assert_int_equal(store_append(s, "c1", "m1", "alice", "{}", 1, &m, &created), 0);
  assert_string_equal(m.epoch, a.epoch);
  store_msg_clear(&m);
  assert_int_equal(store_append(s, "c1", "m1", "alice", "{}", 1, &m, &created), 0);
  assert_int_equal(created, 0);
  assert_string_equal(m.epoch, a.epoch); /* a retry's answer too */
  store_msg_clear(&m);
  append_ok(s, "c1", "m2", "{}");
  store_msg_t *page = NULL;
  size_t n = 0;
  assert_int_equal(store_replay(s, "c1", 0, -1, 10, 0, &page, &n), 0);
  assert_int_equal(n, 2);
  assert_string_equal(page[0].epoch, a.epoch);
  assert_string_equal(page[1].epoch, a.epoch);
  store_msgs_free(page, n);

  /* one conversation: only its epoch changes, and its history stays */
  int64_t count = -1;
  assert_int_equal(store_epoch_rotate(s, "c1", &count), 0);
  assert_int_equal(count, 1);
  assert_int_equal(store_conv_get(s, "c1", &v), 0);
  assert_true(is_epoch(v.epoch));
  assert_string_not_equal(v.epoch, a.epoch);
  assert_int_equal(v.head, 2);
  char c1_epoch[STORE_EPOCH_MAX + 1];
  strcpy(c1_epoch, v.epoch);
  assert_int_equal(store_conv_get(s, "c2", &v), 0);
  assert_string_equal(v.epoch, b.epoch);
  assert_int_equal(store_replay(s, "c1", 0, -1, 10, 0, &page, &n), 0);
  assert_int_equal(n, 2);
  assert_string_equal(page[0].epoch, c1_epoch);
  store_msgs_free(page, n);

  /* every conversation */
  assert_int_equal(store_epoch_rotate(s, NULL, &count), 0);
  assert_int_equal(count, 2);
  assert_int_equal(store_conv_get(s, "c1", &v), 0);
  assert_string_not_equal(v.epoch, c1_epoch);
  assert_int_equal(store_conv_get(s, "c2", &v), 0);
  assert_string_not_equal(v.epoch, b.epoch);
  assert_int_equal(store_epoch_rotate(s, "nope", &count), -CV_ENOTFOUND);
  assert_int_equal(count, 0);
  assert_int_equal(store_epoch_rotate(s, "bad id", NULL), -CV_EINVAL);

  /* A database from before epochs (schema version 2): migrating gives
   * every conversation that exists an epoch of its own (and the nodes
   * their capacity, version 4, and admin URL, version 6). */
  raw_t raw = raw_open(f);
  raw_exec(&raw, "ALTER TABLE conversations DROP COLUMN epoch");
  raw_exec(&raw, "ALTER TABLE nodes DROP COLUMN capacity");
  raw_exec(&raw, "ALTER TABLE nodes DROP COLUMN admin_url");
  raw_exec(&raw, "ALTER TABLE channels DROP COLUMN signals");
  raw_exec(&raw, "DROP TABLE IF EXISTS presence");
  if (!raw.lite) { /* and what PostgreSQL's migrations 8 and 9 made (a sharded cluster's) */
    raw_exec(&raw, "DROP TABLE IF EXISTS shard_map, shard_map_version, shard_instances, shard_moved");
    raw_exec(&raw, "ALTER TABLE nodes DROP COLUMN IF EXISTS map_version");
  }
  raw_exec(&raw, "DELETE FROM schema_version WHERE version >= 3");
  raw_close(&raw);
  store_close(f->s);
  assert_int_equal(store_open(f->url, &test_opt, &f->s), 0);
  assert_int_equal(store_migrate(f->s), 0);
  assert_int_equal(store_conv_get(f->s, "c1", &a), 0);
  assert_int_equal(store_conv_get(f->s, "c2", &b), 0);
  assert_true(is_epoch(a.epoch));
  assert_true(is_epoch(b.epoch));
  assert_string_not_equal(a.epoch, b.epoch);
  assert_int_equal(a.head, 2);
  assert_int_equal(store_conv_create(f->s, "c3", "ch", &v), 0);
  assert_true(is_epoch(v.epoch));
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
  raw_t raw = raw_open(*state);
  assert_int_equal(raw_int(&raw, "SELECT count(*) FROM messages WHERE conv = 'nope'"), 0);
  raw_close(&raw);
}

/* ---- group commit (store_append_batch) ---------------------------------- */

typedef struct {
  store_append_t a[16];
  store_append_t *p[16];
  size_t n;
} batch_t;

static void batch_add(batch_t *b, const char *conv, const char *id, const char *body) {
  b->a[b->n] = (store_append_t){
      .conv = conv, .id = id, .sender = "alice", .body = body, .ts_ms = 1000 + (int64_t)b->n};
  b->p[b->n] = &b->a[b->n];
  b->n++;
}

static void batch_clear(batch_t *b) {
  for (size_t i = 0; i < b->n; i++) store_msg_clear(&b->a[i].msg);
  b->n = 0;
}

/* The replay of `conv` is exactly the ids in `want` (space-separated),
 * seq 1, 2, ... in that order. */
static void assert_history(store_t *s, const char *conv, const char *want) {
  store_msg_t *v = NULL;
  size_t n = 0;
  assert_int_equal(store_replay(s, conv, 0, -1, 100, 0, &v, &n), 0);
  char got[512] = "";
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(v[i].seq, (int64_t)i + 1);
    size_t len = strlen(got);
    snprintf(got + len, sizeof got - len, "%s%s", i ? " " : "", v[i].id);
  }
  store_msgs_free(v, n);
  assert_string_equal(got, want);
  assert_int_equal(head_of(s, conv), (int64_t)n);
}

/* One transaction for many appends, with the answers of as many single
 * appends: seqs in array order per conversation, a retry of a stored id
 * or of one earlier in the same group answered with the first message, a
 * missing or inactive conversation failing only its own item. */
static void test_append_batch(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  assert_int_equal(store_conv_create(s, "c2", "ch", NULL), 0);
  mk_conv(s, "off", "c3");
  assert_int_equal(store_channel_set_active(s, "off", 0, NULL), 0);
  assert_int_equal(append_ok(s, "c1", "old", "{\"n\":0}"), 1);

  batch_t b = {0};
  batch_add(&b, "c1", "a", "{\"n\":1}");
  batch_add(&b, "c2", "a", "{\"n\":2}");
  batch_add(&b, "c1", "b", "{\"n\":3}");
  batch_add(&b, "nope", "x", "{}");
  batch_add(&b, "c3", "y", "{}");
  batch_add(&b, "c1", "old", "{\"n\":\"changed\"}"); /* a retry of a stored one */
  batch_add(&b, "c1", "a", "{\"n\":\"again\"}");     /* a retry within the group */
  batch_add(&b, "c1", "c", "{\"n\":4}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  const int status[] = {0, 0, 0, -CV_ENOTFOUND, -CV_EINACTIVE, 0, 0, 0};
  const int created[] = {1, 1, 1, 0, 0, 0, 0, 1};
  const int64_t seq[] = {2, 1, 3, 0, 0, 1, 2, 4};
  const char *body[] = {"{\"n\":1}", "{\"n\":2}", "{\"n\":3}", NULL,
                        NULL,        "{\"n\":0}", "{\"n\":1}", "{\"n\":4}"};
  for (size_t i = 0; i < b.n; i++) {
    assert_int_equal(b.a[i].status, status[i]);
    assert_int_equal(b.a[i].created, created[i]);
    assert_int_equal(b.a[i].msg.seq, seq[i]);
    if (body[i]) {
      assert_string_equal(b.a[i].msg.body, body[i]);
      assert_string_equal(b.a[i].msg.id, b.a[i].id);
      assert_string_equal(b.a[i].msg.sender, "alice");
      assert_true(is_epoch(b.a[i].msg.epoch));
    } else {
      assert_null(b.a[i].msg.body);
    }
  }
  assert_int_equal(b.a[0].msg.ts_ms, 1000);
  assert_int_equal(b.a[6].msg.ts_ms, 1000); /* the first one's time */
  batch_clear(&b);
  assert_history(s, "c1", "old a b c");
  assert_history(s, "c2", "a");
  assert_int_equal(head_of(s, "c3"), 0);

  /* Bad arguments fail their own items only. */
  batch_add(&b, "c2", "bad id", "{}");
  batch_add(&b, "c2", "d", "{}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  assert_int_equal(b.a[0].status, -CV_EINVAL);
  assert_int_equal(b.a[1].status, 0);
  assert_int_equal(b.a[1].msg.seq, 2);
  batch_clear(&b);
  assert_int_equal(store_append_batch(s, b.p, 0), -CV_EINVAL);
  assert_int_equal(store_append_batch(NULL, b.p, 1), -CV_EINVAL);
}

/* A group that fails as a whole (here a trigger refusing one message, as
 * a constraint would) is rolled back and its items appended one by one:
 * only the item that must fail fails, and nothing is lost or doubled. */
static void test_append_batch_failure_isolated(void **state) {
  fx_t *f = *state;
  store_t *s = f->s;
  mk_conv(s, "ch", "c1");
  assert_int_equal(store_conv_create(s, "c2", "ch", NULL), 0);
  raw_t raw = raw_open(f);
  if (use_pg) {
    raw_exec(&raw, "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                   " IF NEW.id = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF;"
                   " RETURN NEW; END $$");
    raw_exec(&raw, "CREATE TRIGGER poison BEFORE INSERT ON messages"
                   " FOR EACH ROW EXECUTE FUNCTION poison()");
  } else {
    raw_exec(&raw, "CREATE TRIGGER poison BEFORE INSERT ON messages WHEN NEW.id = 'poison'"
                   " BEGIN SELECT RAISE(ABORT, 'poisoned'); END");
  }
  raw_close(&raw);
  batch_t b = {0};
  batch_add(&b, "c1", "a", "{}");
  batch_add(&b, "c2", "a", "{}");
  batch_add(&b, "c1", "poison", "{}");
  batch_add(&b, "c1", "b", "{}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  assert_int_equal(b.a[0].status, 0);
  assert_int_equal(b.a[1].status, 0);
  assert_int_not_equal(b.a[2].status, 0);
  assert_int_equal(b.a[2].created, 0);
  assert_null(b.a[2].msg.body);
  assert_int_equal(b.a[3].status, 0);
  assert_int_equal(b.a[3].msg.seq, 2);
  for (int i = 0; i < 4; i++) assert_int_equal(b.a[i].created, i != 2);
  batch_clear(&b);
  assert_history(s, "c1", "a b");
  assert_history(s, "c2", "a");
}

enum { BW_THREADS = 4, BW_ROUNDS = 30, BW_CONVS = 5, BW_PER = 6 };

typedef struct {
  const char *url;
  pthread_barrier_t *bar;
  int w, err;
} bwriter_t;

/* Groups over the conversations in a different order each time, and
 * single appends in between: on PostgreSQL the row locks of groups that
 * share conversations (taken in id order: no deadlock). */
static void *bwriter_main(void *arg) {
  bwriter_t *wr = arg;
  store_t *s = NULL;
  wr->err = store_open(wr->url, &test_opt, &s);
  pthread_barrier_wait(wr->bar);
  static const char *convs[BW_CONVS] = {"b0", "b1", "b2", "b3", "b4"};
  for (int r = 0; wr->err == 0 && r < BW_ROUNDS; r++) {
    char ids[BW_PER][32];
    store_append_t a[BW_PER];
    store_append_t *p[BW_PER];
    for (int i = 0; i < BW_PER; i++) {
      snprintf(ids[i], sizeof ids[i], "w%d-r%d-%d", wr->w, r, i);
      a[i] = (store_append_t){.conv = convs[(2 * BW_CONVS - 1 - i + r * (wr->w + 1)) % BW_CONVS],
                              .id = ids[i],
                              .sender = "w",
                              .body = "{}",
                              .ts_ms = 1};
      p[i] = &a[i];
    }
    if (r % 5 == 4) {
      for (int i = 0; wr->err == 0 && i < BW_PER; i++) {
        store_msg_t m;
        int created;
        wr->err = store_append(s, a[i].conv, a[i].id, "w", "{}", 1, &m, &created);
        store_msg_clear(&m);
      }
      continue;
    }
    wr->err = store_append_batch(s, p, BW_PER);
    for (int i = 0; i < BW_PER; i++) {
      if (wr->err == 0 && (a[i].status != 0 || !a[i].created))
        wr->err = a[i].status ? a[i].status : -1;
      store_msg_clear(&a[i].msg);
    }
  }
  store_close(s);
  return NULL;
}

static void test_append_batch_concurrent_gapless(void **state) {
  fx_t *f = *state;
  static const char *convs[BW_CONVS] = {"b0", "b1", "b2", "b3", "b4"};
  mk_conv(f->s, "ch", convs[0]);
  for (int c = 1; c < BW_CONVS; c++)
    assert_int_equal(store_conv_create(f->s, convs[c], "ch", NULL), 0);
  bwriter_t wr[BW_THREADS];
  pthread_t th[BW_THREADS];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, BW_THREADS);
  for (int w = 0; w < BW_THREADS; w++) {
    wr[w] = (bwriter_t){.url = f->url, .bar = &bar, .w = w};
    assert_int_equal(pthread_create(&th[w], NULL, bwriter_main, &wr[w]), 0);
  }
  for (int w = 0; w < BW_THREADS; w++) pthread_join(th[w], NULL);
  pthread_barrier_destroy(&bar);
  for (int w = 0; w < BW_THREADS; w++) {
    if (wr[w].err) print_error("writer %d: %s\n", w, cv_strerror(wr[w].err));
    assert_int_equal(wr[w].err, 0);
  }
  int64_t total = 0;
  for (int c = 0; c < BW_CONVS; c++) {
    store_msg_t *v = NULL;
    size_t n = 0;
    int64_t head = head_of(f->s, convs[c]);
    assert_int_equal(store_replay(f->s, convs[c], 0, -1, 1000, 0, &v, &n), 0);
    assert_int_equal((int64_t)n, head);
    for (size_t i = 0; i < n; i++) assert_int_equal(v[i].seq, (int64_t)i + 1);
    store_msgs_free(v, n);
    total += head;
  }
  assert_int_equal(total, BW_THREADS * BW_ROUNDS * BW_PER);
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

  raw_t raw = raw_open(*state);
  assert_int_equal(raw_int(&raw, "SELECT count(*) FROM messages"), 1);
  assert_int_equal(raw_int(&raw, "SELECT count(*) FROM channels"), 1);
  raw_close(&raw);
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

  raw_t raw = raw_open(*state);
  assert_int_equal(raw_int(&raw, "SELECT count(*) FROM revocations"), 3);
  raw_close(&raw);
}

/* ---- membership ---------------------------------------------------------- */

/* "id/state/connections/waiters/updated_ms,..." of the live rows, in the
 * order returned. */
static void expect_live(store_t *s, int64_t now_ms, int64_t max_age_ms, const char *want) {
  store_node_t *v = (store_node_t *)&v;
  size_t n = 99;
  char got[1024] = "";
  assert_int_equal(store_nodes_live(s, now_ms, max_age_ms, &v, &n), 0);
  if (n == 0) assert_null(v);
  for (size_t i = 0; i < n; i++) {
    char row[300];
    snprintf(row, sizeof row, "%s%s/%s/%lld/%lld/%lld", i > 0 ? "," : "", v[i].id, v[i].state,
             (long long)v[i].connections, (long long)v[i].waiters, (long long)v[i].updated_ms);
    strcat(got, row);
  }
  assert_string_equal(got, want);
  store_nodes_free(v);
}

static void test_membership(void **state) {
  fx_t *f = *state;
  store_t *s = f->s;
  expect_live(s, 10000, 3000, "");
  assert_int_equal(store_node_beat(s, "node-b", "ws://b:1/v1/ws", "", "ready", 3, 1, 0, 9000), 0);
  assert_int_equal(store_node_beat(s, "node-a", "ws://a:1/v1/ws", "", "ready", 5, 0, 0, 8000), 0);
  assert_int_equal(store_node_beat(s, "node-c", "ws://c:1/v1/ws", "", "draining", 0, 0, 0, 6999),
                   0);
  /* ordered by id; updated_ms >= now - max_age; older rows are not live */
  expect_live(s, 10000, 3000, "node-a/ready/5/0/8000,node-b/ready/3/1/9000");
  expect_live(s, 9999, 3000,
              "node-a/ready/5/0/8000,node-b/ready/3/1/9000,node-c/draining/0/0/6999");
  expect_live(s, 20000, 3000, "");

  /* upsert replaces every field of the row */
  assert_int_equal(store_node_beat(s, "node-a", "wss://a.example/v1/ws", "http://a.example:9090",
                                   "draining", 7, 2, 5000, 19000),
                   0);
  expect_live(s, 20000, 3000, "node-a/draining/7/2/19000");
  store_node_t *v = NULL;
  size_t n = 0;
  assert_int_equal(store_nodes_live(s, 20000, 3000, &v, &n), 0);
  assert_int_equal(n, 1);
  assert_string_equal(v[0].public_url, "wss://a.example/v1/ws");
  assert_string_equal(v[0].admin_url, "http://a.example:9090");
  assert_int_equal(v[0].capacity, 5000);
  store_nodes_free(v);

  /* another connection (another node) sees the same table; values are
   * parameters, never SQL */
  store_t *s2 = NULL;
  assert_int_equal(store_open(f->url, &test_opt, &s2), 0);
  assert_int_equal(store_node_beat(s2, SQL_EVIL, "ws://" SQL_EVIL, "", "ready", 0, 0, 0, 19500), 0);
  assert_int_equal(store_nodes_live(s2, 20000, 3000, &v, &n), 0);
  assert_int_equal(n, 2);
  assert_string_equal(v[0].id, SQL_EVIL); /* "'" sorts before "n" */
  assert_string_equal(v[0].public_url, "ws://" SQL_EVIL);
  assert_string_equal(v[1].id, "node-a");
  store_nodes_free(v);
  store_close(s2);

  /* bad arguments */
  assert_int_equal(store_node_beat(s, "x", "ws://x", "", "gone", 0, 0, 0, 1), -CV_EINVAL);
  assert_int_equal(store_node_beat(s, "x", "ws://x", "", NULL, 0, 0, 0, 1), -CV_EINVAL);
  assert_int_equal(store_node_beat(s, "", "ws://x", "", "ready", 0, 0, 0, 1), -CV_EINVAL);
  assert_int_equal(store_node_beat(s, "x", "", "", "ready", 0, 0, 0, 1), -CV_EINVAL);
  assert_int_equal(store_node_beat(s, "x", "ws://x", "", "ready", -1, 0, 0, 1), -CV_EINVAL);
  assert_int_equal(store_node_beat(s, "x", "ws://x", "", "ready", 0, -1, 0, 1), -CV_EINVAL);
  assert_int_equal(store_node_beat(s, "x", "ws://x", "", "ready", 0, 0, -1, 1), -CV_EINVAL);
  assert_int_equal(store_nodes_live(s, 1, -1, &v, &n), -CV_EINVAL);
  assert_null(v);
  assert_int_equal(n, 0);
  assert_int_equal(store_nodes_live(s, 1, 1, NULL, &n), -CV_EINVAL);

  raw_t raw = raw_open(f);
  assert_int_equal(raw_int(&raw, "SELECT count(*) FROM nodes"), 4); /* rows are never deleted */
  raw_close(&raw);
}

/* ---- locks -------------------------------------------------------------- */

/* A write lock held elsewhere: -CV_EBUSY after the busy timeout (PostgreSQL:
 * lock_timeout), nothing left half done, reads still served (WAL; MVCC),
 * and the connection fine after. */
static void test_busy(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  assert_int_equal(append_ok(f->s, "c1", "m1", "{}"), 1);

  store_options_t quick = {.sync = STORE_SYNC_NORMAL, .busy_timeout_ms = 50};
  store_t *s2 = NULL;
  assert_int_equal(store_open(f->url, &quick, &s2), 0);
  raw_t raw = raw_open(f);
  raw_lock_writes(&raw);

  store_msg_t m;
  int created = 1;
  assert_int_equal(store_append(s2, "c1", "m2", "a", "{}", 1, &m, &created), -CV_EBUSY);
  assert_int_equal(created, 0);
  assert_int_equal(store_channel_create(s2, "ch2", "x", 0, NULL), -CV_EBUSY);
  assert_int_equal(store_conv_create(s2, "c2", "ch", NULL), -CV_EBUSY);
  assert_int_equal(store_revoke(s2, "j", 1), -CV_EBUSY);
  assert_int_equal(head_of(s2, "c1"), 1);
  expect_page(s2, "c1", 0, -1, 10, 1, 1);

  raw_exec(&raw, "COMMIT");
  raw_close(&raw);

  /* no transaction was left open on s2 */
  assert_int_equal(store_append(s2, "c1", "m2", "a", "{}", 1, &m, &created), 0);
  assert_int_equal(m.seq, 2);
  store_msg_clear(&m);
  assert_int_equal(store_channel_create(s2, "ch2", "x", 0, NULL), 0);
  assert_int_equal(head_of(f->s, "c1"), 2);
  store_close(s2);
}

/* Deadlines (store_set_deadline). The database is write-locked by another
 * connection and the store's busy timeout is 30 s: an append with a 300 ms
 * deadline fails with -CV_ETIMEDOUT at about 300 ms. With the deadline
 * already passed, a write fails at once and a replay of 200 messages fails
 * too (PostgreSQL sends nothing; SQLite interrupts it), also inside a read
 * transaction, which store_read_end still ends. With a deadline ahead,
 * reads go on beside the lock. Without one, once the lock is gone, the
 * same store appends again: nothing was left open, and on PostgreSQL the
 * connection closed at the deadline was replaced. */
static void test_deadline(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  fill(f->s, "c1", 200);
  store_t *s2 = NULL;
  assert_int_equal(store_open(f->url, &test_opt, &s2), 0);
  raw_t raw = raw_open(f);
  raw_lock_writes(&raw);

  store_msg_t m;
  int created = 1;
  uint64_t t0 = mono_ms();
  store_set_deadline(s2, t0 + 300);
  assert_int_equal(store_append(s2, "c1", "m201", "a", "{}", 1, &m, &created), -CV_ETIMEDOUT);
  uint64_t took = mono_ms() - t0;
  assert_true(took >= 250 && took < 2000);
  assert_int_equal(created, 0);
  assert_true(store_deadline_hit(s2));

  store_set_deadline(s2, mono_ms());
  assert_false(store_deadline_hit(s2));
  t0 = mono_ms();
  assert_int_equal(store_revoke(s2, "j", 1), -CV_ETIMEDOUT);
  assert_true(mono_ms() - t0 < 200);
  store_msg_t *v = NULL;
  size_t n = 0;
  assert_int_equal(store_replay(s2, "c1", 0, -1, 1000, 0, &v, &n), -CV_ETIMEDOUT);
  assert_null(v);
  assert_true(store_deadline_hit(s2));

  store_set_deadline(s2, mono_ms() + 10000);
  assert_int_equal(head_of(s2, "c1"), 200);
  assert_int_equal(store_read_begin(s2), 0);
  assert_int_equal(head_of(s2, "c1"), 200);
  store_set_deadline(s2, mono_ms());
  assert_int_equal(store_replay(s2, "c1", 0, -1, 1000, 0, &v, &n), -CV_ETIMEDOUT);
  store_read_end(s2);
  assert_false(store_deadline_hit(f->s)); /* the other store has its own */

  raw_exec(&raw, "COMMIT");
  raw_close(&raw);
  store_set_deadline(s2, 0);
  assert_int_equal(store_append(s2, "c1", "m201", "a", "{}", 1, &m, &created), 0);
  assert_int_equal(m.seq, 201);
  assert_int_equal(created, 1);
  store_msg_clear(&m);
  assert_false(store_deadline_hit(s2));
  assert_int_equal(head_of(f->s, "c1"), 201);
  expect_page(s2, "c1", 195, -1, 10, 196, 6);
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

/* One snapshot from store_read_begin to store_read_end: a message appended
 * meanwhile by another connection is not seen until the end; an append on
 * the reading connection fails and leaves the snapshot as it was. */
static void test_read_snapshot(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  assert_int_equal(append_ok(f->s, "c1", "m1", "{}"), 1);
  store_t *s2 = NULL;
  assert_int_equal(store_open(f->url, &test_opt, &s2), 0);

  store_read_end(f->s); /* none open: a no-op */
  assert_int_equal(store_read_begin(f->s), 0);
  assert_int_equal(head_of(f->s, "c1"), 1); /* the snapshot starts here at the latest */
  assert_int_equal(append_ok(s2, "c1", "m2", "{}"), 2);
  assert_int_equal(head_of(f->s, "c1"), 1);
  expect_page(f->s, "c1", 0, -1, 10, 1, 1);
  store_msg_t m;
  int created = 1;
  assert_true(store_append(f->s, "c1", "m3", "a", "{}", 1, &m, &created) < 0);
  assert_int_equal(created, 0);
  assert_null(m.sender);
  assert_int_equal(head_of(f->s, "c1"), 1);
  store_read_end(f->s);
  store_read_end(f->s);

  assert_int_equal(head_of(f->s, "c1"), 2);
  expect_page(f->s, "c1", 0, -1, 10, 1, 2);
  assert_int_equal(append_ok(f->s, "c1", "m3", "{}"), 3);
  store_close(s2);
}

/* The same id appended by several connections at the same instant: one of
 * them creates it, every one gets its seq, and no seq is spent twice. */
enum { TWINS = 4, TWIN_ROUNDS = 40 };

typedef struct {
  store_t *s;
  pthread_barrier_t *bar;
  int err[TWIN_ROUNDS], created[TWIN_ROUNDS];
  int64_t seq[TWIN_ROUNDS];
} twin_t;

static void *twin_main(void *arg) {
  twin_t *t = arg;
  for (int r = 0; r < TWIN_ROUNDS; r++) {
    char id[32];
    store_msg_t m;
    snprintf(id, sizeof id, "same-%d", r);
    pthread_barrier_wait(t->bar);
    t->err[r] = store_append(t->s, "c1", id, "twin", "{}", 1, &m, &t->created[r]);
    t->seq[r] = m.seq;
    store_msg_clear(&m);
  }
  return NULL;
}

static void test_idempotent_race(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  static twin_t tw[TWINS];
  pthread_t th[TWINS];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, TWINS);
  for (int i = 0; i < TWINS; i++) {
    tw[i] = (twin_t){.bar = &bar};
    assert_int_equal(store_open(f->url, &test_opt, &tw[i].s), 0);
    assert_int_equal(pthread_create(&th[i], NULL, twin_main, &tw[i]), 0);
  }
  for (int i = 0; i < TWINS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  for (int r = 0; r < TWIN_ROUNDS; r++) {
    int made = 0;
    for (int i = 0; i < TWINS; i++) {
      if (tw[i].err[r] != 0)
        print_error("round %d, twin %d: %s\n", r, i, cv_strerror(tw[i].err[r]));
      assert_int_equal(tw[i].err[r], 0);
      assert_int_equal(tw[i].seq[r], r + 1);
      made += tw[i].created[r];
    }
    assert_int_equal(made, 1);
  }
  for (int i = 0; i < TWINS; i++) store_close(tw[i].s);
  assert_int_equal(head_of(f->s, "c1"), TWIN_ROUNDS);
}

/* ---- PostgreSQL only ---------------------------------------------------- */

/* The append lock is the conversation's row: a writer holding it delays
 * appends to that conversation only (-CV_EBUSY after lock_timeout), and
 * the refused append spends no seq. */
static void test_pg_row_lock_per_conversation(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  assert_int_equal(store_conv_create(f->s, "c2", "ch", NULL), 0);
  assert_int_equal(append_ok(f->s, "c1", "m1", "{}"), 1);

  store_options_t quick = {.busy_timeout_ms = 100};
  store_t *s2 = NULL;
  assert_int_equal(store_open(f->url, &quick, &s2), 0);
  raw_t raw = raw_open(f);
  raw_exec(&raw, "BEGIN; SELECT head FROM conversations WHERE id = 'c1' FOR UPDATE");

  store_msg_t m;
  int created = 1;
  uint64_t t0 = mono_ms();
  assert_int_equal(store_append(s2, "c1", "m2", "a", "{}", 1, &m, &created), -CV_EBUSY);
  uint64_t waited = mono_ms() - t0;
  assert_true(waited >= 90 && waited < 2000);
  assert_int_equal(append_ok(s2, "c2", "m1", "{}"), 1); /* another conversation: free */
  assert_int_equal(head_of(s2, "c1"), 1);               /* reads are not blocked */
  raw_exec(&raw, "ROLLBACK");
  raw_close(&raw);

  assert_int_equal(store_append(s2, "c1", "m2", "a", "{}", 1, &m, &created), 0);
  assert_int_equal(m.seq, 2);
  assert_int_equal(created, 1);
  store_msg_clear(&m);
  store_close(s2);
}

/* A deactivation that commits while an append waits for the conversation's
 * lock is seen by that append: it is refused as inactive, never stored
 * after the deactivation (SQLite's single writer orders them the same way). */
typedef struct {
  store_t *s;
  int rc;
} waiter_t;

static void *append_waiter(void *arg) {
  waiter_t *w = arg;
  store_msg_t m;
  int created = 0;
  w->rc = store_append(w->s, "c1", "late", "a", "{}", 1, &m, &created);
  if (w->rc == 0) store_msg_clear(&m);
  return NULL;
}

static void test_pg_deactivation_during_append_wait(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  store_t *s2 = NULL;
  assert_int_equal(store_open(f->url, &test_opt, &s2), 0);
  raw_t holder = raw_open(f), admin = raw_open(f);
  raw_exec(&holder, "BEGIN; SELECT head FROM conversations WHERE id = 'c1' FOR UPDATE");
  waiter_t w = {s2, 1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, append_waiter, &w), 0);
  usleep(200 * 1000); /* the append now waits for the row lock */
  raw_exec(&admin, "UPDATE channels SET active = 0 WHERE id = 'ch'"); /* commits at once */
  raw_exec(&holder, "COMMIT");
  pthread_join(th, NULL);
  assert_int_equal(w.rc, -CV_EINACTIVE);
  assert_int_equal(head_of(f->s, "c1"), 0);
  raw_close(&holder);
  raw_close(&admin);
  store_close(s2);
}

/* The database's default isolation does not matter: appends and
 * migrations name READ COMMITTED themselves (under SERIALIZABLE, concurrent
 * appenders would otherwise fail with serialization errors). */
typedef struct {
  store_t *s;
  int index, failed;
} iso_writer_t;

static void *iso_writer(void *arg) {
  iso_writer_t *w = arg;
  for (int k = 0; k < 25; k++) {
    char id[32];
    snprintf(id, sizeof id, "m-%d-%d", w->index, k);
    store_msg_t m;
    int created = 0;
    if (store_append(w->s, "c1", id, "a", "{}", 1, &m, &created) != 0)
      w->failed++;
    else
      store_msg_clear(&m);
  }
  return NULL;
}

static void test_pg_default_isolation_does_not_matter(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  raw_t admin = raw_open(f);
  raw_exec(&admin, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET "
                   "default_transaction_isolation = serializable', current_database()); END $$");
  raw_close(&admin);
  enum { N = 4 };
  iso_writer_t w[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    w[i] = (iso_writer_t){NULL, i, 0};
    assert_int_equal(store_open(f->url, &test_opt, &w[i].s), 0);
  }
  for (int i = 0; i < N; i++) assert_int_equal(pthread_create(&th[i], NULL, iso_writer, &w[i]), 0);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) assert_int_equal(w[i].failed, 0);
  assert_int_equal(head_of(f->s, "c1"), N * 25);
  assert_int_equal(store_migrate(w[0].s), 0);
  for (int i = 0; i < N; i++) store_close(w[i].s);
}

/* A port nobody listens on: an error at once, not a hang. */
static void test_pg_closed_port_fails_fast(void **state) {
  (void)state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd); /* bound, never listened: now closed */
  char url[128];
  snprintf(url, sizeof url, "postgres://postgres@127.0.0.1:%d/converger", ntohs(a.sin_port));
  store_t *s = (store_t *)&s;
  uint64_t t0 = mono_ms();
  assert_int_equal(store_open(url, NULL, &s), -CV_ESTORE);
  assert_true(mono_ms() - t0 < 1500);
  assert_null(s);
}

/* A sharded router whose map has a working instance (0) and one on a
 * closed port (1): the migration's visit of instance 1 fails, and
 * store_shards_export shows it in the registry as up 0 with one error,
 * instance 0 as up 1 with none; a second export adds no error that did
 * not happen (the counter rises by the errors since the last export). */
static void test_pg_shard_health_exported(void **state) {
  fx_t *f = *state;
  char good[URL_MAX], bad[128];
  new_db(f, "instance0", good, sizeof good);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd); /* bound, never listened: now closed */
  snprintf(bad, sizeof bad, "postgres://u:s3cret@127.0.0.1:%d/converger", ntohs(a.sin_port));
  const char *urls[] = {good, bad};
  assert_int_equal(store_shardmap_init(f->s, urls, 2), 0);

  metrics_t *m = metrics_new();
  assert_non_null(m);
  store_shards_t *sh = store_shards_new(2, m);
  assert_non_null(sh);
  store_shards_export(sh); /* before the map is read: nothing */
  size_t n;
  char *text = metrics_render(m, &n);
  assert_null(strstr(text, "converger_shard_up{"));
  free(text);

  store_options_t o = test_opt;
  o.shards = sh;
  store_t *r = NULL;
  assert_int_equal(store_open(f->url, &o, &r), 0);
  assert_int_equal(store_migrate(r), 0); /* visits both instances; 1 refuses */
  assert_int_equal(store_shards_count(sh), 2);
  store_shard_stats_t st;
  char shown[128];
  store_shards_stats(sh, 1, &st, shown, sizeof shown);
  assert_int_equal(st.up, 0);
  assert_int_equal(st.errors, 1);
  assert_null(strstr(shown, "s3cret"));

  for (int round = 0; round < 2; round++) {
    store_shards_export(sh);
    text = metrics_render(m, &n);
    assert_non_null(strstr(text, "converger_shard_up{db_instance=\"0\"} 1\n"));
    assert_non_null(strstr(text, "converger_shard_up{db_instance=\"1\"} 0\n"));
    assert_non_null(strstr(text, "converger_shard_errors_total{db_instance=\"0\"} 0\n"));
    assert_non_null(strstr(text, "converger_shard_errors_total{db_instance=\"1\"} 1\n"));
    free(text);
  }
  store_close(r);
  store_shards_free(sh);
  metrics_free(m);
}

/* A server that accepts TCP connections but never answers (a hung host, a
 * black-holing proxy): store_open gives up after the connect timeout, 1 s
 * by default, or the URL's connect_timeout. */
static void test_pg_silent_server_times_out(void **state) {
  (void)state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 16), 0); /* the kernel completes handshakes; we never read */
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  char url[160];
  snprintf(url, sizeof url, "postgres://postgres@127.0.0.1:%d/converger?sslmode=disable",
           ntohs(a.sin_port));
  store_t *s = (store_t *)&s;
  uint64_t t0 = mono_ms();
  assert_int_equal(store_open(url, NULL, &s), -CV_ESTORE);
  uint64_t took = mono_ms() - t0;
  assert_null(s);
  assert_true(took >= 900 && took < 2000);

  snprintf(url, sizeof url, "host=127.0.0.1 port=%d connect_timeout=2 sslmode=disable",
           ntohs(a.sin_port));
  t0 = mono_ms();
  assert_int_equal(store_open(url, NULL, &s), -CV_ESTORE);
  took = mono_ms() - t0;
  assert_true(took >= 1900 && took < 3000);
  close(fd);
}

/* Terminate the store's server process and wait until it is gone. */
static void kill_backends(raw_t *raw) {
  raw_exec(raw, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()");
  for (int i = 0; i < 500; i++) {
    if (raw_int(raw, "SELECT count(*) FROM pg_stat_activity"
                     " WHERE datname = current_database() AND pid <> pg_backend_pid()") == 0) {
      usleep(50 * 1000); /* gone from the view a moment before its socket closes */
      return;
    }
    usleep(10 * 1000);
  }
  fail_msg("the backends did not go away");
}

/* The server drops the connection (a restart, an administrator): the next
 * call connects again and succeeds; inside a read transaction it fails
 * instead, and the call after store_read_end connects again. */
static void test_pg_reconnect(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  assert_int_equal(append_ok(f->s, "c1", "m1", "{}"), 1);
  raw_t raw = raw_open(f);

  kill_backends(&raw);
  assert_int_equal(store_ping(f->s), 0);
  kill_backends(&raw);
  assert_int_equal(append_ok(f->s, "c1", "m2", "{}"), 2);

  assert_int_equal(store_read_begin(f->s), 0);
  assert_int_equal(head_of(f->s, "c1"), 2);
  kill_backends(&raw);
  store_conv_t c;
  assert_int_equal(store_conv_get(f->s, "c1", &c), -CV_ESTORE);
  store_read_end(f->s);
  assert_int_equal(head_of(f->s, "c1"), 2);
  expect_page(f->s, "c1", 0, -1, 10, 1, 2);
  raw_close(&raw);
}

/* PostgreSQL text is valid UTF-8 (SQLite stores any bytes): anything else
 * is the caller's -CV_EINVAL, not a store failure, and nothing changes. */
static void test_pg_invalid_utf8(void **state) {
  store_t *s = ((fx_t *)*state)->s;
  mk_conv(s, "ch", "c1");
  store_msg_t m;
  int created = 1;
  assert_int_equal(store_append(s, "c1", "m1", "a", "\"\xff\xfe\"", 1, &m, &created), -CV_EINVAL);
  assert_int_equal(created, 0);
  assert_int_equal(store_append(s, "c1", "m1", "\xc3(", "{}", 1, &m, &created), -CV_EINVAL);
  assert_int_equal(store_channel_create(s, "ch2", "bad \xe2\x82", 0, NULL), -CV_EINVAL);
  assert_int_equal(store_revoke(s, "\x80", 1), -CV_EINVAL);
  assert_int_equal(head_of(s, "c1"), 0);
  assert_int_equal(append_ok(s, "c1", "m1", "\"ok ☃\""), 1);
}

static int usage(void) {
  fprintf(stderr, "usage: test_store [--pg]\n"
                  "  --pg  run the suite against PostgreSQL at PG_TMP_URL; start one with\n"
                  "        scripts/pg-tmp run --fast -- test_store --pg\n");
  return 2;
}

/* PG_TMP_URL: where test databases are created; its host, port and user. */
static int pg_connect_admin(void) {
  const char *url = getenv("PG_TMP_URL");
  if (url == NULL || url[0] == '\0') {
    fprintf(stderr, "test_store --pg: PG_TMP_URL is not set; run it as\n"
                    "  scripts/pg-tmp run --fast -- test_store --pg\n");
    return -1;
  }
  pg_admin = PQconnectdb(url);
  if (PQstatus(pg_admin) != CONNECTION_OK) {
    fprintf(stderr, "test_store --pg: %s: %s", url, PQerrorMessage(pg_admin));
    return -1;
  }
  snprintf(pg_host, sizeof pg_host, "%s", PQhost(pg_admin));
  snprintf(pg_port, sizeof pg_port, "%s", PQport(pg_admin));
  snprintf(pg_user, sizeof pg_user, "%s", PQuser(pg_admin));
  PQclear(PQexec(pg_admin, "SET client_min_messages = warning"));
  return 0;
}

/* The next `want` notifications heard on `raw` (LISTENing), joined with
 * '|' into `out`; waits up to 3 s for them (the listener hears them after
 * the commit, over its own connection). */
static void heard(raw_t *raw, int want, char *out, size_t cap) {
  out[0] = '\0';
  int got = 0;
  for (int tries = 0; got < want && tries < 300; tries++) {
    PQconsumeInput(raw->pg);
    PGnotify *n;
    while ((n = PQnotifies(raw->pg)) != NULL) {
      size_t len = strlen(out);
      snprintf(out + len, cap - len, "%s%s", len ? "|" : "", n->extra);
      PQfreemem(n);
      got++;
    }
    if (got < want) usleep(10000);
  }
}

/* A group commit announces its new messages in one NOTIFY, records that
 * decode as single appends' payloads with their seqs and epoch; a group
 * of one sends the plain payload; groups larger than a payload take as
 * few as fit, in order. */
/* A conversation of `ch` named "<prefix><k>" whose logical shard is not in
 * `avoid` (n of them), created, into out (size 32). Returns its shard. */
static int conv_off_shards(store_t *s, const char *ch, const char *prefix, const int *avoid,
                           int n, char *out) {
  for (int k = 0;; k++) {
    snprintf(out, 32, "%s%d", prefix, k);
    int sh = shard_of(out), taken = 0;
    for (int i = 0; i < n; i++) taken |= avoid[i] == sh;
    if (taken) continue;
    assert_int_equal(store_conv_create(s, out, ch, NULL), 0);
    return sh;
  }
}

/* A sharded instance's group commit (store_options_t.guard, migrations 9
 * and 10): in one group, the items of a frozen shard (its advisory lock
 * held exclusive, as `converger shards move` holds it) get -CV_ESHARD, the
 * items of a shard marked moved get -CV_EMOVED, and the others are
 * appended, gapless, as without the guard; nothing of the refused ones is
 * stored, and the frozen shard takes writes again once its lock is free. */
static void test_pg_batch_guarded(void **state) {
  fx_t *f = *state;
  store_t *s = NULL;
  store_options_t opt = test_opt;
  opt.guard = 1;
  assert_int_equal(store_open(f->url, &opt, &s), 0);
  mk_conv(s, "ch", "seed");
  char frozen[32], moved[32], ok1[32], ok2[32], sql[160];
  int sh[4];
  sh[0] = conv_off_shards(s, "ch", "f", sh, 0, frozen);
  sh[1] = conv_off_shards(s, "ch", "m", sh, 1, moved);
  sh[2] = conv_off_shards(s, "ch", "a", sh, 2, ok1);
  sh[3] = conv_off_shards(s, "ch", "b", sh, 2, ok2); /* may share ok1's shard */
  assert_int_equal(append_ok(s, ok1, "old", "{}"), 1);

  raw_t holder = raw_open(f), raw = raw_open(f);
  snprintf(sql, sizeof sql, "SELECT pg_advisory_lock(%d, %d)", STORE_SHARD_LOCK_KEY, sh[0]);
  raw_exec(&holder, sql);
  snprintf(sql, sizeof sql, "INSERT INTO shard_moved (shard, instance) VALUES (%d, 1)", sh[1]);
  raw_exec(&raw, sql);

  batch_t b = {0};
  batch_add(&b, ok1, "a", "{}");
  batch_add(&b, frozen, "a", "{}");
  batch_add(&b, moved, "a", "{}");
  batch_add(&b, ok2, "a", "{}");
  batch_add(&b, frozen, "b", "{}");
  batch_add(&b, ok1, "b", "{}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  const int status[] = {0, -CV_ESHARD, -CV_EMOVED, 0, -CV_ESHARD, 0};
  const int64_t seq[] = {2, 0, 0, 1, 0, 3};
  for (size_t i = 0; i < b.n; i++) {
    assert_int_equal(b.a[i].status, status[i]);
    assert_int_equal(b.a[i].msg.seq, seq[i]);
  }
  batch_clear(&b);
  assert_history(s, ok1, "old a b");
  assert_history(s, ok2, "a");
  snprintf(sql, sizeof sql, "SELECT count(*) FROM messages WHERE conv IN ('%s', '%s')", frozen,
           moved);
  assert_int_equal(raw_int(&raw, sql), 0); /* (a read of `moved` is refused too) */

  /* every item refused: the same answers, nothing appended */
  batch_add(&b, moved, "a", "{}");
  batch_add(&b, frozen, "a", "{}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  assert_int_equal(b.a[0].status, -CV_EMOVED);
  assert_int_equal(b.a[1].status, -CV_ESHARD);
  batch_clear(&b);

  raw_close(&holder); /* the mover's session ends: its lock is free */
  batch_add(&b, frozen, "a", "{}");
  batch_add(&b, ok2, "b", "{}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  assert_int_equal(b.a[0].status, 0);
  assert_int_equal(b.a[0].msg.seq, 1);
  assert_int_equal(b.a[1].msg.seq, 2);
  batch_clear(&b);
  raw_exec(&raw, "DELETE FROM shard_moved");
  raw_close(&raw);
  store_close(s);
}

static void test_pg_batch_notify(void **state) {
  fx_t *f = *state;
  mk_conv(f->s, "ch", "c1");
  assert_int_equal(store_conv_create(f->s, "c2", "ch", NULL), 0);
  store_conv_t c1;
  assert_int_equal(store_conv_get(f->s, "c1", &c1), 0);
  assert_int_equal(append_ok(f->s, "c1", "old", "{}"), 1);
  store_t *s = NULL;
  store_options_t opt = test_opt;
  opt.notify = 1;
  assert_int_equal(store_open(f->url, &opt, &s), 0);
  raw_t raw = raw_open(f);
  raw_exec(&raw, "LISTEN " STORE_NOTIFY_CHANNEL);

  batch_t b = {0};
  batch_add(&b, "c1", "a", "{\"n\":1}");
  batch_add(&b, "c1", "old", "{}"); /* a retry: not announced */
  batch_add(&b, "c2", "a", "{\"n\":2}");
  batch_add(&b, "c1", "b", "{\"n\":3}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  batch_clear(&b);
  static char got[64 * 1024];
  heard(&raw, 1, got, sizeof got);
  assert_true(notify_is_batch(got));
  const char *p = got + 2;
  char rec[STORE_NOTIFY_PAYLOAD_MAX + 1];
  const char *want_conv[] = {"c1", "c2", "c1"};
  const int64_t want_seq[] = {2, 1, 3};
  for (int i = 0; i < 3; i++) {
    notify_t n;
    assert_int_equal(notify_batch_next(&p, rec, sizeof rec), 1);
    assert_int_equal(notify_decode(rec, &n), NOTIFY_MESSAGE);
    assert_string_equal(n.conv, want_conv[i]);
    assert_int_equal(n.seq, want_seq[i]);
    assert_string_equal(n.sender, "alice");
    if (i != 1) assert_string_equal(n.epoch, c1.epoch);
  }
  assert_int_equal(notify_batch_next(&p, rec, sizeof rec), 0);

  batch_add(&b, "c2", "b", "{}");
  batch_add(&b, "nope", "b", "{}");
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  batch_clear(&b);
  heard(&raw, 1, got, sizeof got);
  notify_t n;
  assert_int_equal(notify_decode(got, &n), NOTIFY_MESSAGE); /* one new message: plain */
  assert_int_equal(n.seq, 2);

  /* 12 messages of 1 500 bytes: 18 000 bytes in payloads of at most 7 999 */
  static char big[1500 + 16];
  memset(big, 'x', sizeof big);
  memcpy(big, "{\"t\":\"", 6);
  strcpy(big + 1500 - 2, "\"}");
  char ids[12][8];
  for (int i = 0; i < 12; i++) {
    snprintf(ids[i], sizeof ids[i], "big%d", i);
    batch_add(&b, "c2", ids[i], big);
  }
  assert_int_equal(store_append_batch(s, b.p, b.n), 0);
  batch_clear(&b);
  heard(&raw, 3, got, sizeof got);
  int64_t seq = 3;
  int payloads = 0;
  for (char *one = strtok(got, "|"); one; one = strtok(NULL, "|"), payloads++) {
    assert_true(strlen(one) <= STORE_NOTIFY_PAYLOAD_MAX);
    assert_true(notify_is_batch(one));
    p = one + 2;
    while (notify_batch_next(&p, rec, sizeof rec) == 1) {
      assert_int_equal(notify_decode(rec, &n), NOTIFY_MESSAGE);
      assert_int_equal(n.seq, seq++);
      assert_int_equal(strlen(n.body), 1500);
    }
  }
  assert_int_equal(payloads, 3);
  assert_int_equal(seq, 15);
  raw_close(&raw);
  store_close(s);
}

/* Presence across nodes: rows per conversation and client, moved by a
 * join through another node, deleted only by the node that holds them,
 * the user's first and last client, pages, the sweep of gone nodes, a
 * node's own rows; every change announced in its transaction. SQLite
 * keeps none of it (proto/presence.h). */
static void test_presence_rows(void **state) {
  fx_t *f = *state;
  int joined, first, left, last;
  store_member_t *m = NULL;
  size_t n = 0;
  int64_t count = 0, removed = 0;
  if (!use_pg) {
    assert_int_equal(store_presence_join(f->s, "c", "k1", "ann", "a", 1, &joined, &first),
                     -CV_EINVAL);
    assert_int_equal(store_presence_list(f->s, "c", "", 10, &m, &n, &count), -CV_EINVAL);
    return;
  }
  store_t *s = NULL;
  store_options_t opt = test_opt;
  opt.notify = 1;
  assert_int_equal(store_open(f->url, &opt, &s), 0);
  raw_t raw = raw_open(f);
  raw_exec(&raw, "LISTEN " STORE_NOTIFY_CHANNEL);
  char got[1024];

  assert_int_equal(store_presence_join(s, "c", "k1", "ann", "a", 100, &joined, &first), 0);
  assert_true(joined && first);
  assert_int_equal(store_presence_join(s, "c", "k2", "ann", "a", 200, &joined, &first), 0);
  assert_true(joined && !first);
  assert_int_equal(store_presence_join(s, "c", "k3", "bob", "b", 300, &joined, &first), 0);
  assert_true(joined && first);
  /* k1 reconnects through node b (a drain move): no join */
  assert_int_equal(store_presence_join(s, "c", "k1", "ann", "b", 400, &joined, &first), 0);
  assert_false(joined);
  heard(&raw, 3, got, sizeof got);
  assert_string_equal(got, "p j c k1 1 ann|p j c k2 0 ann|p j c k3 1 bob");

  /* node a's grace of k1 ends: b holds it now, so nothing goes */
  assert_int_equal(store_presence_leave(s, "c", "k1", "ann", "a", &left, &last), 0);
  assert_false(left);
  assert_int_equal(store_presence_list(s, "c", "", 10, &m, &n, &count), 0);
  assert_int_equal(count, 2);
  assert_int_equal(n, 2);
  assert_string_equal(m[0].user, "ann");
  assert_int_equal(m[0].clients, 2);
  assert_int_equal(m[0].since_ms, 100);
  assert_int_equal(m[0].rank, 1);
  assert_string_equal(m[1].user, "bob");
  assert_int_equal(m[1].rank, 2);
  free(m);
  /* pages: after a cursor, a limit, the count alone */
  assert_int_equal(store_presence_list(s, "c", "ann", 10, &m, &n, &count), 0);
  assert_int_equal(n, 1);
  assert_string_equal(m[0].user, "bob");
  assert_int_equal(m[0].rank, 2);
  free(m);
  assert_int_equal(store_presence_list(s, "c", "", 1, &m, &n, &count), 0);
  assert_int_equal(n, 1);
  assert_int_equal(count, 2);
  free(m);
  assert_int_equal(store_presence_list(s, "c", "", 0, &m, &n, &count), 0);
  assert_int_equal(n, 0);
  assert_null(m);
  assert_int_equal(count, 2);

  assert_int_equal(store_presence_leave(s, "c", "k2", "ann", "a", &left, &last), 0);
  assert_true(left && !last);
  assert_int_equal(store_presence_leave(s, "c", "k1", "ann", "b", &left, &last), 0);
  assert_true(left && last);
  heard(&raw, 2, got, sizeof got);
  assert_string_equal(got, "p l c k2 0 ann|p l c k1 1 ann");

  /* node b's rows: k3; node c (no heartbeat) holds two clients of carl */
  char **convs, **clients, **users;
  assert_int_equal(store_presence_of_node(s, "b", &convs, &clients, &users, &n), 0);
  assert_int_equal(n, 1);
  assert_string_equal(clients[0], "k3");
  assert_string_equal(users[0], "bob");
  store_strings_free(convs, n);
  store_strings_free(clients, n);
  store_strings_free(users, n);
  assert_int_equal(store_presence_join(s, "c", "k4", "carl", "gone", 500, &joined, &first), 0);
  assert_int_equal(store_presence_join(s, "c", "k5", "carl", "gone", 500, &joined, &first), 0);
  assert_int_equal(store_presence_join(s, "d", "k6", "bob", "gone", 500, &joined, &first), 0);
  heard(&raw, 3, got, sizeof got);
  assert_int_equal(store_node_beat(s, "b", "ws://b:1/v1/ws", "", "ready", 1, 0, 0, 10000), 0);
  assert_int_equal(store_node_beat(s, "gone", "ws://g:1/v1/ws", "", "ready", 1, 0, 0, 5000), 0);
  /* gone's row is 5000 ms old: within an age of 6000 nothing goes */
  assert_int_equal(store_presence_sweep(s, 10000, 6000, &removed), 0);
  assert_int_equal(removed, 0);
  assert_int_equal(store_presence_sweep(s, 10000, 4000, &removed), 0);
  assert_int_equal(removed, 3);
  heard(&raw, 3, got, sizeof got);
  /* carl's last client carries the edge, once; bob stays in c through b */
  assert_non_null(strstr(got, "p l c k4 0 carl"));
  assert_non_null(strstr(got, "p l c k5 1 carl"));
  assert_non_null(strstr(got, "p l d k6 1 bob"));
  assert_int_equal(store_presence_list(s, "c", "", 10, &m, &n, &count), 0);
  assert_int_equal(count, 1);
  assert_string_equal(m[0].user, "bob");
  free(m);
  /* one client through two nodes (two tabs sharing a stored clientId):
   * present while either node holds it; a gone node's row goes quietly
   * while another holds the client */
  assert_int_equal(store_presence_join(s, "t", "tab2", "zoe", "a", 7, &joined, &first), 0);
  assert_true(joined && first);
  assert_int_equal(store_presence_join(s, "t", "tab2", "zoe", "b", 8, &joined, &first), 0);
  assert_false(joined);
  assert_int_equal(store_presence_join(s, "t", "tab2", "zoe", "gone", 9, &joined, &first), 0);
  assert_false(joined);
  assert_int_equal(store_presence_leave(s, "t", "tab2", "zoe", "b", &left, &last), 0);
  assert_false(left);
  assert_int_equal(store_presence_sweep(s, 10000, 4000, &removed), 0);
  assert_int_equal(removed, 1);
  assert_int_equal(store_presence_list(s, "t", "", 10, &m, &n, &count), 0);
  assert_int_equal(count, 1);
  assert_int_equal(m[0].clients, 1);
  assert_int_equal(m[0].since_ms, 7);
  free(m);
  assert_int_equal(store_presence_leave(s, "t", "tab2", "zoe", "a", &left, &last), 0);
  assert_true(left && last);
  heard(&raw, 2, got, sizeof got);
  assert_string_equal(got, "p j t tab2 1 zoe|p l t tab2 1 zoe");
  /* a client is its user's: two users naming one clientId are two clients */
  assert_int_equal(store_presence_join(s, "e", "tab", "ann", "a", 1, &joined, &first), 0);
  assert_true(joined && first);
  assert_int_equal(store_presence_join(s, "e", "tab", "bob", "b", 2, &joined, &first), 0);
  assert_true(joined && first);
  assert_int_equal(store_presence_leave(s, "e", "tab", "ann", "b", &left, &last), 0);
  assert_false(left); /* ann's row is node a's */
  assert_int_equal(store_presence_leave(s, "e", "tab", "ann", "a", &left, &last), 0);
  assert_true(left && last);
  assert_int_equal(store_presence_list(s, "e", "", 10, &m, &n, &count), 0);
  assert_int_equal(count, 1);
  assert_string_equal(m[0].user, "bob");
  free(m);
  heard(&raw, 3, got, sizeof got);
  assert_string_equal(got, "p j e tab 1 ann|p j e tab 1 bob|p l e tab 1 ann");
  assert_int_equal(store_presence_join(s, "c", "bad id", "x", "a", 1, &joined, &first), -CV_EINVAL);
  raw_close(&raw);
  store_close(s);
}

int main(int argc, char **argv) {
  log_set_level(LOG_ERROR); /* "migrated" lines per fixture, and the expected failures */
  if (argc > 2 || (argc == 2 && strcmp(argv[1], "--pg") != 0)) return usage();
  use_pg = argc == 2;
  if (use_pg && pg_connect_admin() != 0) {
    PQfinish(pg_admin);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_open_bad_args, setup_dir, teardown),
      cmocka_unit_test(test_url_forms),
      cmocka_unit_test_setup_teardown(test_open_defaults, setup_dir, teardown),
      cmocka_unit_test_setup_teardown(test_migrate_idempotent, setup_dir, teardown),
      cmocka_unit_test_setup_teardown(test_migrate_concurrent, setup_dir, teardown),
      cmocka_unit_test_setup_teardown(test_channels, setup, teardown),
      cmocka_unit_test_setup_teardown(test_conversations, setup, teardown),
      cmocka_unit_test_setup_teardown(test_epochs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_seq, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_idempotent, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_inactive_and_missing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_batch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_batch_failure_isolated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_append_batch_concurrent_gapless, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sql_metacharacters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replay_ranges, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replay_clamp, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replay_byte_budget, setup, teardown),
      cmocka_unit_test_setup_teardown(test_revocations, setup, teardown),
      cmocka_unit_test_setup_teardown(test_membership, setup, teardown),
      cmocka_unit_test_setup_teardown(test_busy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_snapshot, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotent_race, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_writers_gapless, setup, teardown),
      cmocka_unit_test_setup_teardown(test_presence_rows, setup, teardown),
  };
  const struct CMUnitTest pg_tests[] = {
      cmocka_unit_test_setup_teardown(test_pg_row_lock_per_conversation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pg_deactivation_during_append_wait, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pg_default_isolation_does_not_matter, setup, teardown),
      cmocka_unit_test(test_pg_closed_port_fails_fast),
      cmocka_unit_test_setup_teardown(test_pg_shard_health_exported, setup, teardown),
      cmocka_unit_test(test_pg_silent_server_times_out),
      cmocka_unit_test_setup_teardown(test_pg_reconnect, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pg_invalid_utf8, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pg_batch_notify, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pg_batch_guarded, setup, teardown),
  };
  int failed =
      cmocka_run_group_tests_name(use_pg ? "store.postgres" : "store.sqlite", tests, NULL, NULL);
  if (use_pg) failed += cmocka_run_group_tests_name("store.postgres.only", pg_tests, NULL, NULL);
  PQfinish(pg_admin);
  return failed;
}
