#ifndef CONVERGER_CLI_TAIL_H
#define CONVERGER_CLI_TAIL_H

/* `converger tail` (see its --help): prints the messages of conversations as
 * JSON lines and reconnects for ever. Returns the exit status: 0 after a
 * signal, --max-messages or when the reader of stdout went away (EPIPE), 1
 * when the token is refused or a write to stdout failed otherwise, 2 on a
 * usage error. */
int tail_main(int argc, char **argv);

#endif
