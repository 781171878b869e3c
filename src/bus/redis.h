/*
 * redis: a sharded cluster's bus on Redis pub/sub (docs/operations.md,
 * "Scaling out"): B redis-server instances, run without persistence; the
 * store stays the truth and the bus carries what a node needs to know now.
 *
 * Channels: conversation `conv` is published on "cvg.m.<conv>" on
 * instance shard_jump(shard_key(conv), B) (core/shard.h), and what
 * concerns every node (channel changes, user controls) on "cvg.c" on
 * every instance. A message is "<tag>\n<payload>" on a conversation's
 * channel and "<tag> <serial>\n<payload>" on the control channel: the
 * publishing process's origin tag (12 random hex digits drawn at start, so
 * a restarted node is another origin; a node drops what it published
 * itself), on the control channel a number that tells one message from
 * another (the same one comes from each instance once), then a payload of
 * store/notify.h, in which a message ("m SEQ CONV ...") names its
 * conversation "." on the conversation's own channel (the channel names
 * it). Kept short: the tag and Redis's framing are all the bus adds to a
 * message (converger_bus_bytes_in_total counts the whole RESP push).
 *
 * Interest routing: a node subscribes to a conversation's channel when
 * its first local subscriber comes (bus_remote_t.interest), in batches of
 * at most REDIS_BUS_BATCH channels per SUBSCRIBE, sent once per turn of the
 * loop, and unsubscribes after its last one leaves. So a node hears only
 * the conversations it serves, whatever the size of the fleet.
 *
 * Nothing heard is trusted to be complete; the gaps are closed from the
 * store (bus/heads.h: the head read, a head hint to the subscribers, who
 * fill what they lack):
 *  - a subscription confirmed by Redis: the head is read once, for what
 *    was committed between the hello's read and the SUBSCRIBE;
 *  - an instance down (refused, broken, or no answer to a PING within
 *    REDIS_BUS_PING_TIMEOUT_MS): its conversations' heads are read every
 *    REDIS_BUS_POLL_MS until it is back; then everything is subscribed
 *    again and read once more;
 *  - a publish that cannot go out (this node's connections to its
 *    instance are down or broken while the subscribers' may be fine) is
 *    kept, up to REDIS_BUS_UNSENT_MAX, and sent when they are back;
 *  - a publish lost (the publisher crashed between its COMMIT and the
 *    PUBLISH, or more were kept than the bound): the next message's gap, the
 *    sender's retry (an append found by its idempotency key is published
 *    again), and the periodic check: a conversation with nothing heard
 *    for `check_ms` has its head read, at most REDIS_BUS_CHECK_MAX per
 *    job. The worst case for a lost publish with no later message and no
 *    retry is check_ms plus one job.
 * A node whose bus is down stays ready (/readyz): delivery is slower, not
 * lost.
 *
 * Thread: loop only. hiredis (libhiredis-dev 0.14) with its libuv adapter.
 */
#ifndef CONVERGER_BUS_REDIS_H
#define CONVERGER_BUS_REDIS_H

#include <stddef.h>
#include <uv.h>

#include "bus/bus.h"
#include "core/metrics.h"
#include "store/pool.h"

#define REDIS_BUS_MAX             16     /* bus instances (core/busurl.h: BUSURL_MAX) */
#define REDIS_BUS_BATCH           512    /* channels per SUBSCRIBE or UNSUBSCRIBE */
#define REDIS_BUS_RETRY_MS        500    /* between connection attempts */
#define REDIS_BUS_CONNECT_MS      1000   /* a connection not up this long after it began: failed */
#define REDIS_BUS_PING_EVERY_MS   1000   /* PING on the publishing connection */
#define REDIS_BUS_PING_TIMEOUT_MS 2000   /* no answer: the instance is down */
#define REDIS_BUS_POLL_MS         1000   /* heads of a down instance's conversations */
#define REDIS_BUS_CHECK_MAX       5000   /* conversations per heads check */
#define REDIS_BUS_PUBLISH_MAX     100000 /* publishes awaiting Redis's answer; more wait */
#define REDIS_BUS_UNSENT_MAX      4096   /* publishes kept while their instance is down */

typedef struct redis_bus_s redis_bus_t;

/* Start the bus of node `node_id` (copied) on `loop`: connect to every
 * instance of `urls` (in the background; a node starts with its bus down),
 * `urls` as core/busurl.h parses them (CONVERGER_BUS),
 * install the bus_remote_t on `bus` (bus_set_routed), read heads on the
 * pool `*pool` (borrowed, read at each use: NULL once the owner closed it)
 * and count in `metrics` (borrowed, may be NULL). `check_ms` > 0: the
 * period of the idle conversations' check. On success *out is the bus,
 * freed by redis_bus_close. Returns 0, -CV_EINVAL (bad URLs), -CV_ENOMEM. */
int redis_bus_start(uv_loop_t *loop, bus_t *bus, pool_t *const *pool, const char *node_id,
                    const char *urls, int check_ms, metrics_t *metrics, redis_bus_t **out);

/* Instances, and how many are up (both connections working). */
int redis_bus_count(const redis_bus_t *rb);
int redis_bus_up(const redis_bus_t *rb);

/* Close every connection and free the bus once its handles have closed.
 * Call after pool_close (a heads check holds the bus). */
void redis_bus_close(redis_bus_t *rb);

#endif
