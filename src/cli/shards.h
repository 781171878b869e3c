/*
 * shards: `converger shards`, the shard map of a sharded cluster
 * (docs/operations.md, "Scaling out"): write it (init), print it (show),
 * and tell where a conversation lives (where).
 */
#ifndef CONVERGER_CLI_SHARDS_H
#define CONVERGER_CLI_SHARDS_H

/* The command's main: argv without "converger shards". Exit status: 0,
 * 1 (the store failed), 2 (usage). Main thread. */
int shards_main(int argc, char **argv);

#endif
