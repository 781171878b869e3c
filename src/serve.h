/*
 * serve: `converger serve`: parse settings, start the pool, the bus and the
 * listener, run the loop, and shut down on SIGTERM/SIGINT (stop accepting,
 * close every WebSocket with 1001, finish in-flight pool jobs, exit 0).
 */
#ifndef CONVERGER_SERVE_H
#define CONVERGER_SERVE_H

/* Runs a node until it is stopped. argv excludes "serve". Returns the
 * process exit status: 0 after a clean stop, 1 on a start-up failure, 2 on
 * a bad setting. */
int serve_main(int argc, char **argv);

#endif
