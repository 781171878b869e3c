/*
 * converger: subcommand dispatch only.
 */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "cli/epoch.h"
#include "cli/roll.h"
#include "cli/send.h"
#include "cli/shards.h"
#include "cli/tail.h"
#include "cli/token.h"
#include "serve.h"
#include "sim/sim.h"

static void usage(FILE *out) {
  fprintf(
      out,
      "converger %s: realtime messaging gateway\n\n"
      "usage: converger <command> [options]\n\n"
      "commands:\n"
      "  serve    run a gateway node (see converger serve --help)\n"
      "  token    print a client token signed with the node's secret\n"
      "  send     send one message over REST, with retries (see converger send --help)\n"
      "  tail     print the messages of conversations as they come (see converger tail --help)\n"
      "  epoch    give conversations a new epoch after a restore (see converger epoch --help)\n"
      "  shards   the shard map of a sharded cluster (see converger shards --help)\n"
      "  roll     restart a fleet in batches, with the reconnect-storm post-mortem's\n"
      "           thresholds (docs/background.md; see converger roll --help)\n"
      "  balance  move clients from the busiest nodes to the others (see --help)\n"
      "  bench    run a benchmark against a node it starts (see converger bench --help)\n"
      "  sim      simulate a rolling restart of a large fleet (see converger sim --help)\n"
      "  version  print the version\n",
      CONVERGER_VERSION);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "serve") == 0) return serve_main(argc - 2, argv + 2);
  if (strcmp(cmd, "token") == 0) return token_main(argc - 2, argv + 2);
  if (strcmp(cmd, "send") == 0) return send_main(argc - 2, argv + 2);
  if (strcmp(cmd, "tail") == 0) return tail_main(argc - 2, argv + 2);
  if (strcmp(cmd, "epoch") == 0) return epoch_main(argc - 2, argv + 2);
  if (strcmp(cmd, "shards") == 0) return shards_main(argc - 2, argv + 2);
  if (strcmp(cmd, "roll") == 0) return roll_main(argc - 2, argv + 2, 0);
  if (strcmp(cmd, "balance") == 0) return roll_main(argc - 2, argv + 2, 1);
  if (strcmp(cmd, "bench") == 0) return bench_main(argc - 2, argv + 2);
  if (strcmp(cmd, "sim") == 0) return sim_main(argc - 2, argv + 2);
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("converger %s\n", CONVERGER_VERSION);
    return 0;
  }
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "converger: unknown command \"%s\"\n\n", cmd);
  usage(stderr);
  return 2;
}
