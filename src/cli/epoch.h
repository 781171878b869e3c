/*
 * epoch: `converger epoch rotate [--conv C ...] [serve settings]` gives
 * conversations a new epoch in the store of CONVERGER_DATABASE_URL (the
 * same settings as `converger serve`), so that clients resuming with
 * watermarks of a history the store no longer has are told to reset
 * (docs/protocol.md, "Epochs and resets"). Run after restoring a backup
 * (docs/operations.md).
 */
#ifndef CONVERGER_CLI_EPOCH_H
#define CONVERGER_CLI_EPOCH_H

/* argv excludes "epoch". Returns the exit status: 0 done, 1 the store
 * failed or a conversation does not exist, 2 bad usage. */
int epoch_main(int argc, char **argv);

#endif
