/*
 * shards_move.c: `converger shards move` and `add-instance` (see
 * shards_move.h), on libpq connections of its own: the control database,
 * the shard's instance (the source) and the instance it goes to (the
 * target).
 *
 * How a logical shard k moves from instance S to instance T:
 *   1. Copy, not frozen. In one snapshot of S (REPEATABLE READ), its
 *      conversations of shard k (shard_of over S's conversation ids, in
 *      C), their channels' rows, messages and presence rows go to T in one
 *      transaction, COPY to COPY, after T's leftovers of those
 *      conversations (an earlier move away from T kept its copies) are
 *      deleted. The shard's writes go on meanwhile: this is the bulk.
 *   2. Freeze. pg_advisory_lock(STORE_SHARD_LOCK_KEY, k) on S, a session
 *      lock. Every write of shard k on S (an append, a group commit's
 *      items of k, a new conversation, presence, an epoch) passes
 *      converger_shard_guard (postgres.c, migration 9) in its transaction,
 *      which takes that lock shared without waiting: while the mover holds
 *      it or waits for it (a waiting exclusive request makes PostgreSQL
 *      refuse new shared ones), those writes fail at once with -CV_ESHARD:
 *      REST 503 with Retry-After, a socket `unavailable` with the retry
 *      hint. The lock is granted once the writes in flight have committed
 *      (bounded by --lock-wait). Other shards are not touched.
 *   3. Copy the delta, frozen: the same as 1, for the messages after T's
 *      heads, the conversations' heads and epochs, the presence rows, and
 *      conversations created since; T's shard_moved row of k (from an
 *      earlier move away from T) goes in the same transaction.
 *   4. Mark S: shard_moved (k, T) committed on S. From then on a write of
 *      k on S answers "moved" (-CV_EMOVED) to the node's router, which
 *      reads the map again and makes the call once more on its new
 *      instance (store/sharded.c).
 *   5. Switch the map in the control database: shard_map's row of k and
 *      shard_map_version + 1, in one transaction that first checks that
 *      the map still names S.
 *   6. Thaw: the lock is released. The freeze is 2..6, printed in ms.
 *   7. Wait (bounded, with a progress line a second) until every live node
 *      (membership row younger than MEMBERSHIP_MAX_AGE_MS) records the new
 *      version: each node reads the control database's version at every
 *      heartbeat (store_shardmap_sync) and its routers switch before their
 *      next call.
 *   8. Unless --keep-source, delete S's copies of the shard's rows.
 * Safety: no write of k commits on S after the copy of 3 (the guard), and
 * none on T before it (the map names T only after 5, and 4 makes every
 * node with the old map go and read the new one). The order 4 before 5
 * means that a mover that dies between them leaves the shard unwritable
 * (S says moved, the map still names S: writes get 503) until the move is
 * run again, rather than leaving a window where a node with the old map
 * writes on S what the map says is on T. A mover that dies before 4
 * leaves nothing changed (its session, and so the freeze, ends with it;
 * T's partial copy is deleted by the next attempt). Reads are not guarded:
 * a node that has not yet read the new map (at most one heartbeat after
 * 5, or longer for a node that cannot reach the control database) reads
 * S's copy, which is the shard as it was at the freeze; 7 makes sure that
 * no live node does before 8 deletes it. An epoch rotation of every
 * conversation (store_epoch_rotate with no conversation) is not guarded:
 * do not run one during a move.
 */
#include "cli/shards_move.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/membership.h"
#include "common/util.h"
#include "core/dburl.h"
#include "core/errors.h"
#include "core/shard.h"
#include "store/pgconn.h"
#include "store/store.h"

#define CONNECT_TIMEOUT_MS 5000
#define WAIT_DEFAULT_S     30
#define LOCK_WAIT_MS       5000

typedef struct {
  PGconn *c;
  char shown[512]; /* the URL, password hidden */
  const char *name;
} db_t;

typedef struct {
  long convs, msgs, presence, channels;
} counts_t;

/* printf into a heap string; NULL when out of memory. */
static char *sqlf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

static void db_close(db_t *d) {
  PQfinish(d->c);
  d->c = NULL;
}

/* Connect `d` to `url` ("name" in messages), with lock and statement
 * timeouts. 0 or 1 (printed). */
static int db_open(db_t *d, const char *url, const char *name, int lock_wait_ms) {
  char why[512];
  d->name = name;
  dburl_redact(url, d->shown, sizeof d->shown);
  if (!(d->c = pgconn_connect(url, "converger-shards", CONNECT_TIMEOUT_MS, why, sizeof why))) {
    fprintf(stderr, "converger shards: %s (%s): %s\n", name, d->shown, why);
    return 1;
  }
  char *sql = sqlf("SET lock_timeout = %d; SET statement_timeout = 600000;"
                   " SET default_transaction_isolation = 'read committed'",
                   lock_wait_ms);
  PGresult *r = sql ? PQexec(d->c, sql) : NULL;
  free(sql);
  int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  PQclear(r);
  if (!ok) {
    fprintf(stderr, "converger shards: %s (%s): %s", name, d->shown, PQerrorMessage(d->c));
    db_close(d);
    return 1;
  }
  return 0;
}

/* Run `sql` with `n` text parameters on `d`: 0 with the result in *out
 * (may be NULL: cleared), or 1 with the server's message printed. */
static int q(db_t *d, const char *sql, int n, const char *const *p, PGresult **out) {
  PGresult *r = PQexecParams(d->c, sql, n, NULL, p, NULL, NULL, 0);
  ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    char line[512];
    fprintf(
        stderr, "converger shards: %s (%s): %s\n", d->name, d->shown,
        pgconn_one_line(PQresultErrorMessage(r)[0] ? PQresultErrorMessage(r) : PQerrorMessage(d->c),
                        line, sizeof line));
    PQclear(r);
    return 1;
  }
  if (out)
    *out = r;
  else
    PQclear(r);
  return 0;
}

/* The rows of `out_sql` (a COPY ... TO STDOUT on src) into `in_sql` (a
 * COPY ... FROM STDIN on dst), streamed; *rows the rows copied. 0 or 1. */
static int copy_rows(db_t *src, db_t *dst, const char *out_sql, const char *in_sql, long *rows) {
  PGresult *r = PQexec(src->c, out_sql);
  if (PQresultStatus(r) != PGRES_COPY_OUT) {
    fprintf(stderr, "converger shards: %s: %s", src->name, PQerrorMessage(src->c));
    PQclear(r);
    return 1;
  }
  PQclear(r);
  r = PQexec(dst->c, in_sql);
  int bad = PQresultStatus(r) != PGRES_COPY_IN;
  PQclear(r);
  char *buf = NULL;
  int len;
  while ((len = PQgetCopyData(src->c, &buf, 0)) > 0) {
    if (!bad && PQputCopyData(dst->c, buf, len) != 1) bad = 1;
    PQfreemem(buf);
  }
  if (len == -2) bad = 1;
  while ((r = PQgetResult(src->c))) {
    if (PQresultStatus(r) != PGRES_COMMAND_OK) bad = 1;
    PQclear(r);
  }
  if (PQputCopyEnd(dst->c, bad ? "the source failed" : NULL) != 1) bad = 1;
  while ((r = PQgetResult(dst->c))) {
    if (PQresultStatus(r) == PGRES_COMMAND_OK)
      *rows = strtol(PQcmdTuples(r), NULL, 10);
    else
      bad = 1;
    PQclear(r);
  }
  if (bad)
    fprintf(stderr, "converger shards: copying rows from %s to %s failed: %s%s", src->name,
            dst->name, PQerrorMessage(src->c), PQerrorMessage(dst->c));
  return bad;
}

/* A quoted SQL literal of a text[] of `n` ids (heap; NULL when out of
 * memory): ids are [A-Za-z0-9._:-], so only the array's own syntax. */
static char *ids_literal(PGconn *c, char **ids, size_t n, const char *const *extra) {
  size_t cap = 8;
  for (size_t i = 0; i < n; i++) cap += strlen(ids[i]) + (extra ? strlen(extra[i]) : 0) + 4;
  char *a = malloc(cap), *o = a;
  if (!a) return NULL;
  *o++ = '{';
  for (size_t i = 0; i < n; i++)
    o += sprintf(o, "%s\"%s\"", i ? "," : "", extra ? extra[i] : ids[i]);
  *o++ = '}';
  *o = '\0';
  char *lit = PQescapeLiteral(c, a, strlen(a));
  free(a);
  char *out = lit ? strdup(lit) : NULL;
  PQfreemem(lit);
  return out;
}

/* The ids of src's conversations of logical shard `shard` (heap array of
 * heap strings, store_strings_free). 0 or 1. */
static int shard_convs(db_t *src, int shard, char ***ids, size_t *n) {
  PGresult *r = NULL;
  *ids = NULL;
  *n = 0;
  if (q(src, "SELECT id FROM conversations", 0, NULL, &r)) return 1;
  int rows = PQntuples(r);
  char **v = calloc((size_t)rows + 1, sizeof *v);
  size_t k = 0;
  for (int i = 0; v && i < rows; i++) {
    const char *id = PQgetvalue(r, i, 0);
    if (shard_of(id) == shard && !(v[k++] = strdup(id))) {
      store_strings_free(v, k);
      v = NULL;
    }
  }
  PQclear(r);
  if (!v) {
    fprintf(stderr, "converger shards: out of memory\n");
    return 1;
  }
  *ids = v;
  *n = k;
  return 0;
}

/* One copy of the shard's rows from src to dst (see the header: step 1
 * with `delta` 0, step 3 with 1), in one snapshot of src and one
 * transaction of dst; *c counts what was copied. 0 or 1 (dst rolled
 * back). */
static int copy_pass(db_t *src, db_t *dst, int shard, int delta, counts_t *c) {
  char **ids = NULL;
  size_t n = 0;
  char *lit = NULL, *after = NULL, *sql = NULL;
  char **heads = NULL;
  int bad = q(src, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, NULL);
  if (!bad) bad = shard_convs(src, shard, &ids, &n);
  if (!bad) bad = q(dst, "BEGIN", 0, NULL, NULL);
  if (!bad && !(lit = ids_literal(dst->c, ids, n, NULL))) bad = 1;
  /* the heads dst has (0: none): messages after them are copied */
  if (!bad && !(heads = calloc(n + 1, sizeof *heads))) bad = 1;
  for (size_t i = 0; !bad && i < n; i++)
    if (!(heads[i] = strdup("0"))) bad = 1;
  if (!bad && delta) {
    PGresult *r = NULL;
    bad = !(sql = sqlf("SELECT id, head FROM conversations WHERE id = ANY (%s::text[])", lit)) ||
          q(dst, sql, 0, NULL, &r);
    for (int j = 0; !bad && j < PQntuples(r); j++)
      for (size_t i = 0; i < n; i++)
        if (strcmp(ids[i], PQgetvalue(r, j, 0)) == 0) {
          free(heads[i]);
          if (!(heads[i] = strdup(PQgetvalue(r, j, 1)))) bad = 1;
          break;
        }
    PQclear(r);
    free(sql);
    sql = NULL;
  } else if (!bad) { /* leftovers of an earlier move away from dst */
    bad = !(sql = sqlf("DELETE FROM presence WHERE conv = ANY (%1$s::text[]);"
                       " DELETE FROM messages WHERE conv = ANY (%1$s::text[]);"
                       " DELETE FROM conversations WHERE id = ANY (%1$s::text[])",
                       lit));
    PGresult *r = bad ? NULL : PQexec(dst->c, sql);
    if (!bad && PQresultStatus(r) != PGRES_COMMAND_OK) {
      fprintf(stderr, "converger shards: %s: %s", dst->name, PQerrorMessage(dst->c));
      bad = 1;
    }
    PQclear(r);
    free(sql);
    sql = NULL;
  }
  if (!bad && !(after = ids_literal(dst->c, ids, n, (const char *const *)heads))) bad = 1;
  long k = 0;
  /* channels: the ones dst lacks */
  if (!bad)
    bad = q(dst,
            "CREATE TEMP TABLE mv_channels ON COMMIT DROP AS SELECT id, name, presence, active,"
            " created_ms, signals FROM channels LIMIT 0",
            0, NULL, NULL);
  if (!bad) {
    sql = sqlf("COPY (SELECT id, name, presence, active, created_ms, signals FROM channels"
               " WHERE id IN (SELECT channel FROM conversations WHERE id = ANY (%s::text[])))"
               " TO STDOUT",
               lit);
    bad = !sql || copy_rows(src, dst, sql,
                            "COPY mv_channels (id, name, presence, active, created_ms, signals)"
                            " FROM STDIN",
                            &k);
    free(sql);
    sql = NULL;
  }
  PGresult *r = NULL;
  if (!bad)
    bad = q(dst,
            "INSERT INTO channels (id, name, presence, active, created_ms, signals)"
            " SELECT id, name, presence, active, created_ms, signals FROM mv_channels"
            " ON CONFLICT (id) DO NOTHING",
            0, NULL, &r);
  if (!bad) c->channels += strtol(PQcmdTuples(r), NULL, 10);
  PQclear(r);
  r = NULL;
  /* conversations: new ones inserted, the others' heads and epochs set */
  if (!bad)
    bad = q(dst,
            "CREATE TEMP TABLE mv_convs ON COMMIT DROP AS SELECT id, channel, head, created_ms,"
            " epoch FROM conversations LIMIT 0",
            0, NULL, NULL);
  if (!bad) {
    sql = sqlf("COPY (SELECT id, channel, head, created_ms, epoch FROM conversations"
               " WHERE id = ANY (%s::text[])) TO STDOUT",
               lit);
    bad = !sql || copy_rows(src, dst, sql,
                            "COPY mv_convs (id, channel, head, created_ms, epoch) FROM STDIN", &k);
    free(sql);
    sql = NULL;
  }
  if (!bad)
    bad = q(dst,
            "INSERT INTO conversations (id, channel, head, created_ms, epoch)"
            " SELECT id, channel, head, created_ms, epoch FROM mv_convs"
            " ON CONFLICT (id) DO UPDATE SET head = excluded.head, epoch = excluded.epoch",
            0, NULL, NULL);
  if (!bad) c->convs = (long)n;
  /* messages after dst's heads */
  if (!bad) {
    sql = sqlf("COPY (SELECT m.conv, m.seq, m.id, m.sender, m.body, m.ts_ms"
               " FROM unnest(%s::text[], %s::bigint[]) AS u (c, a)"
               " JOIN messages m ON m.conv = u.c AND m.seq > u.a) TO STDOUT",
               lit, after);
    k = 0;
    bad = !sql || copy_rows(src, dst, sql,
                            "COPY messages (conv, seq, id, sender, body, ts_ms) FROM STDIN", &k);
    c->msgs += k;
    free(sql);
    sql = NULL;
  }
  /* presence: src's rows replace dst's */
  if (!bad && delta) {
    sql = sqlf("DELETE FROM presence WHERE conv = ANY (%s::text[])", lit);
    bad = !sql || q(dst, sql, 0, NULL, NULL);
    free(sql);
    sql = NULL;
  }
  if (!bad) {
    sql = sqlf("COPY (SELECT conv, client, user_id, node_id, since_ms FROM presence"
               " WHERE conv = ANY (%s::text[])) TO STDOUT",
               lit);
    k = 0;
    bad = !sql ||
          copy_rows(src, dst, sql,
                    "COPY presence (conv, client, user_id, node_id, since_ms) FROM STDIN", &k);
    c->presence = k;
    free(sql);
    sql = NULL;
  }
  if (!bad && delta) {
    char ks[16];
    const char *p = ks;
    snprintf(ks, sizeof ks, "%d", shard);
    bad = q(dst, "DELETE FROM shard_moved WHERE shard = $1", 1, &p, NULL);
  }
  if (!bad) bad = q(dst, "COMMIT", 0, NULL, NULL);
  if (bad) {
    PGresult *x = PQexec(dst->c, "ROLLBACK");
    PQclear(x);
  }
  PGresult *x = PQexec(src->c, "ROLLBACK"); /* the read snapshot */
  PQclear(x);
  free(lit);
  free(after);
  store_strings_free(heads, n);
  store_strings_free(ids, n);
  return bad;
}

/* The instances' URLs (heap strings, *n of them) and the instance of
 * logical shard `shard`, from the control database. 0 or 1. */
static int read_map(db_t *ctl, int shard, char ***urls, int *n, int *inst, int64_t *version) {
  PGresult *r = NULL;
  *urls = NULL;
  *n = 0;
  if (q(ctl, "SELECT url FROM shard_instances ORDER BY id", 0, NULL, &r)) return 1;
  int rows = PQntuples(r);
  if (rows == 0) {
    fprintf(stderr, "converger shards: %s has no shard map (converger shards init)\n", ctl->shown);
    PQclear(r);
    return 1;
  }
  char **v = calloc((size_t)rows, sizeof *v);
  for (int i = 0; v && i < rows; i++) v[i] = strdup(PQgetvalue(r, i, 0));
  PQclear(r);
  if (!v) return 1;
  *urls = v;
  *n = rows;
  char ks[16];
  const char *p = ks;
  snprintf(ks, sizeof ks, "%d", shard);
  if (q(ctl,
        "SELECT m.instance, v.version FROM shard_map m, shard_map_version v WHERE m.shard = $1", 1,
        &p, &r))
    return 1;
  int ok = PQntuples(r) == 1;
  if (ok) {
    *inst = (int)strtol(PQgetvalue(r, 0, 0), NULL, 10);
    *version = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
  }
  PQclear(r);
  return !ok;
}

/* Steps 7: 0 when every live node records `version` within wait_s. */
static int wait_nodes(db_t *ctl, int64_t version, int wait_s) {
  uint64_t start = util_mono_ms(), last_line = 0;
  for (;;) {
    char since[24];
    const char *p = since;
    snprintf(since, sizeof since, "%" PRId64, util_now_ms() - MEMBERSHIP_MAX_AGE_MS);
    PGresult *r = NULL;
    if (q(ctl, "SELECT id, map_version FROM nodes WHERE updated_ms >= $1 ORDER BY id", 1, &p, &r))
      return 1;
    int live = PQntuples(r), behind = 0;
    char first[160] = "";
    for (int i = 0; i < live; i++)
      if (strtoll(PQgetvalue(r, i, 1), NULL, 10) < version && behind++ == 0)
        snprintf(first, sizeof first, "%s at version %s", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1));
    PQclear(r);
    uint64_t now = util_mono_ms();
    if (behind == 0) {
      printf("every live node (%d) routes by map version %" PRId64 " (%llu ms after the switch)\n",
             live, version, (unsigned long long)(now - start));
      return 0;
    }
    if (now - start >= (uint64_t)wait_s * 1000) {
      fprintf(stderr,
              "converger shards: %d of %d live nodes still route by an older map after %d s (%s)"
              "\n",
              behind, live, wait_s, first);
      return 1;
    }
    if (now - last_line >= 1000) {
      printf("waiting: %d of %d live nodes on map version %" PRId64 " (%s)\n", live - behind, live,
             version, first);
      fflush(stdout);
      last_line = now;
    }
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Step 8: src's rows of the shard's conversations deleted. */
static int delete_source(db_t *src, int shard, long *convs) {
  char **ids = NULL;
  size_t n = 0;
  if (shard_convs(src, shard, &ids, &n)) return 1;
  char *lit = ids_literal(src->c, ids, n, NULL);
  char *sql = lit ? sqlf("BEGIN; DELETE FROM presence WHERE conv = ANY (%1$s::text[]);"
                         " DELETE FROM messages WHERE conv = ANY (%1$s::text[]);"
                         " DELETE FROM conversations WHERE id = ANY (%1$s::text[]); COMMIT",
                         lit)
                  : NULL;
  PGresult *r = sql ? PQexec(src->c, sql) : NULL;
  int bad = PQresultStatus(r) != PGRES_COMMAND_OK;
  if (bad) {
    fprintf(stderr, "converger shards: deleting the source's copies: %s", PQerrorMessage(src->c));
    PGresult *x = PQexec(src->c, "ROLLBACK");
    PQclear(x);
  }
  PQclear(r);
  free(sql);
  free(lit);
  store_strings_free(ids, n);
  *convs = (long)n;
  return bad;
}

/* Each instance's schema brought up to this build's (migration 9: the
 * guard and shard_moved). */
static int migrate(const char *url, const char *name) {
  store_t *s = NULL;
  store_options_t opt = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 5000};
  int r = store_open(url, &opt, &s);
  if (r == 0) r = store_migrate(s);
  store_close(s);
  if (r != 0) {
    char shown[512];
    dburl_redact(url, shown, sizeof shown);
    fprintf(stderr, "converger shards: %s (%s): %s\n", name, shown, cv_strerror(r));
  }
  return r != 0;
}

int shards_move(const config_t *cfg, const shards_move_t *m) {
  int k = m->shard, wait_s = m->wait_s > 0 ? m->wait_s : WAIT_DEFAULT_S;
  int lock_wait_ms = m->lock_wait_ms > 0 ? m->lock_wait_ms : LOCK_WAIT_MS;
  db_t ctl = {0}, src = {0}, dst = {0};
  char **urls = NULL;
  int n = 0, from = -1, status = 1, locked = 0, marked = 0;
  int64_t version = 0;
  char ks[16], ts[16], vs[24];
  snprintf(ks, sizeof ks, "%d", k);
  snprintf(ts, sizeof ts, "%d", m->to);
  if (migrate(cfg->database_url, "the control database") ||
      db_open(&ctl, cfg->database_url, "the control database", lock_wait_ms) ||
      read_map(&ctl, k, &urls, &n, &from, &version))
    goto out;
  if (m->to < 0 || m->to >= n) {
    fprintf(stderr, "converger shards: no instance %d (the map has 0..%d)\n", m->to, n - 1);
    status = 2;
    goto out;
  }
  if (from == m->to) {
    fprintf(stderr, "converger shards: logical shard %d is on instance %d already\n", k, from);
    status = 2;
    goto out;
  }
  if (migrate(urls[from], "the source") || migrate(urls[m->to], "the target") ||
      db_open(&src, urls[from], "the source", lock_wait_ms) ||
      db_open(&dst, urls[m->to], "the target", lock_wait_ms))
    goto out;
  printf("moving logical shard %d from instance %d (%s) to instance %d (%s), map version %" PRId64
         "\n",
         k, from, src.shown, m->to, dst.shown, version);
  {
    PGresult *r = NULL;
    if (q(&src, "SELECT 1 FROM shard_moved WHERE shard = $1", 1, (const char *const[]){ks}, &r))
      goto out;
    if (PQntuples(r) > 0)
      printf("note: the source marks the shard moved already (an earlier move stopped after its "
             "step 4): its writes fail until this move completes\n");
    PQclear(r);
  }

  /* 1: the bulk, not frozen */
  counts_t bulk = {0}, delta = {0};
  uint64_t t0 = util_mono_ms();
  if (copy_pass(&src, &dst, k, 0, &bulk)) goto out;
  printf("copied %ld conversation(s), %ld message(s) before the freeze in %llu ms\n", bulk.convs,
         bulk.msgs, (unsigned long long)(util_mono_ms() - t0));
  fflush(stdout);

  /* 2: the freeze */
  uint64_t f0 = util_mono_ms();
  char key[16];
  snprintf(key, sizeof key, "%d", STORE_SHARD_LOCK_KEY);
  if (q(&src, "SELECT pg_advisory_lock($1::integer, $2::integer)", 2,
        (const char *const[]){key, ks}, NULL)) {
    fprintf(stderr,
            "converger shards: the shard's writes in flight did not end within %d ms; "
            "nothing changed\n",
            lock_wait_ms);
    goto out;
  }
  locked = 1;
  /* 3: the delta */
  if (copy_pass(&src, &dst, k, 1, &delta)) goto out;
  /* 4: the source marked */
  if (q(&src,
        "INSERT INTO shard_moved (shard, instance) VALUES ($1, $2)"
        " ON CONFLICT (shard) DO UPDATE SET instance = excluded.instance",
        2, (const char *const[]){ks, ts}, NULL))
    goto out;
  marked = 1;
  /* 5: the map */
  {
    PGresult *r = NULL;
    char fs[16];
    snprintf(fs, sizeof fs, "%d", from);
    int bad = q(&ctl, "BEGIN", 0, NULL, NULL) ||
              q(&ctl, "SELECT instance FROM shard_map WHERE shard = $1 FOR UPDATE", 1,
                (const char *const[]){ks}, &r);
    if (!bad && (PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 0), fs) != 0)) {
      fprintf(stderr, "converger shards: the map changed under the move\n");
      bad = 1;
    }
    PQclear(r);
    r = NULL;
    if (!bad)
      bad = q(&ctl, "UPDATE shard_map SET instance = $2 WHERE shard = $1", 2,
              (const char *const[]){ks, ts}, NULL) ||
            q(&ctl, "UPDATE shard_map_version SET version = version + 1 RETURNING version", 0, NULL,
              &r);
    if (!bad) version = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    int committing = !bad;
    if (!bad) bad = q(&ctl, "COMMIT", 0, NULL, NULL);
    if (bad && committing) {
      /* A COMMIT with no answer may have committed: what the map says
       * now, on a new connection, decides. If it names the target (or
       * cannot be read) the source keeps its mark: writes there fail
       * rather than go to two instances. */
      db_t again = {0};
      int at = -1;
      if (db_open(&again, cfg->database_url, "the control database", lock_wait_ms) == 0 &&
          q(&again, "SELECT instance FROM shard_map WHERE shard = $1", 1, (const char *const[]){ks},
            &r) == 0) {
        if (PQntuples(r) == 1) at = atoi(PQgetvalue(r, 0, 0));
        PQclear(r);
        r = NULL;
      }
      db_close(&again);
      if (at == m->to) {
        marked = 0;
        fprintf(stderr,
                "converger shards: the map switch's COMMIT was not answered, but the map names "
                "instance %d: the move went through; run `converger shards cleanup %d` once "
                "every node follows\n",
                m->to, k);
      } else if (at != from) {
        marked = 0;
        fprintf(stderr,
                "converger shards: the map switch's COMMIT was not answered and the map cannot "
                "be read: shard %d stays marked moved on its source (its writes fail with a "
                "retry hint); run `converger shards show`, then this move again\n",
                k);
      }
    }
    if (bad) {
      PGresult *x = PQexec(ctl.c, "ROLLBACK");
      PQclear(x);
      goto out;
    }
  }
  marked = 0; /* the map names the target: the mark stays */
  /* 6: thaw */
  (void)q(&src, "SELECT pg_advisory_unlock($1::integer, $2::integer)", 2,
          (const char *const[]){key, ks}, NULL);
  locked = 0;
  uint64_t frozen = util_mono_ms() - f0;
  snprintf(vs, sizeof vs, "%" PRId64, version);
  printf("frozen for %llu ms: copied %ld more message(s), %ld presence row(s), %ld channel "
         "row(s); map version %s names instance %d\n",
         (unsigned long long)frozen, delta.msgs, delta.presence, bulk.channels + delta.channels, vs,
         m->to);
  fflush(stdout);
  status = 0;
  /* 7, 8 */
  if (wait_nodes(&ctl, version, wait_s)) {
    fprintf(stderr,
            "converger shards: the move is done; the source's copies are kept (run "
            "`converger shards cleanup %d` once every node follows)\n",
            k);
    status = 1;
  } else if (!m->keep_source) {
    long gone = 0;
    if (delete_source(&src, k, &gone))
      status = 1;
    else
      printf("deleted the source's copies of %ld conversation(s)\n", gone);
  } else {
    printf("the source's copies are kept (--keep-source)\n");
  }
out:
  if (marked) { /* the map still names the source: it takes writes again */
    if (q(&src, "DELETE FROM shard_moved WHERE shard = $1", 1, (const char *const[]){ks}, NULL))
      fprintf(stderr,
              "converger shards: the source stays marked moved: its writes of shard %d "
              "fail until this move is run again\n",
              k);
  }
  if (locked) printf("the freeze ended; the shard stays on instance %d\n", from);
  db_close(&src); /* ends the freeze with the session, if still held */
  db_close(&dst);
  db_close(&ctl);
  for (int i = 0; urls && i < n; i++) free(urls[i]);
  free(urls);
  return status;
}

/* `converger shards cleanup SHARD`: the copies of logical shard `shard`
 * on the instances the map does not name for it, which the shard moved
 * away from (shard_moved), deleted once every live node routes by the
 * current map. */
int shards_cleanup(const config_t *cfg, int shard, int wait_s) {
  db_t ctl = {0};
  char **urls = NULL;
  int n = 0, at = -1, status = 1;
  int64_t version = 0;
  char ks[16];
  snprintf(ks, sizeof ks, "%d", shard);
  if (db_open(&ctl, cfg->database_url, "the control database", LOCK_WAIT_MS) ||
      read_map(&ctl, shard, &urls, &n, &at, &version) ||
      wait_nodes(&ctl, version, wait_s > 0 ? wait_s : WAIT_DEFAULT_S))
    goto out;
  status = 0;
  for (int i = 0; i < n; i++) {
    if (i == at) continue;
    db_t d = {0};
    PGresult *r = NULL;
    if (db_open(&d, urls[i], "an instance", LOCK_WAIT_MS) ||
        q(&d, "SELECT 1 FROM shard_moved WHERE shard = $1", 1, (const char *const[]){ks}, &r)) {
      status = 1;
      db_close(&d);
      continue;
    }
    int was = PQntuples(r) > 0;
    PQclear(r);
    long gone = 0;
    if (was && delete_source(&d, shard, &gone))
      status = 1;
    else if (was)
      printf("instance %d: deleted its copies of %ld conversation(s)\n", i, gone);
    db_close(&d);
  }
out:
  db_close(&ctl);
  for (int i = 0; urls && i < n; i++) free(urls[i]);
  free(urls);
  return status;
}

int shards_add_instance(const config_t *cfg, const char *url) {
  char shown[512];
  dburl_redact(url ? url : "", shown, sizeof shown);
  const char *b = url ? dburl_backend(url) : NULL;
  if (!b || strcmp(b, "postgres") != 0 || strlen(url) > STORE_URL_MAX) {
    fprintf(stderr, "converger shards: %s is not a PostgreSQL URL of at most %d bytes\n", shown,
            STORE_URL_MAX);
    return 2;
  }
  if (migrate(cfg->database_url, "the control database") || migrate(url, "the new instance"))
    return 1;
  db_t ctl = {0};
  if (db_open(&ctl, cfg->database_url, "the control database", LOCK_WAIT_MS)) return 1;
  PGresult *r = NULL;
  int status = 1;
  if (q(&ctl, "BEGIN", 0, NULL, NULL) ||
      q(&ctl, "LOCK TABLE shard_instances IN EXCLUSIVE MODE", 0, NULL, NULL) ||
      q(&ctl,
        "SELECT count(*), coalesce(max(id) + 1, 0), coalesce(bool_or(url = $1), false)"
        " FROM shard_instances",
        1, (const char *const[]){url}, &r))
    goto out;
  long count = strtol(PQgetvalue(r, 0, 0), NULL, 10);
  char id[24];
  snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 1));
  int dup = strcmp(PQgetvalue(r, 0, 2), "t") == 0;
  PQclear(r);
  r = NULL;
  if (count == 0) {
    fprintf(stderr, "converger shards: no shard map (converger shards init)\n");
    goto out;
  }
  if (dup || count >= STORE_INSTANCES_MAX) {
    fprintf(stderr, "converger shards: %s\n",
            dup ? "the map has this instance already" : "the map has the most instances it can");
    status = 2;
    goto out;
  }
  if (q(&ctl, "INSERT INTO shard_instances (id, url) VALUES ($1, $2)", 2,
        (const char *const[]){id, url}, NULL) ||
      q(&ctl, "UPDATE shard_map_version SET version = version + 1 RETURNING version", 0, NULL,
        &r) ||
      q(&ctl, "COMMIT", 0, NULL, NULL))
    goto out;
  printf("instance %s (%s) added with no logical shards; map version %s. Move shards onto it "
         "with `converger shards move SHARD --to %s`\n",
         id, shown, PQgetvalue(r, 0, 0), id);
  status = 0;
out:
  PQclear(r);
  if (status != 0) {
    PGresult *x = PQexec(ctl.c, "ROLLBACK");
    PQclear(x);
  }
  db_close(&ctl);
  return status;
}
