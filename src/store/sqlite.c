/*
 * sqlite: the SQLite backend of store.h ("sqlite:PATH"); store.c dispatches
 * here through store_sqlite_ops with arguments already checked (backend.h).
 *
 * Owns: one sqlite3 connection per store_t and the prepared statements
 * cached on it (prepared on first use with SQLITE_PREPARE_PERSISTENT; the
 * transaction statements at open, so a rollback never has to prepare).
 *
 * Thread: the one pool worker that opened it. The connection is opened with
 * SQLITE_OPEN_NOMUTEX, so it has no mutex of its own and two threads must
 * never share it. Several store_t on the same file (one per worker, or per
 * process) are the normal case: SQLite's file locks admit one writer at a
 * time and WAL lets readers run beside it without blocking.
 *
 * Invariants:
 *  - every write that reads before it writes (append, conv create, migrate)
 *    runs in BEGIN IMMEDIATE: the write lock is taken before the first read,
 *    so the head it bumps cannot be stale and seq stays gapless across
 *    connections (a deferred transaction would get SQLITE_BUSY_SNAPSHOT on
 *    upgrade, without the busy handler);
 *  - no function returns with a transaction open: every error after BEGIN
 *    goes through tx_rollback;
 *  - every cached statement is reset and its bindings cleared after use, so
 *    none keeps a read snapshot open (which would pin the WAL) or a pointer
 *    to the caller's strings (bound SQLITE_STATIC);
 *  - every value is bound as a parameter; no SQL text is built at run time.
 *
 * Deadlines (store_set_deadline): lock waits go through busy_cb, which
 * gives up at the busy timeout or the deadline, whichever comes first; while
 * a deadline is set, progress_cb interrupts a statement that runs past it
 * (SQLITE_INTERRUPT, which rolls back a write transaction). COMMIT and
 * ROLLBACK are never interrupted: a rollback must end the transaction, and
 * a commit that has taken place must not be reported as failed.
 */
#include "store/store.h"

#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"
#include "store/backend.h"

#define URL_PREFIX   "sqlite:"
#define PROGRESS_OPS 1000 /* virtual machine steps between two deadline checks */

/* Migrations, oldest first: migrations[i] brings the schema to version i+1.
 * Append only; never edit one that has shipped. Each runs with the
 * schema_version insert in the BEGIN IMMEDIATE transaction of store_migrate. */
static const char *const migrations[] = {
    /* 1: initial schema. messages is clustered on (conv, seq), which is the
     * replay order; (conv, id) is the idempotency key. */
    "CREATE TABLE channels ("
    " id TEXT PRIMARY KEY NOT NULL,"
    " name TEXT NOT NULL,"
    " presence INTEGER NOT NULL DEFAULT 0 CHECK (presence IN (0, 1)),"
    " active INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1)),"
    " created_ms INTEGER NOT NULL);"
    "CREATE TABLE conversations ("
    " id TEXT PRIMARY KEY NOT NULL,"
    " channel TEXT NOT NULL REFERENCES channels (id),"
    " head INTEGER NOT NULL DEFAULT 0,"
    " created_ms INTEGER NOT NULL);"
    "CREATE INDEX conversations_channel ON conversations (channel);"
    "CREATE TABLE messages ("
    " conv TEXT NOT NULL REFERENCES conversations (id),"
    " seq INTEGER NOT NULL,"
    " id TEXT NOT NULL,"
    " sender TEXT NOT NULL,"
    " body TEXT NOT NULL,"
    " ts_ms INTEGER NOT NULL,"
    " PRIMARY KEY (conv, seq),"
    " UNIQUE (conv, id)) WITHOUT ROWID;"
    "CREATE TABLE revocations ("
    " jti TEXT PRIMARY KEY NOT NULL,"
    " exp_s INTEGER NOT NULL);"
    "CREATE INDEX revocations_exp ON revocations (exp_s);",
    /* 2: cluster membership, one row per node, replaced by its heartbeat
     * (store_node_beat); a row not updated lately is a node that is gone. */
    "CREATE TABLE nodes ("
    " id TEXT PRIMARY KEY NOT NULL,"
    " public_url TEXT NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN ('ready', 'draining')),"
    " connections INTEGER NOT NULL,"
    " waiters INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL) WITHOUT ROWID;",
    /* 3: every conversation's history gets an identity, its epoch
     * (store.h), drawn at random: here for the conversations that exist,
     * by ST_CONV_INSERT for new ones, by ST_EPOCH_ROTATE after a restore. */
    "ALTER TABLE conversations ADD COLUMN epoch TEXT NOT NULL DEFAULT '';"
    "UPDATE conversations SET epoch = lower(hex(randomblob(4)));",
    /* 4: a node's capacity (CONVERGER_CAPACITY_CONNECTIONS) in its row,
     * for converger roll's headroom budget; 0 is "not set", which is what
     * rows of nodes from before it say. */
    "ALTER TABLE nodes ADD COLUMN capacity INTEGER NOT NULL DEFAULT 0;",
    /* 5: whether a channel's conversations carry signals (docs/protocol.md
     * 4.10); channels from before it do not. */
    "ALTER TABLE channels ADD COLUMN signals INTEGER NOT NULL DEFAULT 0 CHECK (signals IN (0, 1));",
    /* 6: the http URL of a node's admin listener (CONVERGER_ADMIN_LISTEN),
     * where converger roll reaches its admin routes; "" for none, which is
     * what rows of nodes from before it say. */
    "ALTER TABLE nodes ADD COLUMN admin_url TEXT NOT NULL DEFAULT '';",
};

#define SCHEMA_VERSION ((int)CV_ARRAY_SIZE(migrations))

enum stmt_id {
  /* prepared at open: no schema needed */
  ST_BEGIN,
  ST_BEGIN_READ,
  ST_COMMIT,
  ST_ROLLBACK,
  ST_PING,
  /* prepared on first use, after store_migrate */
  ST_CHANNEL_INSERT,
  ST_CHANNEL_GET,
  ST_CHANNEL_SET_ACTIVE,
  ST_CONV_INSERT,
  ST_CONV_GET,
  ST_CONV_EXISTS,
  ST_HEAD_BUMP,
  ST_MSG_BY_ID,
  ST_MSG_INSERT,
  ST_REPLAY,
  ST_EPOCH_ROTATE,
  ST_REVOKE,
  ST_REVOCATIONS,
  ST_NODE_BEAT,
  ST_NODES_LIVE,
  ST_COUNT_
};
#define ST_EAGER_END_ ST_CHANNEL_INSERT

static const char *const stmt_sql[ST_COUNT_] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_BEGIN_READ] = "BEGIN",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_PING] = "SELECT 1",
    [ST_CHANNEL_INSERT] = "INSERT INTO channels (id, name, presence, active, created_ms, signals)"
                          " VALUES (?1, ?2, ?3, 1, ?4, ?5)",
    [ST_CHANNEL_GET] = "SELECT id, name, presence, active, signals FROM channels WHERE id = ?1",
    [ST_CHANNEL_SET_ACTIVE] = "UPDATE channels SET active = ?2 WHERE id = ?1"
                              " RETURNING id, name, presence, active, signals",
    [ST_CONV_INSERT] = "INSERT INTO conversations (id, channel, head, created_ms, epoch)"
                       " VALUES (?1, ?2, 0, ?3, lower(hex(randomblob(4)))) RETURNING epoch",
    [ST_CONV_GET] = "SELECT v.id, v.channel, v.head, c.active, c.presence, v.epoch, c.signals"
                    " FROM conversations v JOIN channels c ON c.id = v.channel"
                    " WHERE v.id = ?1",
    [ST_CONV_EXISTS] = "SELECT 1 FROM conversations WHERE id = ?1",
    [ST_HEAD_BUMP] = "UPDATE conversations SET head = head + 1 WHERE id = ?1 RETURNING head",
    [ST_MSG_BY_ID] = "SELECT seq, id, sender, body, ts_ms FROM messages"
                     " WHERE conv = ?1 AND id = ?2",
    [ST_MSG_INSERT] = "INSERT INTO messages"
                      " (conv, seq, id, sender, body, ts_ms)"
                      " VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [ST_REPLAY] = "SELECT m.seq, m.id, m.sender, m.body, m.ts_ms, v.epoch"
                  " FROM conversations v JOIN messages m ON m.conv = v.id"
                  " WHERE v.id = ?1 AND m.seq > ?2 AND m.seq <= ?3"
                  " ORDER BY m.seq LIMIT ?4",
    /* A new draw per row; the second one only when the first equals the
     * old epoch, so the epoch always changes (both equal: 2^-64, and the
     * NOT NULL constraint fails the statement rather than keep it). */
    [ST_EPOCH_ROTATE] = "UPDATE conversations SET epoch = (SELECT e FROM"
                        " (SELECT lower(hex(randomblob(4))) AS e UNION ALL"
                        " SELECT lower(hex(randomblob(4)))) WHERE e <> conversations.epoch LIMIT 1)"
                        " WHERE ?1 IS NULL OR id = ?1",
    [ST_REVOKE] = "INSERT INTO revocations (jti, exp_s) VALUES (?1, ?2)"
                  " ON CONFLICT (jti) DO UPDATE"
                  " SET exp_s = max(exp_s, excluded.exp_s)",
    [ST_REVOCATIONS] = "SELECT jti FROM revocations WHERE exp_s >= ?1 ORDER BY jti",
    [ST_NODE_BEAT] = "INSERT INTO nodes (id, public_url, state, connections, waiters, updated_ms,"
                     " capacity, admin_url) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
                     " ON CONFLICT (id) DO UPDATE SET public_url = excluded.public_url,"
                     " state = excluded.state, connections = excluded.connections,"
                     " waiters = excluded.waiters, updated_ms = excluded.updated_ms,"
                     " capacity = excluded.capacity, admin_url = excluded.admin_url",
    [ST_NODES_LIVE] = "SELECT id, public_url, state, connections, waiters, updated_ms, capacity,"
                      " admin_url FROM nodes WHERE updated_ms >= ?1 ORDER BY id",
};

typedef struct {
  store_t base; /* first: ops */
  sqlite3 *db;
  sqlite3_stmt *stmt[ST_COUNT_];
  int busy_ms;         /* store_options_t.busy_timeout_ms */
  uint64_t busy_since; /* monotonic ms: the current lock wait began (busy_cb) */
  int finishing;       /* COMMIT or ROLLBACK runs: progress_cb lets it finish */
} sq_t;

static sq_t *sq(store_t *base) { return container_of(base, sq_t, base); }

/* ---- errors and statements ------------------------------------------ */

/* Map a SQLite result code to -CV_E...; log the database's own message for
 * anything that becomes -CV_ESTORE. Call before the statement is reset. */
static int db_error(sq_t *s, int rc, const char *what) {
  switch (rc & 0xff) {
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    log_debug("store: %s: %s", what, sqlite3_errmsg(s->db));
    return s->base.deadline_hit ? -CV_ETIMEDOUT : -CV_EBUSY;
  case SQLITE_INTERRUPT: /* progress_cb: the deadline passed */
    log_debug("store: %s: interrupted at the deadline", what);
    return -CV_ETIMEDOUT;
  case SQLITE_NOMEM:
    return -CV_ENOMEM;
  case SQLITE_TOOBIG:
    return -CV_ETOOLARGE;
  default:
    log_error("store: %s: %s (%s)", what, sqlite3_errmsg(s->db), sqlite3_errstr(rc));
    return -CV_ESTORE;
  }
}

static int is_unique_violation(int rc) {
  return rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE;
}

static int stmt_get(sq_t *s, enum stmt_id id, sqlite3_stmt **out) {
  if (s->stmt[id] == NULL) {
    int rc =
        sqlite3_prepare_v3(s->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &s->stmt[id], NULL);
    if (rc != SQLITE_OK) {
      sqlite3_finalize(s->stmt[id]);
      s->stmt[id] = NULL;
      return db_error(s, rc, "prepare");
    }
  }
  *out = s->stmt[id];
  return 0;
}

/* Reset after use: releases the read snapshot and the bound pointers. The
 * step's own result code has already been handled. */
static void stmt_done(sqlite3_stmt *st) {
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
}

static int bind_text(sqlite3_stmt *st, int i, const char *v) {
  return sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
}

/* Run a statement that returns no rows (or whose rows are ignored). */
static int exec_sql(sq_t *s, const char *sql, const char *what) {
  int rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? 0 : db_error(s, rc, what);
}

/* One-off query returning a single integer (not cached: migration paths). */
static int query_int(sq_t *s, const char *sql, int64_t *out) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
  int err = 0;
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW)
    *out = sqlite3_column_int64(st, 0);
  else
    err = db_error(s, rc, "query");
  sqlite3_finalize(st);
  return err;
}

static int tx_step(sq_t *s, enum stmt_id id, const char *what) {
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, id, &st);
  if (err) return err;
  s->finishing = id == ST_COMMIT || id == ST_ROLLBACK;
  int rc = sqlite3_step(st);
  s->finishing = 0;
  err = rc == SQLITE_DONE ? 0 : db_error(s, rc, what);
  stmt_done(st);
  return err;
}

static int tx_begin(sq_t *s) { return tx_step(s, ST_BEGIN, "begin"); }

static int op_read_begin(store_t *base) { return tx_step(sq(base), ST_BEGIN_READ, "begin read"); }

static void op_read_end(store_t *base) {
  sq_t *s = sq(base);
  /* Nothing was written: a rollback ends it whatever happened inside. */
  if (!sqlite3_get_autocommit(s->db)) (void)tx_step(s, ST_ROLLBACK, "end read");
}
static int tx_commit(sq_t *s) { return tx_step(s, ST_COMMIT, "commit"); }

/* Roll back whatever is still open and return `err`, the first failure.
 * SQLite rolls back by itself after some errors (I/O, full disk); then
 * autocommit is already on and there is nothing to do. */
static int tx_rollback(sq_t *s, int err) {
  if (!sqlite3_get_autocommit(s->db)) (void)tx_step(s, ST_ROLLBACK, "rollback");
  return err;
}

/* ---- row copies ------------------------------------------------------ */

static void col_copy(sqlite3_stmt *st, int i, char *dst, size_t cap) {
  const unsigned char *v = sqlite3_column_text(st, i);
  size_t n = v != NULL ? (size_t)sqlite3_column_bytes(st, i) : 0;
  if (n >= cap) n = cap - 1;
  if (n > 0) memcpy(dst, v, n);
  dst[n] = '\0';
}

/* Heap copy of a TEXT column; NULL only when out of memory (the columns
 * read this way are NOT NULL). */
static char *col_dup(sqlite3_stmt *st, int i) {
  const unsigned char *v = sqlite3_column_text(st, i);
  if (v == NULL) return NULL;
  size_t n = (size_t)sqlite3_column_bytes(st, i);
  char *p = malloc(n + 1);
  if (p == NULL) return NULL;
  memcpy(p, v, n);
  p[n] = '\0';
  return p;
}

/* Columns: seq, id, sender, body, ts_ms, and the epoch when there is a
 * sixth. */
static int msg_fill(sqlite3_stmt *st, store_msg_t *m) {
  m->seq = sqlite3_column_int64(st, 0);
  col_copy(st, 1, m->id, sizeof m->id);
  m->sender = col_dup(st, 2);
  m->body = col_dup(st, 3);
  m->ts_ms = sqlite3_column_int64(st, 4);
  if (sqlite3_column_count(st) > 5) col_copy(st, 5, m->epoch, sizeof m->epoch);
  if (m->sender == NULL || m->body == NULL) {
    store_msg_clear(m);
    return -CV_ENOMEM;
  }
  return 0;
}

/* Columns: id, name, presence, active, signals. */
static void channel_fill(sqlite3_stmt *st, store_channel_t *c) {
  col_copy(st, 0, c->id, sizeof c->id);
  col_copy(st, 1, c->name, sizeof c->name);
  c->presence = sqlite3_column_int(st, 2) != 0;
  c->active = sqlite3_column_int(st, 3) != 0;
  c->signals = sqlite3_column_int(st, 4) != 0;
}

/* Columns: id, channel, head, active, presence, epoch, signals. */
static void conv_fill(sqlite3_stmt *st, store_conv_t *v) {
  col_copy(st, 0, v->id, sizeof v->id);
  col_copy(st, 1, v->channel, sizeof v->channel);
  v->head = sqlite3_column_int64(st, 2);
  v->channel_active = sqlite3_column_int(st, 3) != 0;
  v->presence = sqlite3_column_int(st, 4) != 0;
  col_copy(st, 5, v->epoch, sizeof v->epoch);
  v->signals = sqlite3_column_int(st, 6) != 0;
}

/* ---- deadlines ------------------------------------------------------- */

/* The busy handler (in place of sqlite3_busy_timeout): wait for a lock in
 * growing naps, as SQLite's own does, until the busy timeout or the
 * deadline (store.h), whichever comes first. Returns 1 to try again, 0 to
 * give up (the statement fails with SQLITE_BUSY). */
static int busy_cb(void *arg, int count) {
  static const int naps_ms[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};
  sq_t *s = arg;
  uint64_t now = util_mono_ms();
  if (count == 0) s->busy_since = now;
  uint64_t until = s->busy_since + (uint64_t)s->busy_ms;
  int by_deadline = s->base.deadline_ms != 0 && s->base.deadline_ms < until;
  if (by_deadline) until = s->base.deadline_ms;
  if (now >= until) {
    if (by_deadline) s->base.deadline_hit = 1;
    return 0;
  }
  size_t i = (size_t)count < CV_ARRAY_SIZE(naps_ms) ? (size_t)count : CV_ARRAY_SIZE(naps_ms) - 1;
  uint64_t nap = (uint64_t)naps_ms[i];
  sqlite3_sleep((int)(nap < until - now ? nap : until - now));
  return 1;
}

/* The progress handler while a deadline is set: every PROGRESS_OPS steps,
 * interrupt the statement (SQLITE_INTERRUPT) once the deadline has passed,
 * unless it is a COMMIT or a ROLLBACK. */
static int progress_cb(void *arg) {
  sq_t *s = arg;
  if (s->finishing || s->base.deadline_ms == 0 || util_mono_ms() < s->base.deadline_ms) return 0;
  s->base.deadline_hit = 1;
  return 1;
}

static void op_set_deadline(store_t *base, uint64_t deadline_ms) {
  sq_t *s = sq(base);
  if (deadline_ms != 0)
    sqlite3_progress_handler(s->db, PROGRESS_OPS, progress_cb, s);
  else
    sqlite3_progress_handler(s->db, 0, NULL, NULL);
}

/* ---- open, close, schema --------------------------------------------- */

/* Switch to WAL (persistent in the file, so a no-op after the first time).
 * Converting a fresh file upgrades a SHARED lock to EXCLUSIVE, and SQLite
 * does not call the busy handler for that upgrade: when several workers open
 * a new database at once, some get SQLITE_BUSY at once. Retry here, within
 * the same busy timeout. */
static int set_wal(sq_t *s, const char *path, int busy_ms) {
  sqlite3_stmt *st = NULL;
  int rc, err = 0, nap_ms = 1;
  uint64_t deadline = util_mono_ms() + (uint64_t)busy_ms;
  for (;;) {
    if (st == NULL) rc = sqlite3_prepare_v2(s->db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (st != NULL) {
      sqlite3_reset(st);
      rc = sqlite3_step(st);
    }
    if ((rc & 0xff) != SQLITE_BUSY || util_mono_ms() >= deadline) break;
    sqlite3_sleep(nap_ms);
    if (nap_ms < 32) nap_ms *= 2;
  }
  if (rc == SQLITE_ROW) {
    const char *mode = (const char *)sqlite3_column_text(st, 0);
    /* ":memory:" databases answer "memory": not an error, but say so. */
    if (mode == NULL || strcmp(mode, "wal") != 0)
      log_warn("store: %s: journal_mode is %s, not wal", path, mode != NULL ? mode : "?");
  } else {
    err = db_error(s, rc, "journal_mode=WAL");
  }
  sqlite3_finalize(st);
  return err;
}

static void op_close(store_t *base);

static int op_open(const char *url, const store_options_t *opt, store_t **out) {
  static const char *const sync_sql[] = {
      [STORE_SYNC_OFF] = "PRAGMA synchronous=OFF",
      [STORE_SYNC_NORMAL] = "PRAGMA synchronous=NORMAL",
      [STORE_SYNC_FULL] = "PRAGMA synchronous=FULL",
  };
  const char *path = url + sizeof URL_PREFIX - 1;
  int busy_ms = opt->busy_timeout_ms;

  sq_t *s = calloc(1, sizeof *s);
  if (s == NULL) return -CV_ENOMEM;
  s->base.ops = &store_sqlite_ops;
  s->busy_ms = busy_ms;
  int rc = sqlite3_open_v2(path, &s->db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (s->db == NULL) {
    free(s);
    return -CV_ENOMEM;
  }
  int err = 0;
  if (rc != SQLITE_OK) {
    log_error("store: open %s: %s", path, sqlite3_errmsg(s->db));
    err = (rc & 0xff) == SQLITE_NOMEM ? -CV_ENOMEM : -CV_ESTORE;
  }
  if (!err) {
    sqlite3_extended_result_codes(s->db, 1);
    /* The busy handler first: switching to WAL may wait for a lock. */
    sqlite3_busy_handler(s->db, busy_cb, s);
    err = set_wal(s, path, busy_ms);
  }
  if (!err) err = exec_sql(s, sync_sql[opt->sync], "synchronous");
  if (!err) err = exec_sql(s, "PRAGMA foreign_keys=ON", "foreign_keys");
  for (int i = 0; !err && i < ST_EAGER_END_; i++) {
    sqlite3_stmt *st = NULL;
    err = stmt_get(s, (enum stmt_id)i, &st);
  }
  if (err) {
    op_close(&s->base);
    return err;
  }
  *out = &s->base;
  return 0;
}

static void op_close(store_t *base) {
  sq_t *s = sq(base);
  for (int i = 0; i < ST_COUNT_; i++) sqlite3_finalize(s->stmt[i]);
  /* Closing rolls back an open transaction; the last connection on the file
   * checkpoints and removes the WAL. */
  int rc = sqlite3_close_v2(s->db);
  if (rc != SQLITE_OK) log_error("store: close: %s", sqlite3_errstr(rc));
  free(s);
}

static int op_migrate(store_t *base) {
  sq_t *s = sq(base);
  int64_t cur = 0;
  int err = tx_begin(s);
  if (err) return err;
  /* Under the write lock: a second connection migrating at the same time
   * waits here and then finds every step applied. */
  err = exec_sql(s,
                 "CREATE TABLE IF NOT EXISTS schema_version ("
                 " version INTEGER PRIMARY KEY NOT NULL,"
                 " applied_at TEXT NOT NULL"
                 " DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))",
                 "migrate");
  if (!err) err = query_int(s, "SELECT coalesce(max(version), 0) FROM schema_version", &cur);
  if (!err && cur > SCHEMA_VERSION) {
    log_error("store: schema version %lld is newer than this build's %d", (long long)cur,
              SCHEMA_VERSION);
    err = -CV_ESTORE;
  }
  for (int64_t v = cur + 1; !err && v <= SCHEMA_VERSION; v++) {
    sqlite3_stmt *st = NULL;
    err = exec_sql(s, migrations[v - 1], "migrate");
    if (err) break;
    int rc = sqlite3_prepare_v2(s->db, "INSERT INTO schema_version (version) VALUES (?1)", -1, &st,
                                NULL);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 1, v);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) err = db_error(s, rc, "migrate");
    sqlite3_finalize(st);
  }
  if (!err) err = tx_commit(s);
  if (err) return tx_rollback(s, err);
  if (cur < SCHEMA_VERSION)
    log_info("store: schema migrated from version %lld to %d", (long long)cur, SCHEMA_VERSION);
  return 0;
}

static int op_schema_version(store_t *base) {
  sq_t *s = sq(base);
  int64_t n = 0;
  int err = query_int(s,
                      "SELECT count(*) FROM sqlite_schema"
                      " WHERE type = 'table' AND name = 'schema_version'",
                      &n);
  if (err || n == 0) return err; /* never migrated: version 0 */
  err = query_int(s, "SELECT count(*) FROM schema_version", &n);
  return err ? err : (int)n;
}

static int op_ping(store_t *base) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_PING, &st);
  if (err) return err;
  int rc = sqlite3_step(st);
  err = rc == SQLITE_ROW ? 0 : db_error(s, rc, "ping");
  stmt_done(st);
  return err;
}

/* ---- channels --------------------------------------------------------- */

static int op_channel_create(store_t *base, const char *id, const char *name, unsigned flags,
                             store_channel_t *out) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_CHANNEL_INSERT, &st);
  if (err) return err;
  int rc = bind_text(st, 1, id);
  if (rc == SQLITE_OK) rc = bind_text(st, 2, name);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 3, (flags & STORE_CHANNEL_PRESENCE) != 0);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 4, util_now_ms());
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 5, (flags & STORE_CHANNEL_SIGNALS) != 0);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (is_unique_violation(rc))
    err = -CV_EEXISTS;
  else if (rc != SQLITE_DONE)
    err = db_error(s, rc, "channel create");
  stmt_done(st);
  if (!err && out != NULL) {
    store_copy_str(out->id, sizeof out->id, id);
    store_copy_str(out->name, sizeof out->name, name);
    out->presence = (flags & STORE_CHANNEL_PRESENCE) != 0;
    out->signals = (flags & STORE_CHANNEL_SIGNALS) != 0;
    out->active = 1;
  }
  return err;
}

static int op_channel_get(store_t *base, const char *id, store_channel_t *out) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_CHANNEL_GET, &st);
  if (err) return err;
  int rc = bind_text(st, 1, id);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    if (out != NULL) channel_fill(st, out);
  } else {
    err = rc == SQLITE_DONE ? -CV_ENOTFOUND : db_error(s, rc, "channel get");
  }
  stmt_done(st);
  return err;
}

static int op_channel_set_active(store_t *base, const char *id, int active, store_channel_t *out) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_CHANNEL_SET_ACTIVE, &st);
  if (err) return err;
  int rc = bind_text(st, 1, id);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 2, active != 0);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    if (out != NULL) channel_fill(st, out);
    /* Step to the end: in autocommit mode the commit happens there, and its
     * error would otherwise only surface from sqlite3_reset. */
    rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) err = db_error(s, rc, "channel set_active");
  } else {
    err = rc == SQLITE_DONE ? -CV_ENOTFOUND : db_error(s, rc, "channel set_active");
  }
  stmt_done(st);
  return err;
}

/* ---- conversations ---------------------------------------------------- */

static int op_conv_create(store_t *base, const char *id, const char *channel, store_conv_t *out) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int active = 0, presence = 0, signals = 0;
  int err = tx_begin(s);
  if (err) return err;

  /* The channel row first: a clear -CV_ENOTFOUND rather than a foreign key
   * failure, and its flags for `out` from the same transaction. */
  err = stmt_get(s, ST_CHANNEL_GET, &st);
  if (!err) {
    int rc = bind_text(st, 1, channel);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      presence = sqlite3_column_int(st, 2) != 0;
      active = sqlite3_column_int(st, 3) != 0;
      signals = sqlite3_column_int(st, 4) != 0;
    } else {
      err = rc == SQLITE_DONE ? -CV_ENOTFOUND : db_error(s, rc, "conv create");
    }
    stmt_done(st);
  }
  char epoch[STORE_EPOCH_MAX + 1] = "";
  if (!err) err = stmt_get(s, ST_CONV_INSERT, &st);
  if (!err) {
    int rc = bind_text(st, 1, id);
    if (rc == SQLITE_OK) rc = bind_text(st, 2, channel);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 3, util_now_ms());
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      col_copy(st, 0, epoch, sizeof epoch);
      rc = sqlite3_step(st);
    }
    if (is_unique_violation(rc))
      err = -CV_EEXISTS;
    else if (rc != SQLITE_DONE)
      err = db_error(s, rc, "conv create");
    stmt_done(st);
  }
  if (!err) err = tx_commit(s);
  if (err) return tx_rollback(s, err);
  if (out != NULL) {
    store_copy_str(out->id, sizeof out->id, id);
    store_copy_str(out->channel, sizeof out->channel, channel);
    out->head = 0;
    out->channel_active = active;
    out->presence = presence;
    out->signals = signals;
    store_copy_str(out->epoch, sizeof out->epoch, epoch);
  }
  return 0;
}

static int op_conv_get(store_t *base, const char *id, store_conv_t *out) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_CONV_GET, &st);
  if (err) return err;
  int rc = bind_text(st, 1, id);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    if (out != NULL) conv_fill(st, out);
  } else {
    err = rc == SQLITE_DONE ? -CV_ENOTFOUND : db_error(s, rc, "conv get");
  }
  stmt_done(st);
  return err;
}

/* ---- messages --------------------------------------------------------- */

/* Inside the append transaction: the message already stored under (conv, id)
 * into *out (return 1), none (0), or a negative error. */
static int append_find(sq_t *s, const char *conv, const char *id, store_msg_t *out) {
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_MSG_BY_ID, &st);
  if (err) return err;
  int rc = bind_text(st, 1, conv);
  if (rc == SQLITE_OK) rc = bind_text(st, 2, id);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW)
    err = msg_fill(st, out) == 0 ? 1 : -CV_ENOMEM;
  else if (rc != SQLITE_DONE)
    err = db_error(s, rc, "append");
  stmt_done(st);
  return err;
}

/* Inside the append transaction: 0 when the conversation exists and its
 * channel is active (-CV_EINACTIVE when it is not); its epoch into `epoch`
 * (STORE_EPOCH_MAX + 1 bytes) either way. */
static int append_check_conv(sq_t *s, const char *conv, char *epoch) {
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_CONV_GET, &st);
  if (err) return err;
  int rc = bind_text(st, 1, conv);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    col_copy(st, 5, epoch, STORE_EPOCH_MAX + 1);
    err = sqlite3_column_int(st, 3) != 0 ? 0 : -CV_EINACTIVE;
  } else
    err = rc == SQLITE_DONE ? -CV_ENOTFOUND : db_error(s, rc, "append");
  stmt_done(st);
  return err;
}

/* Inside the append transaction: head = head + 1, the new head in *seq. */
static int append_bump_head(sq_t *s, const char *conv, int64_t *seq) {
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_HEAD_BUMP, &st);
  if (err) return err;
  int rc = bind_text(st, 1, conv);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    *seq = sqlite3_column_int64(st, 0);
    rc = sqlite3_step(st);
  } else if (rc == SQLITE_DONE) {
    rc = SQLITE_INTERNAL; /* the row was there a moment ago, under our lock */
  }
  if (rc != SQLITE_DONE) err = db_error(s, rc, "append head");
  stmt_done(st);
  return err;
}

static int append_insert(sq_t *s, const char *conv, int64_t seq, const char *id, const char *sender,
                         const char *body, int64_t ts_ms) {
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_MSG_INSERT, &st);
  if (err) return err;
  int rc = bind_text(st, 1, conv);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, seq);
  if (rc == SQLITE_OK) rc = bind_text(st, 3, id);
  if (rc == SQLITE_OK) rc = bind_text(st, 4, sender);
  if (rc == SQLITE_OK) rc = bind_text(st, 5, body);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 6, ts_ms);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc != SQLITE_DONE) err = db_error(s, rc, "append insert");
  stmt_done(st);
  return err;
}

/* One append inside the open write transaction (SQL as in op_append's
 * comment below). 0: *out is the message, new (*created 1) or the first
 * with this id (a retry: unchanged, even if the channel has been
 * deactivated since). -CV_ENOTFOUND or -CV_EINACTIVE: nothing was written,
 * the transaction can go on. Any other error: the transaction must be
 * rolled back. *out may hold copies on any return: the caller clears it on
 * failure. */
static int append_in_tx(sq_t *s, const char *conv, const char *id, const char *sender,
                        const char *body, int64_t ts_ms, store_msg_t *out, int *created) {
  int found = append_find(s, conv, id, out);
  if (found < 0) return found;
  if (found == 1) {
    int err = append_check_conv(s, conv, out->epoch);
    return err == -CV_EINACTIVE ? 0 : err;
  }
  int64_t seq = 0;
  int err = append_check_conv(s, conv, out->epoch);
  if (!err) err = append_bump_head(s, conv, &seq);
  if (!err) err = append_insert(s, conv, seq, id, sender, body, ts_ms);
  /* Copy before the commit, so running out of memory is still a rollback
   * and never an acknowledged-but-unreported message. */
  if (!err) {
    out->sender = strdup(sender);
    out->body = strdup(body);
    if (out->sender == NULL || out->body == NULL) err = -CV_ENOMEM;
  }
  if (err) return err;
  out->seq = seq;
  store_copy_str(out->id, sizeof out->id, id);
  out->ts_ms = ts_ms;
  *created = 1;
  return 0;
}

/* The failures after which a transaction goes on without the item. */
static int item_only(int err) { return err == -CV_ENOTFOUND || err == -CV_EINACTIVE; }

static void append_undo(store_msg_t *out, int *created) {
  store_msg_clear(out);
  memset(out, 0, sizeof *out);
  *created = 0;
}

/* One transaction (BEGIN IMMEDIATE: the database's write lock first): the
 * message already stored under (conv, id), else the conversation's check,
 * head + 1 and the insert, then COMMIT. */
static int op_append(store_t *base, const char *conv, const char *id, const char *sender,
                     const char *body, int64_t ts_ms, store_msg_t *out, int *created) {
  sq_t *s = sq(base);
  int err = tx_begin(s);
  if (err) return err;
  err = append_in_tx(s, conv, id, sender, body, ts_ms, out, created);
  if (!err) err = tx_commit(s);
  if (err) {
    append_undo(out, created);
    return tx_rollback(s, err);
  }
  return 0;
}

/* Group commit (store.h): the items of op_append in one transaction, so
 * one fsync for all of them. A missing or inactive conversation skips its
 * item; any other failure rolls the group back, and then a lock or
 * deadline failure is every item's, while the rest are tried one
 * transaction each. */
static int op_append_batch(store_t *base, store_append_t *const *items, size_t n) {
  sq_t *s = sq(base);
  int err = tx_begin(s);
  for (size_t i = 0; !err && i < n; i++) {
    store_append_t *a = items[i];
    a->status = append_in_tx(s, a->conv, a->id, a->sender, a->body, a->ts_ms, &a->msg, &a->created);
    if (a->status && !item_only(a->status)) err = a->status;
  }
  if (!err) err = tx_commit(s);
  if (!err) return 0;
  (void)tx_rollback(s, err);
  for (size_t i = 0; i < n; i++) {
    append_undo(&items[i]->msg, &items[i]->created);
    items[i]->status = err;
  }
  if (err == -CV_EBUSY || err == -CV_ETIMEDOUT) return err;
  return store_append_each(base, items, n);
}

static int conv_exists(sq_t *s, const char *conv) {
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_CONV_EXISTS, &st);
  if (err) return err;
  int rc = bind_text(st, 1, conv);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) err = rc == SQLITE_DONE ? -CV_ENOTFOUND : db_error(s, rc, "replay");
  stmt_done(st);
  return err;
}

static int op_replay(store_t *base, const char *conv, int64_t after, int64_t upto, int limit,
                     size_t max_bytes, store_msg_t **msgs, size_t *n) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_REPLAY, &st);
  if (err) return err;
  store_msg_t *v = NULL;
  size_t len = 0, cap = 0, bytes = 0;
  int rc = bind_text(st, 1, conv);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, after);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 3, upto);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 4, limit);
  while (rc == SQLITE_OK || rc == SQLITE_ROW) {
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) break;
    if (len == cap) {
      size_t ncap = cap == 0 ? 16 : cap * 2;
      if (ncap > (size_t)limit) ncap = (size_t)limit;
      store_msg_t *nv = realloc(v, ncap * sizeof *nv);
      if (nv == NULL) {
        err = -CV_ENOMEM;
        break;
      }
      v = nv;
      cap = ncap;
    }
    err = msg_fill(st, &v[len]);
    if (err) break;
    bytes += strlen(v[len].body) + strlen(v[len].sender);
    len++;
    if (max_bytes > 0 && bytes >= max_bytes) {
      rc = SQLITE_DONE; /* the page is full; the caller asks for the next */
      break;
    }
  }
  if (!err && rc != SQLITE_DONE) err = db_error(s, rc, "replay");
  stmt_done(st);
  /* An empty page is either "nothing new" or "no such conversation". */
  if (!err && len == 0) err = conv_exists(s, conv);
  if (err) {
    store_msgs_free(v, len);
    return err;
  }
  *msgs = v;
  *n = len;
  return 0;
}

/* ---- epochs ----------------------------------------------------------- */

static int op_epoch_rotate(store_t *base, const char *conv, int64_t *count) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_EPOCH_ROTATE, &st);
  if (err) return err;
  int rc = conv != NULL ? bind_text(st, 1, conv) : sqlite3_bind_null(st, 1);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_DONE) {
    *count = sqlite3_changes64(s->db);
    if (conv != NULL && *count == 0) err = -CV_ENOTFOUND;
  } else {
    err = db_error(s, rc, "epoch rotate");
  }
  stmt_done(st);
  return err;
}

/* ---- revocations ------------------------------------------------------ */

static int op_revoke(store_t *base, const char *jti, int64_t exp_s) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_REVOKE, &st);
  if (err) return err;
  int rc = bind_text(st, 1, jti);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, exp_s);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc != SQLITE_DONE) err = db_error(s, rc, "revoke");
  stmt_done(st);
  return err;
}

static int op_revocations(store_t *base, int64_t now_s, char ***jtis, size_t *n) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_REVOCATIONS, &st);
  if (err) return err;
  char **v = NULL;
  size_t len = 0, cap = 0;
  int rc = sqlite3_bind_int64(st, 1, now_s);
  while (rc == SQLITE_OK || rc == SQLITE_ROW) {
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) break;
    if (len == cap) {
      size_t ncap = cap == 0 ? 16 : cap * 2;
      char **nv = realloc(v, ncap * sizeof *nv);
      if (nv == NULL) {
        err = -CV_ENOMEM;
        break;
      }
      v = nv;
      cap = ncap;
    }
    v[len] = col_dup(st, 0);
    if (v[len] == NULL) {
      err = -CV_ENOMEM;
      break;
    }
    len++;
  }
  if (!err && rc != SQLITE_DONE) err = db_error(s, rc, "revocations");
  stmt_done(st);
  if (err) {
    store_strings_free(v, len);
    return err;
  }
  *jtis = v;
  *n = len;
  return 0;
}

/* ---- membership ------------------------------------------------------- */

static int op_node_beat(store_t *base, const char *id, const char *public_url,
                        const char *admin_url, const char *state, int64_t connections,
                        int64_t waiters, int64_t capacity, int64_t now_ms) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_NODE_BEAT, &st);
  if (err) return err;
  int rc = bind_text(st, 1, id);
  if (rc == SQLITE_OK) rc = bind_text(st, 2, public_url);
  if (rc == SQLITE_OK) rc = bind_text(st, 3, state);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 4, connections);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 5, waiters);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 6, now_ms);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 7, capacity);
  if (rc == SQLITE_OK) rc = bind_text(st, 8, admin_url);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc != SQLITE_DONE) err = db_error(s, rc, "node beat");
  stmt_done(st);
  return err;
}

static int op_nodes_live(store_t *base, int64_t since_ms, store_node_t **out, size_t *n) {
  sq_t *s = sq(base);
  sqlite3_stmt *st = NULL;
  int err = stmt_get(s, ST_NODES_LIVE, &st);
  if (err) return err;
  store_node_t *v = NULL;
  size_t len = 0, cap = 0;
  int rc = sqlite3_bind_int64(st, 1, since_ms);
  while (rc == SQLITE_OK || rc == SQLITE_ROW) {
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) break;
    if (len == cap) {
      size_t ncap = cap == 0 ? 8 : cap * 2;
      store_node_t *nv = realloc(v, ncap * sizeof *nv);
      if (nv == NULL) {
        err = -CV_ENOMEM;
        break;
      }
      v = nv;
      cap = ncap;
    }
    store_node_t *r = &v[len++];
    col_copy(st, 0, r->id, sizeof r->id);
    col_copy(st, 1, r->public_url, sizeof r->public_url);
    col_copy(st, 2, r->state, sizeof r->state);
    r->connections = sqlite3_column_int64(st, 3);
    r->waiters = sqlite3_column_int64(st, 4);
    r->updated_ms = sqlite3_column_int64(st, 5);
    r->capacity = sqlite3_column_int64(st, 6);
    col_copy(st, 7, r->admin_url, sizeof r->admin_url);
  }
  if (!err && rc != SQLITE_DONE) err = db_error(s, rc, "nodes live");
  stmt_done(st);
  if (err) {
    store_nodes_free(v);
    return err;
  }
  *out = v;
  *n = len;
  return 0;
}

const store_ops_t store_sqlite_ops = {
    .name = "sqlite",
    .open = op_open,
    .close = op_close,
    .migrate = op_migrate,
    .schema_version = op_schema_version,
    .read_begin = op_read_begin,
    .read_end = op_read_end,
    .ping = op_ping,
    .set_deadline = op_set_deadline,
    .channel_create = op_channel_create,
    .channel_get = op_channel_get,
    .channel_set_active = op_channel_set_active,
    .conv_create = op_conv_create,
    .conv_get = op_conv_get,
    .append = op_append,
    .append_batch = op_append_batch,
    .replay = op_replay,
    .epoch_rotate = op_epoch_rotate,
    .revoke = op_revoke,
    .revocations = op_revocations,
    .node_beat = op_node_beat,
    .nodes_live = op_nodes_live,
};
