#include "cli/epoch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "core/config.h"
#include "core/dburl.h"
#include "core/errors.h"
#include "common/util.h"
#include "store/sharded.h"
#include "store/store.h"

#define MAX_CONVS 1000

static void usage(FILE *out) {
  fprintf(out,
          "usage: converger epoch rotate [--conv C ...] [serve settings such as --database-url]\n\n"
          "Gives conversations a new epoch, the identity of their history, in the store of\n"
          "CONVERGER_DATABASE_URL (default sqlite:data/converger.db): every conversation, or\n"
          "only those named with --conv. A client that resumes with a watermark taken before\n"
          "is then answered with a reset (the new head and epoch) instead of being served\n"
          "other messages under seqs it has already seen. Run it after restoring a backup,\n"
          "before the nodes take clients again: with SQLite, while the node is stopped;\n"
          "with PostgreSQL, right after the restore (docs/operations.md, \"Restoring a\n"
          "backup\"). Messages and heads are not changed. Migrates the schema first if the\n"
          "store is older. In a sharded cluster, give CONVERGER_BUS (--bus) too: the\n"
          "conversations are then found on their instances through the control database.\n");
}

int epoch_main(int argc, char **argv) {
  if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
    usage(argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  if (strcmp(argv[0], "rotate") != 0) {
    fprintf(stderr, "converger epoch: unknown subcommand \"%s\" (see --help)\n", argv[0]);
    return 2;
  }
  const char *convs[MAX_CONVS];
  size_t nconvs = 0;
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  if (!rest) return 1;
  for (int i = 1; i < argc; i++) {
    const char *v;
    int missing = 0;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      free(rest);
      return 0;
    }
    if ((v = cli_flag_value(argc, argv, &i, "--conv", &missing))) {
      if (!util_id_valid(v) || nconvs == MAX_CONVS) {
        fprintf(stderr, "converger epoch: %s\n",
                nconvs == MAX_CONVS ? "at most 1000 --conv"
                                    : "--conv must be an id ([A-Za-z0-9._:-]{1,128})");
        free(rest);
        return 2;
      }
      convs[nconvs++] = v;
    } else if (!missing) {
      rest[nrest++] = argv[i];
    }
    if (missing) {
      fprintf(stderr, "converger epoch: %s needs a value\n", argv[i]);
      free(rest);
      return 2;
    }
  }
  config_t cfg;
  int r = config_parse(&cfg, nrest, rest);
  free(rest);
  if (r != 0) {
    config_free(&cfg);
    return r == 1 ? 0 : 2;
  }
  char shown[512];
  dburl_redact(cfg.database_url, shown, sizeof shown);
  store_t *s = NULL;
  store_options_t opt = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 5000};
  /* a sharded cluster (CONVERGER_BUS): the conversations are on the
   * instances of the control database's shard map */
  store_shards_t *shards = cfg.bus ? store_shards_new(1, NULL) : NULL;
  if (cfg.bus && !shards) {
    config_free(&cfg);
    return 1;
  }
  opt.shards = shards;
  int status = 0;
  if ((r = store_open(cfg.database_url, &opt, &s)) != 0 || (r = store_migrate(s)) != 0) {
    fprintf(stderr, "converger epoch: cannot open the store %s: %s\n", shown, cv_strerror(r));
    status = 1;
  }
  int64_t total = 0;
  for (size_t i = 0; status == 0 && i < (nconvs ? nconvs : 1); i++) {
    int64_t n = 0;
    r = store_epoch_rotate(s, nconvs ? convs[i] : NULL, &n);
    if (r == -CV_ENOTFOUND) {
      fprintf(stderr, "converger epoch: no conversation \"%s\" in %s\n", convs[i], shown);
      status = 1;
    } else if (r != 0) {
      fprintf(stderr, "converger epoch: rotating in %s failed: %s\n", shown, cv_strerror(r));
      status = 1;
    }
    total += n;
  }
  if (total > 0 || status == 0)
    printf("converger epoch: new epoch for %lld conversation(s) in %s\n", (long long)total, shown);
  store_close(s);
  store_shards_free(shards);
  config_free(&cfg);
  return status;
}
