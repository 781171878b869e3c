/*
 * args: the command-line helpers shared by the subcommands in src/cli.
 * Main thread only.
 */
#ifndef CONVERGER_CLI_ARGS_H
#define CONVERGER_CLI_ARGS_H

/* "--name value" or "--name=value" at argv[*i]: returns the value (a
 * pointer into argv) and advances *i past it, or NULL when argv[*i] is not
 * this flag. Sets *missing when it is the flag but the value is absent. */
const char *cli_flag_value(int argc, char **argv, int *i, const char *name, int *missing);

/* Print "converger CMD: MESSAGE (see converger CMD --help)" on stderr and
 * return 2, the exit status of a usage error. */
int cli_usage_error(const char *cmd, const char *message);

/* Parse a whole decimal integer in [min, max] into *out: 0, or -1. */
int cli_parse_ll(const char *text, long long min, long long max, long long *out);

#endif
