/*
 * roll: `converger roll`, the rolling-restart controller of the
 * reconnect-storm post-mortem, and `converger balance`, its last step on
 * its own. The decisions are cluster/rollpolicy.h's (the same policy the
 * simulator runs); this file drives them from real nodes (cli/fleet.h):
 * the plan, the headroom check, batches of drain, restart and readiness,
 * pauses and aborts, the balance by shed moves, progress and the summary.
 *
 * Exit status: 0 done (balanced), 1 error (the fleet could not be read,
 * --out not writable), 2 usage, 3 refused to start (headroom), 4 aborted
 * (an alarm, a node that did not leave or come back, SIGINT, or the fleet
 * not balanced after --balance-rounds); a second SIGINT exits at once
 * with 130.
 *
 * Main thread only.
 */
#ifndef CONVERGER_CLI_ROLL_H
#define CONVERGER_CLI_ROLL_H

/* `converger roll ARGS` (argv after "roll"); with balance_only,
 * `converger balance ARGS`. Returns the exit status. */
int roll_main(int argc, char **argv, int balance_only);

#endif
