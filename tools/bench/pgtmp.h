/*
 * pgtmp: a throwaway PostgreSQL cluster for a bench run, started and
 * stopped through scripts/pg-tmp (its `start --owner PID` prints the URL;
 * its `stop` stops the server by pid and removes PG_TMP_DIR). Used by
 * `converger bench store`, `bench roll` and `bench presence`.
 *
 * Main thread, no loop running (the calls block on the script).
 */
#ifndef CONVERGER_TOOLS_BENCH_PGTMP_H
#define CONVERGER_TOOLS_BENCH_PGTMP_H

#include <stddef.h>

/* Run `script` ARG1 ARG2 ARG3 ARG4 (NULLs end the list) with
 * PG_TMP_DIR=dir; its stdout into `out` (`cap` bytes, NUL-terminated; NULL:
 * inherited), its stderr inherited. Returns its exit status, or -1 when it
 * could not run. */
int pgtmp_run_script(const char *script, const char *dir, const char *arg1, const char *arg2,
                     const char *arg3, const char *arg4, char *out, size_t cap);

/* Start a cluster with `script` in a new directory under $TMPDIR (or /tmp),
 * written to `dir` (`dircap` bytes; "" when none was created), owned by
 * this process; its URL ("postgres://...") into `url` (`urlcap` bytes).
 * `fast` 1: `start --fast`, a cluster that is not durable (fsync,
 * synchronous_commit and full_page_writes off: acknowledged commits are
 * lost in a crash of the server or the machine; scripts/pg-tmp --help);
 * 0: the script's durable default (all three on). Each bench says which
 * its figures ran with. `cmd` prefixes the messages printed to stderr.
 * Returns 0, or -1 after printing why (`dir` may then name a directory for
 * pgtmp_stop). */
int pgtmp_start(const char *cmd, const char *script, int fast, char *dir, size_t dircap, char *url,
                size_t urlcap);

/* Stop the cluster of `dir` (no-op when `dir` is ""), remove the directory
 * and clear `dir`. Prints to stderr when the script fails. Never fails. */
void pgtmp_stop(const char *cmd, const char *script, char *dir);

#endif
