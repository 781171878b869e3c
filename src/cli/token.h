/*
 * token: `converger token --sub U --convs C1,C2 [--ttl S] [serve settings]`
 * prints a client token signed with the node's secret (the same settings,
 * environment and data directory as `converger serve`).
 */
#ifndef CONVERGER_CLI_TOKEN_H
#define CONVERGER_CLI_TOKEN_H

/* argv excludes "token". Returns the exit status (0, or 2 on bad usage). */
int token_main(int argc, char **argv);

#endif
