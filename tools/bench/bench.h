/*
 * bench: `converger bench <name> [options]`, benchmark programs built into
 * the converger executable. Each one starts its own node (this executable,
 * `converger serve`, as a child process on a free loopback port with a
 * temporary data directory), drives it over 127.0.0.1 only, prints its
 * figures to stdout and progress to stderr, and stops the node and removes
 * the directory before it returns, on errors too.
 *
 * Benchmarks:
 *   baseline  memory per idle connection, handshakes/s, deliveries/s
 *             (tools/bench/baseline.c, docs/benchmarks/baseline.md; its
 *             parts: run.h the run's state and loop driver, node.h the
 *             child node, restc.h the REST client, wsclient.h the
 *             WebSocket client connections)
 *   admission the admission queue's acquire/release throughput on one core,
 *             and a burst of simultaneous hellos with admission on and off
 *             (tools/bench/admission.c, docs/benchmarks/admission.md; one
 *             burst is bench/burst.h's, with libconverger-client clients;
 *             the node's /metrics are read by bench/promtext.h, as in roll)
 *   store     appends/s with concurrent REST senders and delivery latency,
 *             same node and across two nodes, on SQLite (synchronous full
 *             and normal) and PostgreSQL (tools/bench/store.c,
 *             docs/benchmarks/store.md; the senders are bench/appender.h's)
 *   roll      a rolling restart of a PostgreSQL cluster under SDK clients in
 *             worker processes (bench/rollw.h) and a REST sender, with loss
 *             verification (tools/bench/roll.c, issue 7)
 *   compare   a preset set of roll scenarios side by side (adr: the
 *             admission-queue decision record's before and after, and
 *             converger's default; gw05: the drain lesson's no jitter against
 *             full jitter), with overlay plots (tools/bench/compare.c)
 *
 * Every percentile a benchmark prints is nearest rank (stats/rank.h).
 *
 * Main thread only; a benchmark owns the process while it runs (it handles
 * SIGINT/SIGTERM; baseline and admission also raise RLIMIT_NOFILE and pin
 * themselves to a CPU).
 */
#ifndef CONVERGER_TOOLS_BENCH_H
#define CONVERGER_TOOLS_BENCH_H

/* argv excludes "bench": argv[0] names the benchmark. Returns the exit
 * status: 0 when every phase ran (whether or not it met its target), 1 when
 * a phase failed or timed out, 2 on bad usage. */
int bench_main(int argc, char **argv);

/* `converger bench baseline`; argv excludes "baseline". Same statuses. */
int bench_baseline_main(int argc, char **argv);

/* `converger bench admission`; argv excludes "admission". Same statuses. */
int bench_admission_main(int argc, char **argv);

/* `converger bench store`; argv excludes "store". Same statuses; also 1
 * when a conversation read back has a gap or messages were lost. */
int bench_store_main(int argc, char **argv);

/* `converger bench roll`; argv excludes "roll". Same statuses; also 1
 * when an acknowledged message was missing, duplicated or out of order at
 * a subscriber (tools/bench/roll.c). */
int bench_roll_main(int argc, char **argv);

/* `converger bench compare`; argv excludes "compare". Runs each scenario as
 * a child `converger bench roll`. Returns 0 when every scenario verified, 1
 * when one failed, 2 on bad usage, 130 when interrupted by SIGINT/SIGTERM
 * (forwarded to the running scenario). */
int bench_compare_main(int argc, char **argv);
/* converger bench presence (bench/presence.c): the presence table's memory
 * and times, signals against appends. Exit status as a command's. */
int bench_presence_main(int argc, char **argv);

/* converger bench peers (bench/peers.c): converger next to uWebSockets.js,
 * Node ws, nats-server and mosquitto, one load client, rounds interleaved
 * (docs/benchmarks/peers.md). Same conventions. */
int bench_peers_main(int argc, char **argv);

#endif
