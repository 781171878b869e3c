/*
 * postgres: the PostgreSQL backend of store.h, on libpq ("postgres://...",
 * "postgresql://..." or a libpq keyword string "host=... dbname=..."). One
 * database serves every node of a cluster; store.c dispatches here through
 * store_postgres_ops with arguments already checked (backend.h).
 *
 * Owns: one PGconn per store_t and a copy of the URL, to connect again.
 *
 * Thread: the one pool worker that opened it. libpq is thread-safe, but a
 * PGconn is not shared: one connection, one thread, one query at a time.
 *
 * Connecting fails fast. PQconnectStartParams + PQconnectPoll run under our
 * own deadline: the URL's connect_timeout (seconds) or
 * PGCONN_CONNECT_TIMEOUT_MS.
 * (libpq's blocking connect has a 2 s floor and counts it per address; a
 * server that accepts TCP but never answers would otherwise hold a worker
 * for good.) Defaults the URL may override come before it in the keyword
 * list: TCP keepalives and tcp_user_timeout, so a peer that vanished
 * mid-query is noticed in seconds rather than after the kernel's two hours,
 * and the application name. client_encoding comes after it: the store
 * speaks UTF-8 whatever the URL says. Each session then gets lock_timeout
 * (the store's busy timeout: a row lock not obtained in time is -CV_EBUSY),
 * statement_timeout and idle_in_transaction_session_timeout, so nothing
 * waits without bound and no stuck peer keeps a conversation locked.
 *
 * A server that hangs (stopped, or a network that drops everything) answers
 * nothing, not even at its statement_timeout: wait_result stops waiting at
 * that timeout plus ANSWER_MARGIN_MS, or at the caller's deadline
 * (store_set_deadline) when that comes first, and closes the connection.
 * Once the deadline has passed nothing more is sent (past_deadline), and a
 * connect attempt stops at it too. Closing is how a statement is given up
 * on: the server rolls back what it had not committed, and the next call
 * connects again instead of reading a late answer as its own.
 *
 * Reconnecting: every op first checks its connection (conn_ready). One the
 * server closed while it was idle (PostgreSQL restarted, backend
 * terminated) is noticed with a zero-timeout poll() before anything is sent
 * and replaced, so the op runs on a fresh one. An op whose connection
 * breaks under it fails with -CV_ESTORE (-CV_ETIMEDOUT when it was closed
 * at the caller's deadline); a COMMIT that breaks may or may not have
 * committed, which is what idempotency keys are for: the caller retries
 * the append with the same id. Never inside a read transaction: that would
 * silently leave its snapshot, so those ops fail instead.
 *
 * Invariants:
 *  - every value is a parameter of PQexecParams (text format); SQL text is
 *    constant (migrations are the only multi-statement scripts, run with
 *    PQexec and no data);
 *  - seq is gapless across connections and nodes: the append transaction
 *    locks the conversation's row before it reads anything, then bumps the
 *    head and inserts under that lock and commits (see op_append);
 *  - no op returns with a transaction open, except store_read_begin: every
 *    failure after BEGIN goes through tx_rollback;
 *  - errors map by SQLSTATE (result_error): unique violation -CV_EEXISTS,
 *    foreign key -CV_ENOTFOUND, lock/statement timeout, serialization
 *    failure or deadlock -CV_EBUSY, bad data (class 22) -CV_EINVAL, the rest
 *    (including a lost connection) -CV_ESTORE with the server's message
 *    logged on one line.
 */
#include "store/store.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dburl.h"
#include "core/errors.h"
#include "core/log.h"
#include "common/util.h"
#include "store/backend.h"
#include "store/notify.h"
#include "store/pgconn.h"
#include "core/shard.h"

#define STATEMENT_TIMEOUT_MS  30000 /* any one statement, lock waits included */
#define IDLE_IN_TX_TIMEOUT_MS 10000 /* a transaction left open by a stuck peer */
#define ANSWER_MARGIN_MS      2000  /* beyond statement_timeout, the client stops waiting */
#define RECONNECT_PAUSE_MS    500   /* after a failed connect, calls fail at once this long */
#define PREPARED_MAX          48    /* prepared statements per connection (the SQL_* constants) */
/* pg_advisory_xact_lock key serializing store_migrate across nodes
 * ("converge" in ASCII). */
#define MIGRATE_LOCK_KEY "7164779185366738789"

#define PG_STR_(x) #x
#define PG_STR(x)  PG_STR_(x) /* a number macro as SQL text */

/* Migrations, oldest first: migrations[i] brings the schema to version i+1,
 * the same numbers as sqlite.c's, for the same tables. Append only; never
 * edit one that has shipped. Each runs with its schema_version insert in
 * store_migrate's transaction. Ids are COLLATE "C": compared and indexed
 * bytewise, as SQLite does, whatever the database's locale. */
static const char *const migrations[] = {
    /* 1: initial schema. messages' primary key (conv, seq) is the replay
     * order; (conv, id) is the idempotency key. */
    "CREATE TABLE channels ("
    " id TEXT COLLATE \"C\" PRIMARY KEY,"
    " name TEXT NOT NULL,"
    " presence INTEGER NOT NULL DEFAULT 0 CHECK (presence IN (0, 1)),"
    " active INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1)),"
    " created_ms BIGINT NOT NULL);"
    "CREATE TABLE conversations ("
    " id TEXT COLLATE \"C\" PRIMARY KEY,"
    " channel TEXT COLLATE \"C\" NOT NULL REFERENCES channels (id),"
    " head BIGINT NOT NULL DEFAULT 0,"
    " created_ms BIGINT NOT NULL);"
    "CREATE INDEX conversations_channel ON conversations (channel);"
    "CREATE TABLE messages ("
    " conv TEXT COLLATE \"C\" NOT NULL REFERENCES conversations (id),"
    " seq BIGINT NOT NULL,"
    " id TEXT COLLATE \"C\" NOT NULL,"
    " sender TEXT NOT NULL,"
    " body TEXT NOT NULL,"
    " ts_ms BIGINT NOT NULL,"
    " PRIMARY KEY (conv, seq),"
    " UNIQUE (conv, id));"
    "CREATE TABLE revocations ("
    " jti TEXT COLLATE \"C\" PRIMARY KEY,"
    " exp_s BIGINT NOT NULL);"
    "CREATE INDEX revocations_exp ON revocations (exp_s);",
    /* 2: cluster membership, one row per node, replaced by its heartbeat
     * (store_node_beat); a row not updated lately is a node that is gone. */
    "CREATE TABLE nodes ("
    " id TEXT COLLATE \"C\" PRIMARY KEY,"
    " public_url TEXT NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN ('ready', 'draining')),"
    " connections BIGINT NOT NULL,"
    " waiters BIGINT NOT NULL,"
    " updated_ms BIGINT NOT NULL);",
    /* 3: every conversation's history gets an identity, its epoch
     * (store.h), drawn at random: a volatile default is evaluated for each
     * existing row and for every insert; SQL_EPOCH_ROTATE draws again. */
    "ALTER TABLE conversations ADD COLUMN epoch TEXT NOT NULL"
    " DEFAULT substr(md5(random()::text || clock_timestamp()::text), 1, 8);",
    /* 4: a node's capacity (CONVERGER_CAPACITY_CONNECTIONS) in its row,
     * for converger roll's headroom budget; 0 is "not set", which is what
     * rows of nodes from before it say. */
    "ALTER TABLE nodes ADD COLUMN capacity BIGINT NOT NULL DEFAULT 0;",
    /* 5: whether a channel's conversations carry signals (docs/protocol.md
     * 4.10), and who is present where across the cluster (store.h,
     * "Presence"): one row per conversation, user, client instance and node
     * that holds a connection of it. SQLite keeps presence in the node's
     * memory and adds only the column. */
    "ALTER TABLE channels ADD COLUMN signals INTEGER NOT NULL DEFAULT 0"
    " CHECK (signals IN (0, 1));"
    "CREATE TABLE presence ("
    " conv TEXT COLLATE \"C\" NOT NULL,"
    " client TEXT COLLATE \"C\" NOT NULL,"
    " user_id TEXT COLLATE \"C\" NOT NULL,"
    " node_id TEXT COLLATE \"C\" NOT NULL,"
    " since_ms BIGINT NOT NULL,"
    " PRIMARY KEY (conv, user_id, client, node_id));"
    "CREATE INDEX presence_node ON presence (node_id);",
    /* 6: the http URL of a node's admin listener (CONVERGER_ADMIN_LISTEN),
     * where converger roll reaches its admin routes; '' for none, which is
     * what rows of nodes from before it say (a node of an older version
     * writes rows without it: the default). */
    "ALTER TABLE nodes ADD COLUMN admin_url TEXT NOT NULL DEFAULT '';",
    /* 7 (PostgreSQL's own; SQLite has no number 7): the group commit
     * (store_append_batch) in one call, so one round trip, set by set and
     * with plans that cannot go wrong with the planner's estimates (every
     * table is reached by its key: a LATERAL probe or = ANY, never a join
     * it could turn into a scan). It locks every conversation of the
     * group in id order (two groups never wait for each other in a
     * circle), then classifies every item in a snapshot taken after the
     * lock (READ COMMITTED): 2 the conversation is missing; 1 a message is
     * stored under (conv, id), answered with it; 3 the channel is
     * inactive; 4 an earlier item of the group has the same (conv, id)
     * (the caller answers it with that item's message); 0 new, numbered
     * head + 1, head + 2, ... per conversation in array order. The new ones
     * are inserted and their heads moved, and their payloads (notes:
     * templates with chr(1) for the seq and chr(2) for the epoch; NULL: no
     * NOTIFY) go out packed into as few NOTIFYs as fit (store/notify.h:
     * "b"), a lone one as it is. */
    "CREATE OR REPLACE FUNCTION converger_append_batch(p_convs text[], p_ids text[],"
    " p_senders text[], p_bodies text[], p_ts bigint[], p_notes text[])"
    " RETURNS TABLE (o_k integer, o_status integer, o_seq bigint, o_epoch text, o_sender text,"
    " o_body text, o_ts bigint) LANGUAGE plpgsql AS $f$"
    " DECLARE r_st integer[]; r_seq bigint[]; r_ep text[]; r_snd text[]; r_body text[];"
    "  r_ts bigint[]; nc text[]; nt bigint[]; recs text[]; one text; piece text;"
    "  payload text := ''; cnt integer := 0; r text;"
    " BEGIN"
    "  PERFORM 1 FROM conversations v JOIN channels c ON c.id = v.channel"
    "   WHERE v.id = ANY (p_convs) ORDER BY v.id FOR NO KEY UPDATE OF v FOR SHARE OF c;"
    "  WITH it AS (SELECT * FROM unnest(p_convs, p_ids) WITH ORDINALITY AS i (conv, id, k)),"
    "   st AS (SELECT it.k, it.conv, v.active, v.epoch, v.head, m.seq AS f_seq,"
    "    m.sender AS f_sender, m.body AS f_body, m.ts_ms AS f_ts,"
    "    CASE WHEN v.epoch IS NULL THEN 2 WHEN m.seq IS NOT NULL THEN 1 WHEN v.active = 0 THEN 3"
    "     WHEN row_number() OVER (PARTITION BY it.conv, it.id ORDER BY it.k) > 1 THEN 4"
    "     ELSE 0 END AS status"
    "    FROM it LEFT JOIN LATERAL (SELECT c.active, cv.epoch, cv.head FROM conversations cv"
    "     JOIN channels c ON c.id = cv.channel WHERE cv.id = it.conv OFFSET 0) v ON true"
    "    LEFT JOIN LATERAL (SELECT mm.seq, mm.sender, mm.body, mm.ts_ms FROM messages mm"
    "     WHERE mm.conv = it.conv AND mm.id = it.id OFFSET 0) m ON true),"
    "   num AS (SELECT st.*, CASE WHEN status = 0 THEN head + row_number() OVER"
    "    (PARTITION BY conv, status = 0 ORDER BY k) END AS nseq FROM st)"
    "  SELECT array_agg(status ORDER BY k), array_agg(coalesce(f_seq, nseq) ORDER BY k),"
    "   array_agg(epoch ORDER BY k), array_agg(f_sender ORDER BY k), array_agg(f_body ORDER BY k),"
    "   array_agg(f_ts ORDER BY k)"
    "   INTO r_st, r_seq, r_ep, r_snd, r_body, r_ts FROM num;"
    "  INSERT INTO messages (conv, seq, id, sender, body, ts_ms)"
    "   SELECT u.c, u.s, u.i, u.snd, u.b, u.t"
    "   FROM unnest(p_convs, r_seq, p_ids, p_senders, p_bodies, p_ts, r_st)"
    "   AS u (c, s, i, snd, b, t, st) WHERE u.st = 0;"
    "  SELECT array_agg(c), array_agg(top) INTO nc, nt FROM (SELECT u.c, max(u.s) AS top"
    "   FROM unnest(p_convs, r_seq, r_st) AS u (c, s, st) WHERE u.st = 0 GROUP BY u.c) x;"
    "  IF nc IS NOT NULL THEN"
    "   UPDATE conversations SET head = nt[array_position(nc, id)] WHERE id = ANY (nc);"
    "  END IF;"
    "  SELECT array_agg(replace(replace(u.n, chr(1), u.s::text), chr(2), u.e) ORDER BY u.k)"
    "   INTO recs FROM unnest(p_notes, r_seq, r_ep, r_st) WITH ORDINALITY AS u (n, s, e, st, k)"
    "   WHERE u.st = 0 AND u.n IS NOT NULL;"
    "  FOREACH r IN ARRAY coalesce(recs, '{}') LOOP"
    "   piece := octet_length(r)::text || ' ' || r;"
    "   IF cnt > 0 AND 2 + octet_length(payload) + octet_length(piece) > 7999 THEN"
    "    PERFORM pg_notify('" STORE_NOTIFY_CHANNEL "',"
    "     CASE WHEN cnt = 1 THEN one ELSE 'b' || chr(10) || payload END);"
    "    payload := ''; cnt := 0;"
    "   END IF;"
    "   payload := payload || piece; one := r; cnt := cnt + 1;"
    "  END LOOP;"
    "  IF cnt > 0 THEN"
    "   PERFORM pg_notify('" STORE_NOTIFY_CHANNEL "',"
    "    CASE WHEN cnt = 1 THEN one ELSE 'b' || chr(10) || payload END);"
    "  END IF;"
    "  RETURN QUERY SELECT u.k::integer, u.st, u.s, u.e, u.snd, u.b, u.t"
    "   FROM unnest(r_st, r_seq, r_ep, r_snd, r_body, r_ts) WITH ORDINALITY"
    "   AS u (st, s, e, snd, b, t, k) ORDER BY u.k;"
    " END $f$;",
    /* 8: a sharded cluster's map (store.h, store_shardmap_t), read from
     * the control database: its instances and, for each logical shard
     * (core/shard.h), the instance that holds it. Every database gets the
     * tables; only the control database's have rows. */
    "CREATE TABLE shard_instances ("
    " id INTEGER PRIMARY KEY CHECK (id >= 0),"
    " url TEXT NOT NULL);"
    "CREATE TABLE shard_map ("
    " shard INTEGER PRIMARY KEY CHECK (shard >= 0 AND shard < 256),"
    " instance INTEGER NOT NULL REFERENCES shard_instances (id));"
    "CREATE TABLE shard_map_version (one INTEGER PRIMARY KEY CHECK (one = 1),"
    " version BIGINT NOT NULL);",
    /* 9: moving a logical shard (`converger shards move`, cli/shards_move.c).
     * On an instance: shard_moved, the shards that moved away from it (and
     * where to), and the guard every write of a sharded cluster passes in
     * its transaction (store_options_t.guard): the shard's advisory lock,
     * taken shared without waiting (1: the mover holds it exclusive, the
     * shard is frozen), then shard_moved read by a statement of its own, so
     * with a snapshot taken after the lock: a move that committed before
     * releasing its lock is always seen (2: moved). The group commit's
     * guarded form passes each distinct shard of the group once, in shard
     * order, and answers the items of a frozen or moved shard with status
     * 5 or 6 (the others are appended as converger_append_batch does). In
     * the control database: the map version each node routes by
     * (store_shardmap_sync). */
    "CREATE TABLE shard_moved ("
    " shard INTEGER PRIMARY KEY CHECK (shard >= 0 AND shard < 256),"
    " instance INTEGER NOT NULL);"
    "ALTER TABLE nodes ADD COLUMN map_version BIGINT NOT NULL DEFAULT 0;"
    "CREATE OR REPLACE FUNCTION converger_shard_guard(p_shard integer) RETURNS integer"
    " LANGUAGE plpgsql VOLATILE AS $f$"
    " BEGIN"
    "  IF NOT pg_try_advisory_xact_lock_shared(" PG_STR(
        STORE_SHARD_LOCK_KEY) ", p_shard) THEN"
                              "   RETURN 1;"
                              "  END IF;"
                              "  IF EXISTS (SELECT 1 FROM shard_moved WHERE shard = p_shard) THEN "
                              "RETURN 2; END IF;"
                              "  RETURN 0;"
                              " END $f$;"
                              "CREATE OR REPLACE FUNCTION converger_append_batch_guarded(p_shards "
                              "integer[], p_convs text[],"
                              " p_ids text[], p_senders text[], p_bodies text[], p_ts bigint[], "
                              "p_notes text[])"
                              " RETURNS TABLE (o_k integer, o_status integer, o_seq bigint, "
                              "o_epoch text, o_sender text,"
                              " o_body text, o_ts bigint) LANGUAGE plpgsql AS $f$"
                              " DECLARE v_bad integer[] := '{}'; v_why integer[] := '{}'; v_k "
                              "integer; v_g integer;"
                              "  v_keep integer[];"
                              " BEGIN"
                              "  FOR v_k IN SELECT DISTINCT x FROM unnest(p_shards) AS x ORDER BY "
                              "x LOOP"
                              "   v_g := converger_shard_guard(v_k);"
                              "   IF v_g <> 0 THEN v_bad := v_bad || v_k; v_why := v_why || v_g; "
                              "END IF;"
                              "  END LOOP;"
                              "  IF cardinality(v_bad) = 0 THEN"
                              "   RETURN QUERY SELECT * FROM converger_append_batch(p_convs, "
                              "p_ids, p_senders, p_bodies,"
                              "    p_ts, p_notes);"
                              "   RETURN;"
                              "  END IF;"
                              "  SELECT array_agg(i ORDER BY i) INTO v_keep FROM "
                              "generate_subscripts(p_shards, 1) AS i"
                              "   WHERE NOT (p_shards[i] = ANY (v_bad));"
                              "  IF v_keep IS NULL THEN"
                              "   RETURN QUERY SELECT i::integer, 4 + v_why[array_position(v_bad, "
                              "p_shards[i])],"
                              "    NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::bigint"
                              "    FROM generate_subscripts(p_shards, 1) AS i ORDER BY i;"
                              "   RETURN;"
                              "  END IF;"
                              "  RETURN QUERY SELECT * FROM ("
                              "   SELECT i::integer AS k, 4 + v_why[array_position(v_bad, "
                              "p_shards[i])] AS st,"
                              "    NULL::bigint AS s, NULL::text AS e, NULL::text AS snd, "
                              "NULL::text AS b, NULL::bigint AS t"
                              "    FROM generate_subscripts(p_shards, 1) AS i WHERE p_shards[i] = "
                              "ANY (v_bad)"
                              "   UNION ALL"
                              "   SELECT v_keep[g.o_k], g.o_status, g.o_seq, g.o_epoch, "
                              "g.o_sender, g.o_body, g.o_ts"
                              "    FROM converger_append_batch("
                              "     ARRAY(SELECT p_convs[j] FROM unnest(v_keep) WITH ORDINALITY AS "
                              "u (j, o) ORDER BY o),"
                              "     ARRAY(SELECT p_ids[j] FROM unnest(v_keep) WITH ORDINALITY AS u "
                              "(j, o) ORDER BY o),"
                              "     ARRAY(SELECT p_senders[j] FROM unnest(v_keep) WITH ORDINALITY "
                              "AS u (j, o) ORDER BY o),"
                              "     ARRAY(SELECT p_bodies[j] FROM unnest(v_keep) WITH ORDINALITY "
                              "AS u (j, o) ORDER BY o),"
                              "     ARRAY(SELECT p_ts[j] FROM unnest(v_keep) WITH ORDINALITY AS u "
                              "(j, o) ORDER BY o),"
                              "     ARRAY(SELECT p_notes[j] FROM unnest(v_keep) WITH ORDINALITY AS "
                              "u (j, o) ORDER BY o)) g"
                              "  ) x ORDER BY 1;"
                              " END $f$;",
    /* 10: the group commit's guard in two statements per group instead
     * of a converger_shard_guard call per distinct logical shard (which
     * cost about a quarter of a sharded instance's CPU per append,
     * docs/benchmarks/scale-out.md): the shared advisory locks of the
     * group's shards tried in one statement, then shard_moved read for
     * those it got, by a statement of its own (a snapshot taken after the
     * locks, as converger_shard_guard does). Same answers as migration 9:
     * status 5 for a frozen shard's items, 6 for a moved one's. */
    "CREATE OR REPLACE FUNCTION converger_append_batch_guarded(p_shards integer[],"
    " p_convs text[], p_ids text[], p_senders text[], p_bodies text[], p_ts bigint[],"
    " p_notes text[])"
    " RETURNS TABLE (o_k integer, o_status integer, o_seq bigint, o_epoch text,"
    " o_sender text, o_body text, o_ts bigint) LANGUAGE plpgsql AS $f$"
    " DECLARE v_frozen integer[]; v_moved integer[]; v_keep integer[];"
    " BEGIN"
    "  SELECT coalesce(array_agg(d.x), '{}') INTO v_frozen"
    "   FROM (SELECT DISTINCT x FROM unnest(p_shards) AS x) d"
    "   WHERE NOT pg_try_advisory_xact_lock_shared(" PG_STR(STORE_SHARD_LOCK_KEY) ", d.x);"
    "  SELECT coalesce(array_agg(shard), '{}') INTO v_moved FROM shard_moved"
    "   WHERE shard = ANY (p_shards) AND NOT (shard = ANY (v_frozen));"
    "  IF cardinality(v_frozen) = 0 AND cardinality(v_moved) = 0 THEN"
    "   RETURN QUERY SELECT * FROM converger_append_batch(p_convs, p_ids, p_senders,"
    "    p_bodies, p_ts, p_notes);"
    "   RETURN;"
    "  END IF;"
    "  SELECT array_agg(i ORDER BY i) INTO v_keep FROM generate_subscripts(p_shards, 1) AS i"
    "   WHERE NOT (p_shards[i] = ANY (v_frozen || v_moved));"
    "  RETURN QUERY SELECT * FROM ("
    "   SELECT i::integer AS k, CASE WHEN p_shards[i] = ANY (v_frozen) THEN 5 ELSE 6 END AS st,"
    "    NULL::bigint AS s, NULL::text AS e, NULL::text AS snd, NULL::text AS b,"
    "    NULL::bigint AS t"
    "    FROM generate_subscripts(p_shards, 1) AS i"
    "    WHERE p_shards[i] = ANY (v_frozen || v_moved)"
    "   UNION ALL"
    "   SELECT v_keep[g.o_k], g.o_status, g.o_seq, g.o_epoch, g.o_sender, g.o_body, g.o_ts"
    "    FROM converger_append_batch("
    "     ARRAY(SELECT p_convs[j] FROM unnest(v_keep) WITH ORDINALITY AS u (j, o) ORDER BY o),"
    "     ARRAY(SELECT p_ids[j] FROM unnest(v_keep) WITH ORDINALITY AS u (j, o) ORDER BY o),"
    "     ARRAY(SELECT p_senders[j] FROM unnest(v_keep) WITH ORDINALITY AS u (j, o) ORDER BY o),"
    "     ARRAY(SELECT p_bodies[j] FROM unnest(v_keep) WITH ORDINALITY AS u (j, o) ORDER BY o),"
    "     ARRAY(SELECT p_ts[j] FROM unnest(v_keep) WITH ORDINALITY AS u (j, o) ORDER BY o),"
    "     ARRAY(SELECT p_notes[j] FROM unnest(v_keep) WITH ORDINALITY AS u (j, o) ORDER BY o))"
    "    g WHERE v_keep IS NOT NULL"
    "  ) x ORDER BY 1;"
    " END $f$;"
    "ALTER FUNCTION converger_append_batch(text[], text[], text[], text[], bigint[], text[])"
    " SET plan_cache_mode = force_generic_plan;",
};

#define SCHEMA_VERSION ((int)CV_ARRAY_SIZE(migrations))
_Static_assert(STORE_NOTIFY_PAYLOAD_MAX == 7999, "migration 7 packs payloads to 7999 bytes");

/* Parameters in SELECT lists and INSERT ... SELECT have no type to infer
 * from their context: those carry explicit casts. */
#define SQL_CHANNEL_INSERT                                                                         \
  "INSERT INTO channels (id, name, presence, active, created_ms, signals)"                         \
  " VALUES ($1, $2, $3, 1, $4, $5)"
#define SQL_CHANNEL_GET "SELECT id, name, presence, active, signals FROM channels WHERE id = $1"
#define SQL_CHANNEL_SET_ACTIVE                                                                     \
  "UPDATE channels SET active = $2 WHERE id = $1 RETURNING id, name, presence, active, signals"
/* The same, and the change announced to every node in the same
 * (implicit) transaction. */
#define SQL_CHANNEL_SET_ACTIVE_NOTIFY                                                              \
  "WITH u AS (UPDATE channels SET active = $2 WHERE id = $1"                                       \
  " RETURNING id, name, presence, active, signals)"                                                \
  " SELECT id, name, presence, active, signals, pg_notify('" STORE_NOTIFY_CHANNEL "',"             \
  " 'c ' || active || ' ' || id) FROM u"
/* One statement: no row comes back when the channel is missing; a taken id
 * is a unique violation. The channel's flags come from the same snapshot. */
#define SQL_CONV_INSERT                                                                            \
  "WITH ch AS (SELECT id, presence, active, signals FROM channels WHERE id = $2),"                 \
  " ins AS (INSERT INTO conversations (id, channel, head, created_ms)"                             \
  " SELECT $1::text, id, 0, $3::bigint FROM ch RETURNING channel, epoch)"                          \
  " SELECT ch.presence, ch.active, ins.epoch, ch.signals FROM ch JOIN ins ON ins.channel = ch.id"
#define SQL_CONV_GET                                                                               \
  "SELECT v.id, v.channel, v.head, c.active, c.presence, v.epoch, c.signals"                       \
  " FROM conversations v JOIN channels c ON c.id = v.channel WHERE v.id = $1"
/* The same on a sharded cluster's instance (store_options_t.guard): one
 * row always, whose first column says whether the conversation's logical
 * shard ($2) moved away from here (shard_moved), so that a node still on
 * the old map is sent to the new instance instead of reading the frozen
 * copy (a head from before the move, or no conversation at all). */
#define SQL_CONV_GET_GUARDED                                                                       \
  "SELECT EXISTS (SELECT 1 FROM shard_moved WHERE shard = $2::integer), g.* FROM (SELECT 1) o"     \
  " LEFT JOIN (" SQL_CONV_GET ") g ON true"
#define SQL_CONV_EXISTS "SELECT 1 FROM conversations WHERE id = $1"
/* The append's lock. FOR NO KEY UPDATE is the row lock the head UPDATE
 * takes anyway, taken first: it excludes every other appender of this
 * conversation, on any node, until COMMIT, yet not the foreign-key checks
 * of messages (FOR KEY SHARE). In READ COMMITTED, a waiter that gets the
 * lock sees the row as its holder committed it, and each later statement
 * takes a new snapshot, so it sees that holder's message too. The channel
 * row is share-locked as well: a deactivation committed while this waited
 * is then seen (the re-check after a lock wait would otherwise reuse the
 * channel row's old version), and one that comes later waits for COMMIT,
 * as SQLite's single writer orders them. */
#define SQL_APPEND_LOCK                                                                            \
  "SELECT c.active, v.epoch FROM conversations v JOIN channels c ON c.id = v.channel"              \
  " WHERE v.id = $1 FOR NO KEY UPDATE OF v FOR SHARE OF c"
/* After the lock: the message already stored under (conv, id), or, when
 * there is none and the channel is active ($6), seq = head + 1 and the
 * insert. Rows: (1, the stored message) or (0, the new seq), or none when
 * the channel is inactive. The NOTIFY variant sends $7 (store/notify.h)
 * with its chr(1)s replaced by the new seq, in the same statement. */
#define SQL_APPEND_WITH                                                                            \
  "WITH found AS (SELECT seq, id, sender, body, ts_ms FROM messages WHERE conv = $1 AND id = $2)," \
  " h AS (UPDATE conversations SET head = head + 1"                                                \
  " WHERE id = $1 AND $6::boolean AND NOT EXISTS (SELECT 1 FROM found) RETURNING head),"           \
  " ins AS (INSERT INTO messages (conv, seq, id, sender, body, ts_ms)"                             \
  " SELECT $1::text, head, $2::text, $3::text, $4::text, $5::bigint FROM h RETURNING seq)"
#define SQL_APPEND_FOUND " SELECT 1, seq, id, sender, body, ts_ms FROM found UNION ALL"
#define SQL_APPEND                                                                                 \
  SQL_APPEND_WITH SQL_APPEND_FOUND " SELECT 0, seq, NULL, NULL, NULL, NULL FROM ins"
#define SQL_APPEND_NOTIFY                                                                          \
  SQL_APPEND_WITH ", n AS (SELECT pg_notify('" STORE_NOTIFY_CHANNEL "',"                           \
                  " replace($7::text, chr(1), seq::text)) FROM ins)" SQL_APPEND_FOUND              \
                  " SELECT 0, ins.seq, NULL, NULL, NULL, NULL FROM ins, n"
/* A page bounded by count ($4) and bytes ($5): `before` is what the rows
 * ahead of this one in the page weigh (bodies and senders, as sqlite.c
 * counts them), so a row is kept while the page is not yet full and the
 * first row always is. The server drops the rest: a page of large bodies
 * never crosses the network whole. */
#define SQL_REPLAY                                                                                 \
  "SELECT seq, id, sender, body, ts_ms, (SELECT epoch FROM conversations WHERE id = $1) FROM ("    \
  " SELECT seq, id, sender, body, ts_ms,"                                                          \
  " sum(octet_length(body) + octet_length(sender)) OVER (ORDER BY seq"                             \
  " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before"                                   \
  " FROM messages WHERE conv = $1 AND seq > $2 AND seq <= $3"                                      \
  " ORDER BY seq LIMIT $4) page"                                                                   \
  " WHERE coalesce(before, 0) < $5 ORDER BY seq"
/* A new draw per row; the second one only when the first equals the old
 * epoch, so the epoch always changes (see sqlite.c's ST_EPOCH_ROTATE). */
/* The rows are locked first, in id order, as a group commit locks its
 * conversations (converger_append_batch): rotating every conversation
 * never waits in a circle with a group. */
#define SQL_EPOCH_ROTATE                                                                           \
  "WITH l AS (SELECT id FROM conversations WHERE $1::text IS NULL OR id = $1 ORDER BY id"          \
  " FOR NO KEY UPDATE)"                                                                            \
  " UPDATE conversations SET epoch = (SELECT e FROM"                                               \
  " (SELECT substr(md5(random()::text), 1, 8) AS e"                                                \
  " UNION ALL SELECT substr(md5(random()::text), 1, 8)) d WHERE e <> conversations.epoch LIMIT 1)" \
  " WHERE id IN (SELECT id FROM l)"
#define SQL_REVOKE                                                                                 \
  "INSERT INTO revocations (jti, exp_s) VALUES ($1, $2)"                                           \
  " ON CONFLICT (jti) DO UPDATE SET exp_s = greatest(revocations.exp_s, excluded.exp_s)"
#define SQL_REVOCATIONS "SELECT jti FROM revocations WHERE exp_s >= $1 ORDER BY jti"
#define SQL_NODE_BEAT                                                                              \
  "INSERT INTO nodes (id, public_url, state, connections, waiters, updated_ms, capacity,"          \
  " admin_url) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"                                            \
  " ON CONFLICT (id) DO UPDATE SET public_url = excluded.public_url, state = excluded.state,"      \
  " connections = excluded.connections, waiters = excluded.waiters,"                               \
  " updated_ms = excluded.updated_ms, capacity = excluded.capacity, admin_url = "                  \
  "excluded.admin_url"
#define SQL_NODES_LIVE                                                                             \
  "SELECT id, public_url, state, connections, waiters, updated_ms, capacity, admin_url"            \
  " FROM nodes WHERE updated_ms >= $1 ORDER BY id"

typedef struct {
  store_t base; /* first: ops */
  PGconn *conn; /* NULL after a failed reconnect */
  char *url;    /* as given to store_open, for reconnects */
  int connect_timeout_ms;
  int lock_timeout_ms;
  int stmt_timeout_ms;  /* the session's statement_timeout */
  uint64_t retry_after; /* monotonic ms: no reconnect attempt before (after a failure) */
  int in_read;          /* between store_read_begin and store_read_end */
  const char *prepared[PREPARED_MAX]; /* SQL of statement "c<i>" on `conn` */
  int nprepared;
  int notify; /* store_options_t.notify */
  /* store_options_t.announce (without notify): presence changes go there
   * after their COMMIT; `pending` is the one the open transaction has. */
  store_announce_cb announce;
  void *announce_ud;
  char *pending;
  /* store_options_t.shared, or `own`: connect_failing is set by a failed
   * connect and cleared by a successful one, over every connection that
   * shares it (a pool's workers): an outage is logged once, not once per
   * worker per try. */
  store_shared_t *shared;
  store_shared_t own;
  int guard; /* store_options_t.guard: writes pass their shard's guard (shard_guard) */
} pg_t;

static pg_t *pg(store_t *base) { return container_of(base, pg_t, base); }

#define QUIET_NOTE " (further failures at debug level until a connect succeeds)"

/* ---- messages and errors --------------------------------------------- */

/* Map a failed result (NULL: libpq could not even make one) to -CV_E...,
 * logging the server's message for what becomes -CV_ESTORE or -CV_EINVAL. */
static int result_error(pg_t *s, const PGresult *r, const char *what) {
  const char *state = r != NULL ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
  const char *msg = r != NULL ? PQresultErrorMessage(r) : "";
  char line[512];
  if (msg[0] == '\0') msg = PQerrorMessage(s->conn);
  if (state != NULL) {
    if (strcmp(state, "23505") == 0) return -CV_EEXISTS;   /* unique_violation */
    if (strcmp(state, "23503") == 0) return -CV_ENOTFOUND; /* foreign_key_violation */
    if (strcmp(state, "55P03") == 0 ||                     /* lock_not_available */
        strcmp(state, "57014") == 0 ||                     /* query_canceled (timeout) */
        strcmp(state, "40001") == 0 ||                     /* serialization_failure */
        strcmp(state, "40P01") == 0) {                     /* deadlock_detected */
      log_debug("store: %s: %s", what, pgconn_one_line(msg, line, sizeof line));
      return -CV_EBUSY;
    }
    if (strcmp(state, "53200") == 0) return -CV_ENOMEM; /* out_of_memory */
    if (strncmp(state, "22", 2) == 0) {                 /* data_exception: bad UTF-8, ... */
      log_warn("store: %s: %s", what, pgconn_one_line(msg, line, sizeof line));
      return -CV_EINVAL;
    }
  }
  log_error("store: %s: %s", what, pgconn_one_line(msg, line, sizeof line));
  return -CV_ESTORE;
}

/* Close the connection: whatever the server had not committed is rolled
 * back, and the next call connects again (conn_ready). */
static void drop_conn(pg_t *s) {
  PQfinish(s->conn);
  s->conn = NULL;
}

/* The error of a call whose connection is gone: -CV_ETIMEDOUT when it was
 * given up at the caller's deadline, else -CV_ESTORE. */
static int gone_error(const pg_t *s) { return s->base.deadline_hit ? -CV_ETIMEDOUT : -CV_ESTORE; }

/* Before sending: 1 when the caller's deadline (store_set_deadline) has
 * passed. Then nothing is sent, and a transaction still open is ended by
 * closing the connection (its statements would all be refused too). */
static int past_deadline(pg_t *s) {
  if (s->base.deadline_ms == 0 || util_mono_ms() < s->base.deadline_ms) return 0;
  s->base.deadline_hit = 1;
  if (s->conn != NULL && PQtransactionStatus(s->conn) != PQTRANS_IDLE) {
    log_debug("store: the deadline passed inside a transaction; closing the connection");
    drop_conn(s);
  }
  return 1;
}

/* The answer to the statement sent last, waited for at most until the
 * statement timeout plus ANSWER_MARGIN_MS, or until the caller's deadline
 * when that comes first: the server's statement_timeout ends any statement
 * it runs, but not a server that is stopped or a network that drops
 * everything; this bounds those too. On expiry the connection is closed
 * (the next call reconnects; gone_error says why) and NULL is returned. */
static PGresult *wait_result(pg_t *s) {
  uint64_t start = util_mono_ms();
  uint64_t deadline = start + (uint64_t)s->stmt_timeout_ms + ANSWER_MARGIN_MS;
  int by_deadline = s->base.deadline_ms != 0 && s->base.deadline_ms < deadline;
  if (by_deadline) deadline = s->base.deadline_ms;
  PGresult *last = NULL;
  for (;;) {
    while (!PQisBusy(s->conn)) {
      PGresult *r = PQgetResult(s->conn);
      if (r == NULL) return last; /* every result read */
      PQclear(last);
      last = r;
    }
    uint64_t now = util_mono_ms();
    if (now >= deadline) break;
    struct pollfd p = {.fd = PQsocket(s->conn), .events = POLLIN};
    int k = poll(&p, 1, (int)(deadline - now));
    if (k < 0 && errno != EINTR) break;
    if (k > 0 && !PQconsumeInput(s->conn)) break; /* the connection failed */
  }
  PQclear(last);
  uint64_t waited = util_mono_ms() - start;
  if (by_deadline && util_mono_ms() >= deadline) {
    s->base.deadline_hit = 1;
    log_warn("store: no answer from the database within %llu ms, at the deadline; reconnecting",
             (unsigned long long)waited);
  } else {
    log_error("store: no answer from the database within %llu ms; reconnecting",
              (unsigned long long)waited);
  }
  drop_conn(s);
  return NULL;
}

/* Run one statement with `n` text parameters. 0 with the result in *out
 * (caller PQclears; out NULL: discarded), or a -CV_E... (logged). */
/* The name of `sql`'s prepared statement on this connection ("c<i>" in
 * `name`), preparing it first if it is new: the statements are the SQL_*
 * constants, identified by address, so each is parsed and planned once
 * per connection instead of on every call. 0, 1 when the cache is full
 * (run it unnamed), or a -CV_E... */
static int prepared(pg_t *s, const char *what, const char *sql, int n, char name[16]) {
  for (int i = 0; i < s->nprepared; i++)
    if (s->prepared[i] == sql) {
      snprintf(name, 16, "c%d", i);
      return 0;
    }
  if (s->nprepared == PREPARED_MAX) return 1;
  snprintf(name, 16, "c%d", s->nprepared);
  PGresult *r = NULL;
  if (PQsendPrepare(s->conn, name, sql, n, NULL)) r = wait_result(s);
  if (s->conn == NULL) return gone_error(s); /* no answer in time: closed above */
  int err = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : result_error(s, r, what);
  PQclear(r);
  if (!err) s->prepared[s->nprepared++] = sql;
  return err;
}

static int run(pg_t *s, const char *what, const char *sql, int n, const char *const *params,
               PGresult **out) {
  if (out != NULL) *out = NULL;
  PGresult *r = NULL;
  char name[16];
  if (past_deadline(s)) return -CV_ETIMEDOUT;
  int p = prepared(s, what, sql, n, name);
  if (p < 0) return p;
  if (p == 0 ? PQsendQueryPrepared(s->conn, name, n, params, NULL, NULL, 0)
             : PQsendQueryParams(s->conn, sql, n, NULL, params, NULL, NULL, 0))
    r = wait_result(s);
  if (s->conn == NULL) return gone_error(s); /* no answer in time: closed above */
  ExecStatusType st = PQresultStatus(r);
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
    if (out != NULL)
      *out = r;
    else
      PQclear(r);
    return 0;
  }
  int err = result_error(s, r, what);
  PQclear(r);
  return err;
}

/* A migration script: constant SQL, several statements, no parameters. */
static int run_script(pg_t *s, const char *what, const char *sql) {
  PGresult *r = PQexec(s->conn, sql);
  int err = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : result_error(s, r, what);
  PQclear(r);
  return err;
}

static void fmt_i64(char buf[24], int64_t v) { snprintf(buf, 24, "%" PRId64, v); }

static int64_t get_i64(const PGresult *r, int row, int col) {
  return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* ---- connection ------------------------------------------------------- */

/* Connect, within the connect timeout or until the caller's deadline when
 * that comes first (a deadline already passed: -CV_ETIMEDOUT, nothing
 * tried), and apply the session settings. */
static int connect_db(pg_t *s) {
  char why[512], url[512];
  int timeout_ms = s->connect_timeout_ms, by_deadline = 0;
  if (s->base.deadline_ms != 0) {
    uint64_t now = util_mono_ms();
    if (now >= s->base.deadline_ms) {
      s->base.deadline_hit = 1;
      return -CV_ETIMEDOUT;
    }
    if (s->base.deadline_ms - now < (uint64_t)timeout_ms) {
      timeout_ms = (int)(s->base.deadline_ms - now);
      by_deadline = 1;
    }
  }
  PGconn *c = pgconn_connect(s->url, "converger", timeout_ms, why, sizeof why);
  if (c == NULL) {
    /* Every worker fails during an outage, each every RECONNECT_PAUSE_MS:
     * the first failure is an error, the rest until a success are debug. */
    int first = atomic_exchange(&s->shared->connect_failing, 1) == 0;
    dburl_redact(s->url, url, sizeof url);
    log_write(first ? LOG_ERROR : LOG_DEBUG, "store: cannot connect to %s: %s%s", url, why,
              first ? QUIET_NOTE : "");
    if (by_deadline && util_mono_ms() >= s->base.deadline_ms) {
      s->base.deadline_hit = 1;
      return -CV_ETIMEDOUT;
    }
    return -CV_ESTORE;
  }
  if (atomic_exchange(&s->shared->connect_failing, 0))
    log_info("store: connected to the database again");
  PQsetNoticeProcessor(c, pgconn_notice, NULL);
  s->conn = c;
  s->nprepared = 0; /* a new session has none */

  char lock[24], stmt[24], idle[24];
  const char *const params[] = {lock, stmt, idle};
  fmt_i64(lock, s->lock_timeout_ms);
  s->stmt_timeout_ms =
      STATEMENT_TIMEOUT_MS > s->lock_timeout_ms ? STATEMENT_TIMEOUT_MS : s->lock_timeout_ms + 1000;
  fmt_i64(stmt, s->stmt_timeout_ms);
  fmt_i64(idle, IDLE_IN_TX_TIMEOUT_MS);
  int err = run(s, "session settings",
                "SELECT set_config('lock_timeout', $1, false),"
                " set_config('statement_timeout', $2, false),"
                " set_config('idle_in_transaction_session_timeout', $3, false),"
                /* the group commit is one statement outside BEGIN: READ
                 * COMMITTED, like every append, whatever the database says */
                " set_config('default_transaction_isolation', 'read committed', false)",
                3, params, NULL);
  if (err) drop_conn(s);
  return err;
}

/* Before every op: a usable connection, or an error. See the header. */
static int conn_ready(pg_t *s) {
  char line[512];
  if (s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK) {
    if (PQtransactionStatus(s->conn) != PQTRANS_IDLE) return 0;
    /* Idle, so the server has nothing to say unless it is saying goodbye
     * (or a notice): only then is there anything to read. A goodbye is an
     * error message (libpq hands it to pgconn_notice) and then the end of the
     * stream, which libpq notices on a later read: read while readable, a
     * few times at most. */
    for (int i = 0; i < 4; i++) {
      struct pollfd p = {.fd = PQsocket(s->conn), .events = POLLIN};
      if (poll(&p, 1, 0) <= 0) return 0;
      if (!PQconsumeInput(s->conn) || PQstatus(s->conn) != CONNECTION_OK) break;
    }
    if (PQstatus(s->conn) == CONNECTION_OK) return 0;
    log_warn("store: connection lost: %s",
             pgconn_one_line(PQerrorMessage(s->conn), line, sizeof line));
  }
  if (s->in_read) {
    if (s->base.deadline_hit) return -CV_ETIMEDOUT; /* closed at the deadline, not lost */
    log_error("store: connection lost inside a read transaction");
    return -CV_ESTORE;
  }
  drop_conn(s);
  /* A database that just refused or did not answer is not asked again at
   * once by every call: each would pay the connect timeout. (An attempt
   * cut short by the caller's deadline says less: no pause after it.) */
  uint64_t now = util_mono_ms();
  if (now < s->retry_after) return -CV_ESTORE;
  int err = connect_db(s);
  if (err && err != -CV_ETIMEDOUT) s->retry_after = now + RECONNECT_PAUSE_MS;
  return err;
}

/* ---- transactions ----------------------------------------------------- */

static int tx_begin(pg_t *s, const char *sql) {
  if (PQtransactionStatus(s->conn) != PQTRANS_IDLE) {
    log_error("store: %s: a transaction is already open", sql);
    return -CV_ESTORE;
  }
  return run(s, "begin", sql, 0, NULL, NULL);
}

static int tx_commit(pg_t *s) {
  PGresult *r = NULL;
  int err = run(s, "commit", "COMMIT", 0, NULL, &r);
  if (err) return err;
  /* COMMIT of a transaction that failed answers "ROLLBACK", not an error:
   * never report that as committed. */
  if (strcmp(PQcmdStatus(r), "COMMIT") != 0) {
    log_error("store: commit: the transaction was rolled back");
    err = -CV_ESTORE;
  }
  PQclear(r);
  return err;
}

/* Roll back whatever is still open and return `err`, the first failure. A
 * broken connection has nothing to roll back: the server did it. */
static int tx_rollback(pg_t *s, int err) {
  PGTransactionStatusType t = PQtransactionStatus(s->conn);
  if (t == PQTRANS_INTRANS || t == PQTRANS_INERROR)
    (void)run(s, "rollback", "ROLLBACK", 0, NULL, NULL);
  return err;
}

/* ---- a sharded cluster's shard guard (migration 9) -------------------- */

#define SQL_SHARD_GUARD "SELECT converger_shard_guard($1::integer)"

/* In the open transaction, with the guard on (store_options_t.guard):
 * conversation `conv`'s logical shard is neither frozen by a move
 * (-CV_ESHARD: retry after the hint) nor moved away from this instance
 * (-CV_EMOVED: the router reads the map again); its advisory lock is then
 * held shared until COMMIT, so a move waits for this transaction. 0 at
 * once without the guard (one database: no statement). */
static int shard_guard(pg_t *s, const char *conv) {
  if (!s->guard) return 0;
  char k[24];
  const char *p = k;
  PGresult *r = NULL;
  fmt_i64(k, shard_of(conv));
  int err = run(s, "shard guard", SQL_SHARD_GUARD, 1, &p, &r);
  if (err) return err;
  int64_t g = get_i64(r, 0, 0);
  PQclear(r);
  return g == 1 ? -CV_ESHARD : g == 2 ? -CV_EMOVED : 0;
}

/* ---- row copies ------------------------------------------------------- */

/* Columns from `col`: seq, id, sender, body, ts_ms, and the epoch when
 * there is one more. */
static int msg_fill(const PGresult *r, int row, int col, store_msg_t *m) {
  m->seq = get_i64(r, row, col);
  store_copy_str(m->id, sizeof m->id, PQgetvalue(r, row, col + 1));
  m->sender = strdup(PQgetvalue(r, row, col + 2));
  m->body = strdup(PQgetvalue(r, row, col + 3));
  m->ts_ms = get_i64(r, row, col + 4);
  if (PQnfields(r) > col + 5)
    store_copy_str(m->epoch, sizeof m->epoch, PQgetvalue(r, row, col + 5));
  if (m->sender == NULL || m->body == NULL) {
    store_msg_clear(m);
    return -CV_ENOMEM;
  }
  return 0;
}

/* Columns: id, name, presence, active, signals. */
static void channel_fill(const PGresult *r, store_channel_t *c) {
  store_copy_str(c->id, sizeof c->id, PQgetvalue(r, 0, 0));
  store_copy_str(c->name, sizeof c->name, PQgetvalue(r, 0, 1));
  c->presence = get_i64(r, 0, 2) != 0;
  c->active = get_i64(r, 0, 3) != 0;
  c->signals = get_i64(r, 0, 4) != 0;
}

/* Columns: id, channel, head, active, presence, epoch, signals. */
/* SQL_CONV_GET's columns, from column `c` of row 0. */
static void conv_fill_at(const PGresult *r, int c, store_conv_t *v) {
  store_copy_str(v->id, sizeof v->id, PQgetvalue(r, 0, c));
  store_copy_str(v->channel, sizeof v->channel, PQgetvalue(r, 0, c + 1));
  v->head = get_i64(r, 0, c + 2);
  v->channel_active = get_i64(r, 0, c + 3) != 0;
  v->presence = get_i64(r, 0, c + 4) != 0;
  store_copy_str(v->epoch, sizeof v->epoch, PQgetvalue(r, 0, c + 5));
  v->signals = get_i64(r, 0, c + 6) != 0;
}

static void conv_fill(const PGresult *r, store_conv_t *v) { conv_fill_at(r, 0, v); }

/* ---- open, close, schema --------------------------------------------- */

static void op_close(store_t *base) {
  pg_t *s = pg(base);
  PQfinish(s->conn); /* NULL is fine */
  free(s->url);
  free(s->pending);
  free(s);
}

static int op_open(const char *url, const store_options_t *opt, store_t **out) {
  int timeout_ms = 0;
  int err = pgconn_timeout_ms(url, &timeout_ms);
  if (err) return err;
  pg_t *s = calloc(1, sizeof *s);
  if (s == NULL) return -CV_ENOMEM;
  s->base.ops = &store_postgres_ops;
  s->connect_timeout_ms = timeout_ms;
  s->lock_timeout_ms = opt->busy_timeout_ms;
  s->notify = opt->notify;
  s->announce = opt->notify ? NULL : opt->announce;
  s->announce_ud = opt->announce_ud;
  s->shared = opt->shared ? opt->shared : &s->own;
  s->guard = opt->guard;
  s->url = strdup(url);
  err = s->url != NULL ? connect_db(s) : -CV_ENOMEM;
  if (err) {
    op_close(&s->base);
    return err;
  }
  *out = &s->base;
  return 0;
}

static int op_migrate(store_t *base) {
  pg_t *s = pg(base);
  int err = conn_ready(s);
  if (err) return err;
  /* Bodies and names are UTF-8 and byte budgets count UTF-8 bytes: a
   * database in another encoding would refuse valid messages. */
  const char *enc = PQparameterStatus(s->conn, "server_encoding");
  if (!enc || strcmp(enc, "UTF8") != 0) {
    log_error("store: the database's encoding is %s; converger needs UTF8 "
              "(CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)",
              enc ? enc : "unknown");
    return -CV_EINVAL;
  }
  if ((err = tx_begin(s, "BEGIN ISOLATION LEVEL READ COMMITTED")) != 0) return err;

  PGresult *r = NULL;
  int64_t cur = 0;
  const char *key = MIGRATE_LOCK_KEY;
  /* One migrator at a time across every node: the others wait here (up to
   * lock_timeout), then find every step applied. Released at COMMIT or
   * ROLLBACK. Taken before CREATE TABLE IF NOT EXISTS, which is not safe
   * against a concurrent twin on its own. */
  err = run(s, "migrate", "SELECT pg_advisory_xact_lock($1)", 1, &key, NULL);
  if (!err)
    err = run(s, "migrate",
              "CREATE TABLE IF NOT EXISTS schema_version ("
              " version INTEGER PRIMARY KEY,"
              " applied_at TEXT NOT NULL DEFAULT (to_char(clock_timestamp() AT TIME ZONE 'UTC',"
              " 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')))",
              0, NULL, NULL);
  if (!err)
    err = run(s, "migrate", "SELECT coalesce(max(version), 0) FROM schema_version", 0, NULL, &r);
  if (!err) {
    cur = get_i64(r, 0, 0);
    PQclear(r);
  }
  if (!err && cur > SCHEMA_VERSION) {
    log_error("store: schema version %lld is newer than this build's %d", (long long)cur,
              SCHEMA_VERSION);
    err = -CV_ESTORE;
  }
  for (int64_t v = cur + 1; !err && v <= SCHEMA_VERSION; v++) {
    char ver[24];
    const char *p = ver;
    fmt_i64(ver, v);
    err = run_script(s, "migrate", migrations[v - 1]);
    if (!err)
      err = run(s, "migrate", "INSERT INTO schema_version (version) VALUES ($1)", 1, &p, NULL);
  }
  if (!err) err = tx_commit(s);
  if (err) return tx_rollback(s, err);
  if (cur < SCHEMA_VERSION)
    log_info("store: schema migrated from version %lld to %d", (long long)cur, SCHEMA_VERSION);
  return 0;
}

static int op_schema_version(store_t *base) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  int err = conn_ready(s);
  if (!err)
    err = run(s, "schema version", "SELECT to_regclass('schema_version') IS NOT NULL", 0, NULL, &r);
  if (err) return err;
  int exists = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  if (!exists) return 0; /* never migrated: version 0 */
  err = run(s, "schema version", "SELECT count(*) FROM schema_version", 0, NULL, &r);
  if (err) return err;
  int n = (int)get_i64(r, 0, 0);
  PQclear(r);
  return n;
}

static int op_read_begin(store_t *base) {
  pg_t *s = pg(base);
  int err = conn_ready(s);
  /* One snapshot for every read until store_read_end; READ ONLY makes an
   * append inside it fail rather than write. */
  if (!err) err = tx_begin(s, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  if (!err) s->in_read = 1;
  return err;
}

static void op_read_end(store_t *base) {
  pg_t *s = pg(base);
  s->in_read = 0;
  if (s->conn != NULL) (void)tx_rollback(s, 0); /* nothing was written */
}

static int op_announce(store_t *base, const char *payload) {
  pg_t *s = pg(base);
  const char *const p[] = {payload};
  int err = conn_ready(s);
  return err ? err
             : run(s, "announce", "SELECT pg_notify('" STORE_NOTIFY_CHANNEL "', $1)", 1, p, NULL);
}

static int op_ping(store_t *base) {
  pg_t *s = pg(base);
  int err = conn_ready(s);
  return err ? err : run(s, "ping", "SELECT 1", 0, NULL, NULL);
}

/* ---- channels --------------------------------------------------------- */

static int op_channel_create(store_t *base, const char *id, const char *name, unsigned flags,
                             store_channel_t *out) {
  pg_t *s = pg(base);
  char now[24];
  int presence = (flags & STORE_CHANNEL_PRESENCE) != 0,
      signals = (flags & STORE_CHANNEL_SIGNALS) != 0;
  const char *const p[] = {id, name, presence ? "1" : "0", now, signals ? "1" : "0"};
  fmt_i64(now, util_now_ms());
  int err = conn_ready(s);
  if (!err) err = run(s, "channel create", SQL_CHANNEL_INSERT, 5, p, NULL);
  if (!err && out != NULL) {
    store_copy_str(out->id, sizeof out->id, id);
    store_copy_str(out->name, sizeof out->name, name);
    out->presence = presence;
    out->signals = signals;
    out->active = 1;
  }
  return err;
}

/* A statement returning at most one channel row: -CV_ENOTFOUND for none. */
static int channel_row(pg_t *s, const char *what, const char *sql, int n, const char *const *p,
                       store_channel_t *out) {
  PGresult *r = NULL;
  int err = conn_ready(s);
  if (!err) err = run(s, what, sql, n, p, &r);
  if (err) return err;
  if (PQntuples(r) == 0)
    err = -CV_ENOTFOUND;
  else if (out != NULL)
    channel_fill(r, out);
  PQclear(r);
  return err;
}

static int op_channel_get(store_t *base, const char *id, store_channel_t *out) {
  return channel_row(pg(base), "channel get", SQL_CHANNEL_GET, 1, &id, out);
}

static int op_channel_set_active(store_t *base, const char *id, int active, store_channel_t *out) {
  const char *const p[] = {id, active ? "1" : "0"};
  pg_t *s = pg(base);
  return channel_row(s, "channel set_active",
                     s->notify ? SQL_CHANNEL_SET_ACTIVE_NOTIFY : SQL_CHANNEL_SET_ACTIVE, 2, p, out);
}

/* ---- conversations ---------------------------------------------------- */

static int op_conv_create(store_t *base, const char *id, const char *channel, store_conv_t *out) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char now[24];
  const char *const p[] = {id, channel, now};
  fmt_i64(now, util_now_ms());
  int err = conn_ready(s);
  if (err) return err;
  if (!s->guard) {
    err = run(s, "conv create", SQL_CONV_INSERT, 3, p, &r);
  } else { /* one transaction that passed the shard's guard */
    err = tx_begin(s, "BEGIN ISOLATION LEVEL READ COMMITTED");
    if (!err) err = shard_guard(s, id);
    if (!err) err = run(s, "conv create", SQL_CONV_INSERT, 3, p, &r);
    if (!err) err = tx_commit(s);
    if (err) {
      PQclear(r);
      err = tx_rollback(s, err);
    }
  }
  if (err) return err;
  if (PQntuples(r) == 0) {
    PQclear(r);
    return -CV_ENOTFOUND; /* no such channel */
  }
  if (out != NULL) {
    store_copy_str(out->id, sizeof out->id, id);
    store_copy_str(out->channel, sizeof out->channel, channel);
    out->head = 0;
    out->presence = get_i64(r, 0, 0) != 0;
    out->channel_active = get_i64(r, 0, 1) != 0;
    store_copy_str(out->epoch, sizeof out->epoch, PQgetvalue(r, 0, 2));
    out->signals = get_i64(r, 0, 3) != 0;
  }
  PQclear(r);
  return 0;
}

static int op_conv_get(store_t *base, const char *id, store_conv_t *out) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  int err = conn_ready(s);
  if (!err && s->guard) {
    char k[24];
    fmt_i64(k, shard_of(id));
    const char *const p[] = {id, k};
    if ((err = run(s, "conv get", SQL_CONV_GET_GUARDED, 2, p, &r)) != 0) return err;
    if (strcmp(PQgetvalue(r, 0, 0), "t") == 0)
      err = -CV_EMOVED;
    else if (PQgetisnull(r, 0, 1))
      err = -CV_ENOTFOUND;
    else if (out != NULL)
      conv_fill_at(r, 1, out);
    PQclear(r);
    return err;
  }
  if (!err) err = run(s, "conv get", SQL_CONV_GET, 1, &id, &r);
  if (err) return err;
  if (PQntuples(r) == 0)
    err = -CV_ENOTFOUND;
  else if (out != NULL)
    conv_fill(r, out);
  PQclear(r);
  return err;
}

/* ---- messages --------------------------------------------------------- */

/* One transaction (READ COMMITTED): lock the conversation's row (and read
 * its epoch), then one statement (SQL_APPEND): a message already stored
 * under (conv, id) is the answer (a retry; looked up after the lock, so a
 * twin append that just committed is seen), else, if the channel is
 * active, head + 1, the insert and the NOTIFY; then COMMIT. Lock first,
 * look up second: looking up before locking would miss a twin committing
 * in between and end in a unique violation instead of its answer. Two
 * round trips under the lock. */
static int op_append(store_t *base, const char *conv, const char *id, const char *sender,
                     const char *body, int64_t ts_ms, store_msg_t *out, int *created) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char *payload = NULL;
  int err = conn_ready(s);
  /* READ COMMITTED whatever the database's default: the lock below then
   * gives each later statement a snapshot that includes its holder's work */
  if (!err) err = tx_begin(s, "BEGIN ISOLATION LEVEL READ COMMITTED");
  if (err) return err;

  int active = 0, found = 0;
  err = shard_guard(s, conv); /* a sharded cluster's instance: before the row lock */
  if (!err) err = run(s, "append lock", SQL_APPEND_LOCK, 1, &conv, &r);
  if (!err) {
    if (PQntuples(r) == 0) {
      err = -CV_ENOTFOUND;
    } else {
      active = get_i64(r, 0, 0) != 0;
      store_copy_str(out->epoch, sizeof out->epoch, PQgetvalue(r, 0, 1));
    }
    PQclear(r);
  }
  /* The payload (store/notify.h) carries the epoch, known only now. */
  if (!err && s->notify &&
      (payload = notify_message_template(conv, out->epoch, id, sender, body, ts_ms)) == NULL)
    err = -CV_ENOMEM;
  int64_t seq = 0;
  if (!err) {
    char ts[24];
    const char *const p[] = {conv, id, sender, body, ts, active ? "true" : "false", payload};
    fmt_i64(ts, ts_ms);
    err = run(s, "append", s->notify ? SQL_APPEND_NOTIFY : SQL_APPEND, s->notify ? 7 : 6, p, &r);
  }
  free(payload);
  if (!err) {
    if (PQntuples(r) == 0) {
      err = active ? -CV_ESTORE : -CV_EINACTIVE; /* active: the row was there, under our lock */
    } else if (get_i64(r, 0, 0) == 1) {
      /* A retry: the first message with this id, unchanged (even if the
       * channel has been deactivated since). */
      found = 1;
      err = msg_fill(r, 0, 1, out);
    } else {
      seq = get_i64(r, 0, 1);
      /* Copy before the commit, so running out of memory is still a
       * rollback and never an acknowledged-but-unreported message. */
      out->sender = strdup(sender);
      out->body = strdup(body);
      if (out->sender == NULL || out->body == NULL) err = -CV_ENOMEM;
    }
    PQclear(r);
  }
  if (!err) err = tx_commit(s);
  if (err) {
    store_msg_clear(out);
    return tx_rollback(s, err);
  }
  if (found) return 0;
  out->seq = seq;
  store_copy_str(out->id, sizeof out->id, id);
  out->ts_ms = ts_ms;
  *created = 1;
  return 0;
}

/* A text[] literal of `n` strings ({"a","b\\"c"}), every element quoted
 * with its backslashes and double quotes escaped; a NULL string is NULL.
 * Heap string, NULL when out of memory. */
static char *array_literal(const char *const *v, size_t n) {
  size_t cap = 3;
  for (size_t i = 0; i < n; i++) cap += v[i] ? 2 * strlen(v[i]) + 3 : 5;
  char *out = malloc(cap), *o = out;
  if (!out) return NULL;
  *o++ = '{';
  for (size_t i = 0; i < n; i++) {
    if (i) *o++ = ',';
    if (!v[i]) {
      memcpy(o, "NULL", 4);
      o += 4;
      continue;
    }
    *o++ = '"';
    for (const char *c = v[i]; *c; c++) {
      if (*c == '"' || *c == '\\') *o++ = '\\';
      *o++ = *c;
    }
    *o++ = '"';
  }
  *o++ = '}';
  *o = '\0';
  return out;
}

#define SQL_APPEND_BATCH                                                                           \
  "SELECT o_k, o_status, o_seq, o_epoch, o_sender, o_body, o_ts FROM converger_append_batch("      \
  "$1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[])"
/* The same behind each item's shard guard (store_options_t.guard,
 * migration 9): $7 the items' logical shards. */
#define SQL_APPEND_BATCH_GUARDED                                                                   \
  "SELECT o_k, o_status, o_seq, o_epoch, o_sender, o_body, o_ts FROM"                              \
  " converger_append_batch_guarded($7::integer[], $1::text[], $2::text[], $3::text[], $4::text[]," \
  " $5::bigint[], $6::text[])"

/* An int[] literal of the logical shards of the items' conversations.
 * Heap string, NULL when out of memory. */
static char *shards_literal(store_append_t *const *items, size_t n) {
  char *out = malloc(n * 5 + 3), *o = out;
  if (!out) return NULL;
  *o++ = '{';
  for (size_t i = 0; i < n; i++) o += sprintf(o, i ? ",%d" : "%d", shard_of(items[i]->conv));
  *o++ = '}';
  *o = '\0';
  return out;
}

/* Group commit (store.h): SQL_APPEND_BATCH, one statement and so one
 * round trip, in its own transaction (READ COMMITTED: connect_db). Its
 * rows are the items in order. A failure of the statement rolls the whole
 * group back; then a lock or deadline failure is every item's, and the
 * others are tried one transaction each (op_append). */
static int op_append_batch(store_t *base, store_append_t *const *items, size_t n) {
  pg_t *s = pg(base);
  int err = conn_ready(s);
  if (!err && PQtransactionStatus(s->conn) != PQTRANS_IDLE) {
    log_error("store: append batch: a transaction is already open");
    err = -CV_ESTORE;
  }
  if (err) {
    for (size_t i = 0; i < n; i++) items[i]->status = err;
    return err;
  }
  const char **col[5];
  char(*ts)[24] = calloc(n, sizeof *ts);
  for (int c = 0; c < 5; c++) col[c] = calloc(n, sizeof(char *));
  char *lit[7] = {0};
  err = ts && col[0] && col[1] && col[2] && col[3] && col[4] ? 0 : -CV_ENOMEM;
  for (size_t i = 0; !err && i < n; i++) {
    col[0][i] = items[i]->conv;
    col[1][i] = items[i]->id;
    col[2][i] = items[i]->sender;
    col[3][i] = items[i]->body;
    fmt_i64(ts[i], items[i]->ts_ms);
    col[4][i] = ts[i];
  }
  char **notes = s->notify && !err ? calloc(n, sizeof *notes) : NULL;
  if (s->notify && !notes) err = -CV_ENOMEM;
  for (size_t i = 0; notes && !err && i < n; i++)
    if (!(notes[i] = notify_message_template(items[i]->conv, NULL, items[i]->id, items[i]->sender,
                                             items[i]->body, items[i]->ts_ms)))
      err = -CV_ENOMEM;
  for (int c = 0; !err && c < 5; c++)
    if (!(lit[c] = array_literal(col[c], n))) err = -CV_ENOMEM;
  if (!err && notes && !(lit[5] = array_literal((const char *const *)notes, n))) err = -CV_ENOMEM;
  if (!err && s->guard && !(lit[6] = shards_literal(items, n))) err = -CV_ENOMEM;
  PGresult *r = NULL;
  if (!err)
    err = run(s, "append batch", s->guard ? SQL_APPEND_BATCH_GUARDED : SQL_APPEND_BATCH,
              s->guard ? 7 : 6, (const char *const *)lit, &r);
  for (size_t i = 0; notes && i < n; i++) free(notes[i]);
  free(notes);
  for (int c = 0; c < 7; c++) free(lit[c]);
  for (int c = 0; c < 5; c++) free(col[c]);
  free(ts);
  if (!err && (size_t)PQntuples(r) != n) {
    log_error("store: append batch: %d rows for %zu items", PQntuples(r), n);
    err = -CV_ESTORE; /* committed or not: the retries below find out by id */
  }
  for (size_t i = 0; !err && i < n; i++) {
    store_append_t *a = items[i];
    int st = (int)get_i64(r, (int)i, 1);
    store_copy_str(a->msg.epoch, sizeof a->msg.epoch, PQgetvalue(r, (int)i, 3));
    if (st == 2 || st == 3) {
      a->status = st == 2 ? -CV_ENOTFOUND : -CV_EINACTIVE;
      continue;
    }
    if (st == 5 || st == 6) { /* its shard's guard: frozen, or moved away */
      a->status = st == 5 ? -CV_ESHARD : -CV_EMOVED;
      continue;
    }
    if (st == 4) { /* the answer of the earlier item with this (conv, id) */
      size_t j = 0;
      while (j < i && (strcmp(items[j]->conv, a->conv) != 0 || strcmp(items[j]->id, a->id) != 0))
        j++;
      if (j == i || items[j]->status != 0 || !items[j]->msg.body) {
        log_error("store: append batch: no earlier item for a repeated id");
        err = -CV_ESTORE;
        break;
      }
      a->msg.seq = items[j]->msg.seq;
      a->msg.ts_ms = items[j]->msg.ts_ms;
      store_copy_str(a->msg.id, sizeof a->msg.id, a->id);
      a->msg.sender = strdup(items[j]->msg.sender);
      a->msg.body = strdup(items[j]->msg.body);
      if (!a->msg.sender || !a->msg.body) {
        store_msg_clear(&a->msg);
        a->status = -CV_ENOMEM;
      }
      continue;
    }
    a->msg.seq = get_i64(r, (int)i, 2);
    store_copy_str(a->msg.id, sizeof a->msg.id, a->id);
    a->msg.sender = strdup(st == 1 ? PQgetvalue(r, (int)i, 4) : a->sender);
    a->msg.body = strdup(st == 1 ? PQgetvalue(r, (int)i, 5) : a->body);
    a->msg.ts_ms = st == 1 ? get_i64(r, (int)i, 6) : a->ts_ms;
    a->created = st == 0;
    if (!a->msg.sender || !a->msg.body) {
      /* committed: the caller's retry with this id gets the message */
      store_msg_clear(&a->msg);
      a->created = 0;
      a->status = -CV_ENOMEM;
    }
  }
  PQclear(r);
  if (!err) return 0;
  for (size_t i = 0; i < n; i++) {
    store_msg_clear(&items[i]->msg);
    memset(&items[i]->msg, 0, sizeof items[i]->msg);
    items[i]->created = 0;
    items[i]->status = err;
  }
  if (err == -CV_EBUSY || err == -CV_ETIMEDOUT) return err;
  return store_append_each(base, items, n);
}

static int op_replay(store_t *base, const char *conv, int64_t after, int64_t upto, int limit,
                     size_t max_bytes, store_msg_t **msgs, size_t *n) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char a[24], u[24], l[24], b[24];
  const char *const p[] = {conv, a, u, l, b};
  fmt_i64(a, after);
  fmt_i64(u, upto);
  fmt_i64(l, limit);
  fmt_i64(b, max_bytes == 0 || max_bytes > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max_bytes);
  int err = conn_ready(s);
  if (!err) err = run(s, "replay", SQL_REPLAY, 5, p, &r);
  if (err) return err;

  size_t len = (size_t)PQntuples(r);
  store_msg_t *v = NULL;
  if (len > 0 && (v = calloc(len, sizeof *v)) == NULL) err = -CV_ENOMEM;
  for (size_t i = 0; !err && i < len; i++) err = msg_fill(r, (int)i, 0, &v[i]);
  PQclear(r);
  /* An empty page is either "nothing new" or "no such conversation". */
  if (!err && len == 0) {
    err = run(s, "replay", SQL_CONV_EXISTS, 1, &conv, &r);
    if (!err) {
      if (PQntuples(r) == 0) err = -CV_ENOTFOUND;
      PQclear(r);
    }
  }
  if (err) {
    store_msgs_free(v, len); /* calloc'd: unfilled entries are empty */
    return err;
  }
  *msgs = v;
  *n = len;
  return 0;
}

/* ---- epochs ----------------------------------------------------------- */

static int op_epoch_rotate(store_t *base, const char *conv, int64_t *count) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  const char *p = conv; /* NULL: a NULL parameter, every conversation */
  int err = conn_ready(s);
  if (err) return err;
  if (!s->guard || conv == NULL) { /* every conversation: not guarded (docs/operations.md) */
    err = run(s, "epoch rotate", SQL_EPOCH_ROTATE, 1, &p, &r);
  } else { /* one transaction that passed the shard's guard */
    err = tx_begin(s, "BEGIN ISOLATION LEVEL READ COMMITTED");
    if (!err) err = shard_guard(s, conv);
    if (!err) err = run(s, "epoch rotate", SQL_EPOCH_ROTATE, 1, &p, &r);
    if (!err) err = tx_commit(s);
    if (err) {
      PQclear(r);
      err = tx_rollback(s, err);
    }
  }
  if (err) return err;
  *count = strtoll(PQcmdTuples(r), NULL, 10);
  PQclear(r);
  return conv != NULL && *count == 0 ? -CV_ENOTFOUND : 0;
}

/* ---- revocations ------------------------------------------------------ */

static int op_revoke(store_t *base, const char *jti, int64_t exp_s) {
  pg_t *s = pg(base);
  char e[24];
  const char *const p[] = {jti, e};
  fmt_i64(e, exp_s);
  int err = conn_ready(s);
  return err ? err : run(s, "revoke", SQL_REVOKE, 2, p, NULL);
}

static int op_revocations(store_t *base, int64_t now_s, char ***jtis, size_t *n) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char now[24];
  const char *p = now;
  fmt_i64(now, now_s);
  int err = conn_ready(s);
  if (!err) err = run(s, "revocations", SQL_REVOCATIONS, 1, &p, &r);
  if (err) return err;
  size_t len = (size_t)PQntuples(r);
  char **v = NULL;
  if (len > 0 && (v = calloc(len, sizeof *v)) == NULL) err = -CV_ENOMEM;
  for (size_t i = 0; !err && i < len; i++)
    if ((v[i] = strdup(PQgetvalue(r, (int)i, 0))) == NULL) err = -CV_ENOMEM;
  PQclear(r);
  if (err) {
    store_strings_free(v, len); /* calloc'd: the rest are NULL */
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
  pg_t *s = pg(base);
  char c[24], w[24], t[24], k[24];
  const char *const p[] = {id, public_url, state, c, w, t, k, admin_url};
  fmt_i64(c, connections);
  fmt_i64(w, waiters);
  fmt_i64(t, now_ms);
  fmt_i64(k, capacity);
  int err = conn_ready(s);
  return err ? err : run(s, "node beat", SQL_NODE_BEAT, 8, p, NULL);
}

static int op_nodes_live(store_t *base, int64_t since_ms, store_node_t **out, size_t *n) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char since[24];
  const char *p = since;
  fmt_i64(since, since_ms);
  int err = conn_ready(s);
  if (!err) err = run(s, "nodes live", SQL_NODES_LIVE, 1, &p, &r);
  if (err) return err;
  size_t len = (size_t)PQntuples(r);
  store_node_t *v = NULL;
  if (len > 0 && (v = calloc(len, sizeof *v)) == NULL) {
    PQclear(r);
    return -CV_ENOMEM;
  }
  for (size_t i = 0; i < len; i++) {
    int row = (int)i;
    store_copy_str(v[i].id, sizeof v[i].id, PQgetvalue(r, row, 0));
    store_copy_str(v[i].public_url, sizeof v[i].public_url, PQgetvalue(r, row, 1));
    store_copy_str(v[i].state, sizeof v[i].state, PQgetvalue(r, row, 2));
    v[i].connections = get_i64(r, row, 3);
    v[i].waiters = get_i64(r, row, 4);
    v[i].updated_ms = get_i64(r, row, 5);
    v[i].capacity = get_i64(r, row, 6);
    store_copy_str(v[i].admin_url, sizeof v[i].admin_url, PQgetvalue(r, row, 7));
  }
  PQclear(r);
  *out = v;
  *n = len;
  return 0;
}

/* ---- presence --------------------------------------------------------- */

/* A user's clients of one conversation are counted under this lock (its
 * first and its last), taken before any row lock, by join and leave alike,
 * so the two cannot deadlock. */
#define SQL_PRESENCE_LOCK "SELECT pg_advisory_xact_lock(hashtextextended($1 || ' ' || $2, 0))"
/* One row per node through which the client is present: a client that
 * holds connections on two nodes (two tabs sharing a stored clientId, a
 * drain move) is present while either row is, and since its first row's
 * time. The subqueries read the snapshot from before the statement: the
 * client's and the user's rows before this one. */
#define SQL_PRESENCE_INSERT                                                                        \
  "WITH ins AS (INSERT INTO presence (conv, client, user_id, node_id, since_ms)"                   \
  " SELECT $1, $2, $3, $4, COALESCE((SELECT min(since_ms) FROM presence"                           \
  " WHERE conv = $1 AND user_id = $3 AND client = $2), $5::bigint)"                                \
  " ON CONFLICT DO NOTHING RETURNING 1)"                                                           \
  " SELECT (SELECT count(*) FROM ins),"                                                            \
  " (SELECT count(*) FROM presence WHERE conv = $1 AND user_id = $3 AND client = $2),"             \
  " (SELECT count(*) FROM presence WHERE conv = $1 AND user_id = $3)"
#define SQL_PRESENCE_DELETE                                                                        \
  "DELETE FROM presence WHERE conv = $1 AND client = $2 AND node_id = $3 AND user_id = $4"         \
  " RETURNING 1"
/* After a delete: the client's rows left, and the user's. */
#define SQL_PRESENCE_LEFT                                                                          \
  "SELECT count(*) FILTER (WHERE client = $2), count(*) FROM presence"                             \
  " WHERE conv = $1 AND user_id = $3"
#define SQL_PRESENCE_NOTIFY "SELECT pg_notify('" STORE_NOTIFY_CHANNEL "', $1)"
#define SQL_PRESENCE_PAGE                                                                          \
  "SELECT user_id, n, since, rank FROM (SELECT user_id, count(DISTINCT client) AS n,"              \
  " min(since_ms) AS since, row_number() OVER (ORDER BY user_id) AS rank FROM presence"            \
  " WHERE conv = $1 GROUP BY user_id) u WHERE user_id > $2 ORDER BY user_id LIMIT $3"
#define SQL_PRESENCE_USERS "SELECT count(DISTINCT user_id) FROM presence WHERE conv = $1"
/* The rows of every node whose heartbeat is older than $1 (through the
 * node_id index: only those rows are read). A client whose last row went
 * leaves, announced in the same statement; of a user's clients that left
 * one conversation, the last in client order carries the user's edge when
 * no row of the user stays. The outer query sees the rows from before the
 * DELETE: what stays is what it counts less what `d` took. Not under the
 * users' locks: a join elsewhere at the same moment may be told as no
 * user's first (docs/operations.md, "Presence"). */
#define SQL_PRESENCE_GONE                                                                          \
  "WITH d AS (DELETE FROM presence WHERE node_id IN"                                               \
  " (SELECT id FROM nodes WHERE updated_ms < $1) RETURNING conv, client, "                         \
  "user_id)," SQL_PRESENCE_GONE_TAIL
#define SQL_PRESENCE_GONE_TAIL                                                                     \
  " k AS (SELECT conv, user_id, client, count(*) AS n FROM d GROUP BY conv, user_id, client),"     \
  " e AS (SELECT k.conv, k.user_id, k.client,"                                                     \
  "  (SELECT count(*) FROM presence q WHERE q.conv = k.conv AND q.user_id = k.user_id"             \
  "   AND q.client = k.client) - k.n AS client_rows,"                                              \
  "  (SELECT count(*) FROM presence q WHERE q.conv = k.conv AND q.user_id = k.user_id)"            \
  "  - (SELECT count(*) FROM d d2 WHERE d2.conv = k.conv AND d2.user_id = k.user_id)"              \
  "   AS user_rows FROM k),"                                                                       \
  " g AS (SELECT e.*, (e.user_rows = 0 AND e.client = (SELECT max(e2.client) FROM e e2"            \
  "  WHERE e2.conv = e.conv AND e2.user_id = e.user_id AND e2.client_rows = 0))::int AS edge"      \
  "  FROM e WHERE e.client_rows = 0)"
#define SQL_PRESENCE_SWEEP                                                                         \
  SQL_PRESENCE_GONE                                                                                \
  " SELECT (SELECT count(*) FROM d), count(pg_notify('" STORE_NOTIFY_CHANNEL                       \
  "', 'p l ' || g.conv || ' ' || g.client || ' ' || g.edge || ' ' || g.user_id))"                  \
  " FROM g"
#define SQL_PRESENCE_SWEEP_QUIET SQL_PRESENCE_GONE " SELECT (SELECT count(*) FROM d), 0"
/* The rows of the nodes named in $1 (a sharded cluster's instance: the
 * membership rows are in the control database): as SQL_PRESENCE_GONE, and
 * the leaves' payloads as rows for the announce callback, after a first
 * row with the count (k = 0). */
#define SQL_PRESENCE_GONE_IN                                                                       \
  "WITH d AS (DELETE FROM presence WHERE node_id = ANY ($1::text[])"                               \
  " RETURNING conv, client, user_id)," SQL_PRESENCE_GONE_TAIL
#define SQL_PRESENCE_SWEEP_ROWS                                                                    \
  SQL_PRESENCE_GONE_IN " SELECT 0 AS k, (SELECT count(*) FROM d)::text UNION ALL"                  \
                       " SELECT 1, 'p l ' || g.conv || ' ' || g.client || ' ' || g.edge || ' ' ||" \
                       " g.user_id FROM g"
#define SQL_NODES_GONE       "SELECT id FROM nodes WHERE updated_ms < $1 ORDER BY id"
#define SQL_PRESENCE_OF_NODE "SELECT conv, client, user_id FROM presence WHERE node_id = $1"

/* The payload of a presence change, announced in the open transaction
 * (NOTIFY), or kept for the announce callback after its COMMIT
 * (presence_tx_end). */
static int presence_announce(pg_t *s, int join, const char *conv, const char *client, int edge,
                             const char *user) {
  if (!s->notify && !s->announce) return 0;
  char *payload = notify_presence(join, conv, client, edge, user);
  if (!payload) return -CV_ENOMEM;
  if (!s->notify) {
    free(s->pending);
    s->pending = payload;
    return 0;
  }
  const char *const p[] = {payload};
  int err = run(s, "presence notify", SQL_PRESENCE_NOTIFY, 1, p, NULL);
  free(payload);
  return err;
}

/* BEGIN, and the user's lock in `conv` (SQL_PRESENCE_LOCK). A failure
 * after BEGIN is rolled back here. */
static int presence_tx(pg_t *s, const char *conv, const char *user) {
  const char *const lock[] = {conv, user};
  int err = conn_ready(s);
  if (!err) err = tx_begin(s, "BEGIN ISOLATION LEVEL READ COMMITTED");
  if (err) return err;
  err = shard_guard(s, conv);
  if (!err) err = run(s, "presence lock", SQL_PRESENCE_LOCK, 2, lock, NULL);
  return err ? tx_rollback(s, err) : 0;
}

/* COMMIT what presence_tx began, or, after a failure `err`, ROLLBACK:
 * 0 or the first failure. */
static int presence_tx_end(pg_t *s, int err) {
  if (!err) err = tx_commit(s);
  if (!err && s->pending) s->announce(s->announce_ud, s->pending);
  free(s->pending);
  s->pending = NULL;
  return err ? tx_rollback(s, err) : 0;
}

static int op_presence_join(store_t *base, const char *conv, const char *client, const char *user,
                            const char *node, int64_t since_ms, int *joined, int *first) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char since[24];
  fmt_i64(since, since_ms);
  const char *const p[] = {conv, client, user, node, since};
  int err = presence_tx(s, conv, user);
  if (err) return err;
  err = run(s, "presence join", SQL_PRESENCE_INSERT, 5, p, &r);
  if (!err) {
    /* a row of its own, and none of the client's before: it joins */
    *joined = get_i64(r, 0, 0) == 1 && get_i64(r, 0, 1) == 0;
    *first = *joined && get_i64(r, 0, 2) == 0;
    PQclear(r);
    if (*joined) err = presence_announce(s, 1, conv, client, *first, user);
  }
  if ((err = presence_tx_end(s, err)) != 0) *joined = *first = 0;
  return err;
}

static int op_presence_leave(store_t *base, const char *conv, const char *client, const char *user,
                             const char *node, int *left, int *last) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  const char *const p[] = {conv, client, node, user};
  const char *const q[] = {conv, client, user};
  int err = presence_tx(s, conv, user);
  if (err) return err;
  err = run(s, "presence leave", SQL_PRESENCE_DELETE, 4, p, &r);
  int deleted = 0;
  if (!err) {
    deleted = PQntuples(r) == 1;
    PQclear(r);
  }
  if (!err && deleted) { /* it leaves when no other node holds it */
    err = run(s, "presence left", SQL_PRESENCE_LEFT, 3, q, &r);
    if (!err) {
      *left = get_i64(r, 0, 0) == 0;
      *last = *left && get_i64(r, 0, 1) == 0;
      PQclear(r);
      if (*left) err = presence_announce(s, 0, conv, client, *last, user);
    }
  }
  if ((err = presence_tx_end(s, err)) != 0) *left = *last = 0;
  return err;
}

static int op_presence_list(store_t *base, const char *conv, const char *after, int limit,
                            store_member_t **out, size_t *n, int64_t *count) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char lim[24];
  fmt_i64(lim, limit);
  const char *const p[] = {conv, after, lim};
  int own = !s->in_read; /* one snapshot for the page and the count */
  int err = conn_ready(s);
  if (!err && own) err = tx_begin(s, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  if (err) return err;
  if (limit > 0) err = run(s, "presence page", SQL_PRESENCE_PAGE, 3, p, &r);
  if (!err && r) {
    size_t len = (size_t)PQntuples(r);
    if (len > 0 && (*out = calloc(len, sizeof **out)) == NULL) err = -CV_ENOMEM;
    for (size_t i = 0; !err && i < len; i++) {
      store_copy_str((*out)[i].user, sizeof(*out)[i].user, PQgetvalue(r, (int)i, 0));
      (*out)[i].clients = get_i64(r, (int)i, 1);
      (*out)[i].since_ms = get_i64(r, (int)i, 2);
      (*out)[i].rank = get_i64(r, (int)i, 3);
    }
    if (!err) *n = len;
    PQclear(r);
  }
  if (!err) err = run(s, "presence count", SQL_PRESENCE_USERS, 1, p, &r);
  if (!err) {
    *count = get_i64(r, 0, 0);
    PQclear(r);
  }
  if (own) (void)tx_rollback(s, 0);
  if (err) {
    free(*out);
    *out = NULL;
    *n = 0;
  }
  return err;
}

static int op_presence_sweep(store_t *base, int64_t since_ms, int64_t *removed) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char since[24];
  const char *p = since;
  fmt_i64(since, since_ms);
  int err = conn_ready(s);
  if (!err)
    err = run(s, "presence sweep", s->notify ? SQL_PRESENCE_SWEEP : SQL_PRESENCE_SWEEP_QUIET, 1, &p,
              &r);
  if (err) return err;
  *removed = get_i64(r, 0, 0);
  PQclear(r);
  return 0;
}

static int op_presence_sweep_nodes(store_t *base, char *const *nodes, size_t n, int64_t *removed) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char *list = array_literal((const char *const *)nodes, n);
  if (!list) return -CV_ENOMEM;
  const char *p = list;
  int err = conn_ready(s);
  if (!err) err = run(s, "presence sweep", SQL_PRESENCE_SWEEP_ROWS, 1, &p, &r);
  free(list);
  if (err) return err;
  for (int i = 0; i < PQntuples(r); i++) {
    const char *v = PQgetvalue(r, i, 1);
    if (strcmp(PQgetvalue(r, i, 0), "0") == 0)
      *removed = strtoll(v, NULL, 10);
    else if (s->announce) /* committed: the statement was its own transaction */
      s->announce(s->announce_ud, v);
  }
  PQclear(r);
  return 0;
}

static int op_nodes_gone(store_t *base, int64_t since_ms, char ***ids, size_t *n) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char since[24];
  const char *p = since;
  fmt_i64(since, since_ms);
  int err = conn_ready(s);
  if (!err) err = run(s, "nodes gone", SQL_NODES_GONE, 1, &p, &r);
  if (err) return err;
  size_t len = (size_t)PQntuples(r);
  char **v = len ? calloc(len, sizeof *v) : NULL;
  if (len && !v) err = -CV_ENOMEM;
  for (size_t i = 0; !err && i < len; i++)
    if (!(v[i] = strdup(PQgetvalue(r, (int)i, 0)))) err = -CV_ENOMEM;
  PQclear(r);
  if (err) {
    store_strings_free(v, len);
    return err;
  }
  *ids = v;
  *n = len;
  return 0;
}

/* ---- the shard map (control database) --------------------------------- */

#define SQL_SHARD_INSTANCES       "SELECT id, url FROM shard_instances ORDER BY id"
#define SQL_SHARD_MAP             "SELECT shard, instance FROM shard_map ORDER BY shard"
#define SQL_SHARD_VERSION         "SELECT version FROM shard_map_version"
#define SQL_SHARD_INSTANCE_INSERT "INSERT INTO shard_instances (id, url) VALUES ($1, $2)"
#define SQL_SHARD_MAP_INSERT                                                                       \
  "INSERT INTO shard_map (shard, instance) SELECT k, k % $1 FROM generate_series(0, 255) AS k"
#define SQL_SHARD_VERSION_INSERT "INSERT INTO shard_map_version (one, version) VALUES (1, 1)"

static int op_shardmap_get(store_t *base, store_shardmap_t *out) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  int own = !s->in_read; /* one snapshot for the three reads */
  int err = conn_ready(s);
  if (!err && own) err = tx_begin(s, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  if (err) return err;
  err = run(s, "shard instances", SQL_SHARD_INSTANCES, 0, NULL, &r);
  if (!err) {
    int rows = PQntuples(r);
    if (rows == 0) err = -CV_ENOTFOUND;
    if (rows > STORE_INSTANCES_MAX) err = -CV_EINVAL;
    for (int i = 0; !err && i < rows; i++) {
      if (get_i64(r, i, 0) != i) { /* ids are 0..n-1 */
        log_error("store: the shard map's instances are not numbered 0..%d", rows - 1);
        err = -CV_EINVAL;
      } else if (!(out->urls[i] = strdup(PQgetvalue(r, i, 1)))) {
        err = -CV_ENOMEM;
      } else {
        out->n = i + 1;
      }
    }
    PQclear(r);
  }
  if (!err) err = run(s, "shard map", SQL_SHARD_MAP, 0, NULL, &r);
  if (!err) {
    int rows = PQntuples(r);
    if (rows != 256) {
      log_error("store: the shard map has %d logical shards, not 256", rows);
      err = -CV_EINVAL;
    }
    for (int i = 0; !err && i < rows; i++) {
      int64_t inst = get_i64(r, i, 1);
      if (get_i64(r, i, 0) != i || inst < 0 || inst >= out->n)
        err = -CV_EINVAL;
      else
        out->map[i] = (uint8_t)inst;
    }
    PQclear(r);
  }
  if (!err) err = run(s, "shard map version", SQL_SHARD_VERSION, 0, NULL, &r);
  if (!err) {
    out->version = PQntuples(r) == 1 ? get_i64(r, 0, 0) : 0;
    PQclear(r);
  }
  if (own) (void)tx_rollback(s, 0);
  if (err) store_shardmap_clear(out);
  return err;
}

static int op_shardmap_init(store_t *base, const char *const *urls, int n) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  int err = conn_ready(s);
  if (!err) err = tx_begin(s, "BEGIN ISOLATION LEVEL READ COMMITTED");
  if (err) return err;
  /* two inits at once: the second waits, then finds the first's rows */
  err = run(s, "shard map lock", "LOCK TABLE shard_instances IN EXCLUSIVE MODE", 0, NULL, NULL);
  if (!err) err = run(s, "shard instances", SQL_SHARD_INSTANCES, 0, NULL, &r);
  if (!err) {
    if (PQntuples(r) > 0) err = -CV_EEXISTS;
    PQclear(r);
  }
  for (int i = 0; !err && i < n; i++) {
    char id[24];
    fmt_i64(id, i);
    const char *const p[] = {id, urls[i]};
    err = run(s, "shard instance", SQL_SHARD_INSTANCE_INSERT, 2, p, NULL);
  }
  char count[24];
  fmt_i64(count, n);
  const char *cp = count;
  if (!err) err = run(s, "shard map", SQL_SHARD_MAP_INSERT, 1, &cp, NULL);
  if (!err) err = run(s, "shard map version", SQL_SHARD_VERSION_INSERT, 0, NULL, NULL);
  if (!err) err = tx_commit(s);
  return err ? tx_rollback(s, err) : 0;
}

/* The node's row records `used`, and the current version comes back, in
 * one statement (the CTE's UPDATE runs whether or not it is read). */
#define SQL_SHARD_SYNC                                                                             \
  "WITH u AS (UPDATE nodes SET map_version = $2 WHERE id = $1 RETURNING 1)"                        \
  " SELECT coalesce((SELECT version FROM shard_map_version), 0)"

static int op_shardmap_sync(store_t *base, const char *node, int64_t used, int64_t *current) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  char v[24];
  const char *const p[] = {node, v};
  fmt_i64(v, used);
  int err = conn_ready(s);
  if (!err) err = run(s, "shard map sync", SQL_SHARD_SYNC, 2, p, &r);
  if (err) return err;
  *current = get_i64(r, 0, 0);
  PQclear(r);
  return 0;
}

static int op_presence_of_node(store_t *base, const char *node, char ***convs, char ***clients,
                               char ***users, size_t *n) {
  pg_t *s = pg(base);
  PGresult *r = NULL;
  int err = conn_ready(s);
  if (!err) err = run(s, "presence of node", SQL_PRESENCE_OF_NODE, 1, &node, &r);
  if (err) return err;
  size_t len = (size_t)PQntuples(r);
  char **v[3] = {NULL, NULL, NULL};
  for (int k = 0; k < 3 && len > 0 && !err; k++)
    if ((v[k] = calloc(len, sizeof(char *))) == NULL) err = -CV_ENOMEM;
  for (size_t i = 0; !err && i < len; i++)
    for (int k = 0; k < 3 && !err; k++)
      if ((v[k][i] = strdup(PQgetvalue(r, (int)i, k))) == NULL) err = -CV_ENOMEM;
  PQclear(r);
  if (err) {
    for (int k = 0; k < 3; k++) store_strings_free(v[k], len);
    return err;
  }
  *convs = v[0];
  *clients = v[1];
  *users = v[2];
  *n = len;
  return 0;
}

const store_ops_t store_postgres_ops = {
    .name = "postgres",
    .open = op_open,
    .close = op_close,
    .migrate = op_migrate,
    .schema_version = op_schema_version,
    .read_begin = op_read_begin,
    .read_end = op_read_end,
    .ping = op_ping,
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
    .announce = op_announce,
    .presence_join = op_presence_join,
    .presence_leave = op_presence_leave,
    .presence_list = op_presence_list,
    .presence_sweep = op_presence_sweep,
    .presence_sweep_nodes = op_presence_sweep_nodes,
    .nodes_gone = op_nodes_gone,
    .shardmap_get = op_shardmap_get,
    .shardmap_init = op_shardmap_init,
    .shardmap_sync = op_shardmap_sync,
    .presence_of_node = op_presence_of_node,
};
