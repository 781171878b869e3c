/*
 * shards.c: `converger shards` (see shards.h). Blocking store calls on the
 * command's one thread.
 */
#include "cli/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/shards_move.h"
#include "core/busurl.h"
#include "core/config.h"
#include "core/dburl.h"
#include "core/errors.h"
#include "core/shard.h"
#include "common/util.h"
#include "store/store.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: converger shards init --instance URL [--instance URL ...] [serve settings]\n"
          "       converger shards show [serve settings]\n"
          "       converger shards where CONV [serve settings]\n"
          "       converger shards move SHARD --to INSTANCE [--keep-source] [--wait S]\n"
          "                             [--lock-wait MS] [serve settings]\n"
          "       converger shards add-instance URL [serve settings]\n"
          "       converger shards cleanup SHARD [--wait S] [serve settings]\n\n"
          "The shard map of a sharded cluster (docs/operations.md, \"Scaling out\"), kept in\n"
          "its control database, CONVERGER_DATABASE_URL (--database-url).\n\n"
          "  init   write the map once: each --instance URL (a PostgreSQL URL, or a libpq\n"
          "         multi-host URL such as postgres://u@a:5432,b:5432/db?target_session_attrs=\n"
          "         read-write, which follows a promoted standby) becomes instance 0, 1, ...\n"
          "         in the order given, and logical shard k (of %d) goes to instance\n"
          "         k mod N. Migrates the control database and every instance. The control\n"
          "         database may be one of the instances. Refuses when a map exists.\n"
          "  show   print the instances (passwords hidden), how many logical shards each\n"
          "         holds, whether it answers, and the map's version.\n"
          "  where  print the logical shard and instance of conversation CONV, and with\n"
          "         CONVERGER_BUS (--bus) its bus instance.\n"
          "  move   move logical shard SHARD's rows to instance INSTANCE: copied while its\n"
          "         writes go on, then its writes frozen (503 with a retry hint; other\n"
          "         shards unaffected) for the rest of the copy and the map's switch,\n"
          "         thawed, and once every live node follows the new map (--wait, 30 s)\n"
          "         the source's copies deleted (unless --keep-source). --lock-wait: how\n"
          "         long the freeze waits for writes in flight (5000 ms). Prints the time\n"
          "         frozen and the rows copied.\n"
          "  add-instance  add PostgreSQL instance URL to the map (migrated first) with\n"
          "         no shards; move shards onto it with `move`.\n"
          "  cleanup  delete the copies of SHARD kept by instances it moved away from,\n"
          "         once every live node follows the map.\n\n"
          "Exit status: 0; 1 when the store fails; 2 for a usage error.\n",
          SHARD_COUNT);
}

/* The control database, migrated. */
static int open_control(const config_t *cfg, store_t **s, char *shown, size_t cap) {
  dburl_redact(cfg->database_url, shown, cap);
  if (strcmp(dburl_backend(cfg->database_url), "postgres") != 0) {
    fprintf(stderr, "converger shards: the control database must be PostgreSQL, not %s\n", shown);
    return 2;
  }
  store_options_t opt = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 5000};
  int r = store_open(cfg->database_url, &opt, s);
  if (r == 0) r = store_migrate(*s);
  if (r != 0) {
    fprintf(stderr, "converger shards: cannot open the control database %s: %s\n", shown,
            cv_strerror(r));
    return 1;
  }
  return 0;
}

static int cmd_init(const config_t *cfg, const char *const *urls, int n) {
  if (n == 0) return cli_usage_error("shards", "init needs at least one --instance URL");
  for (int i = 0; i < n; i++) {
    const char *b = dburl_backend(urls[i]);
    if (!b || strcmp(b, "postgres") != 0 || strlen(urls[i]) > STORE_URL_MAX) {
      char shown[512];
      dburl_redact(urls[i], shown, sizeof shown);
      fprintf(stderr,
              "converger shards: --instance %s is not a PostgreSQL URL of at most %d bytes\n",
              shown, STORE_URL_MAX);
      return 2;
    }
  }
  char shown[512];
  store_t *ctl = NULL;
  int status = open_control(cfg, &ctl, shown, sizeof shown);
  for (int i = 0; status == 0 && i < n; i++) { /* every instance answers and is migrated */
    store_t *s = NULL;
    store_options_t opt = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 5000};
    char ishown[512];
    dburl_redact(urls[i], ishown, sizeof ishown);
    int r = store_open(urls[i], &opt, &s);
    if (r == 0) r = store_migrate(s);
    store_close(s);
    if (r != 0) {
      fprintf(stderr, "converger shards: instance %d (%s): %s\n", i, ishown, cv_strerror(r));
      status = 1;
    }
  }
  int r = status == 0 ? store_shardmap_init(ctl, urls, n) : 0;
  if (status == 0 && r == -CV_EEXISTS) {
    fprintf(stderr, "converger shards: %s has a shard map already (converger shards show)\n",
            shown);
    status = 1;
  } else if (status == 0 && r != 0) {
    fprintf(stderr, "converger shards: writing the map to %s failed: %s\n", shown, cv_strerror(r));
    status = 1;
  }
  if (status == 0)
    printf("converger shards: %d logical shards over %d instance(s), map in %s\n", SHARD_COUNT, n,
           shown);
  store_close(ctl);
  return status;
}

/* The control database's map into *map (cleared with
 * store_shardmap_clear when 0 is returned): 0, or the exit status with
 * what is wrong printed. The control store is closed either way. */
static int read_map(const config_t *cfg, store_shardmap_t *map, char *shown, size_t cap) {
  store_t *ctl = NULL;
  int status = open_control(cfg, &ctl, shown, cap);
  int r = status == 0 ? store_shardmap_get(ctl, map) : 0;
  if (status == 0 && r != 0) {
    fprintf(stderr, "converger shards: %s: %s\n", shown,
            r == -CV_ENOTFOUND ? "no shard map (converger shards init)" : cv_strerror(r));
    status = 1;
  }
  store_close(ctl);
  return status;
}

static int cmd_show(const config_t *cfg) {
  char shown[512];
  store_shardmap_t map;
  int status = read_map(cfg, &map, shown, sizeof shown);
  if (status == 0) {
    printf("shard map in %s, version %lld, %d logical shards\n", shown, (long long)map.version,
           SHARD_COUNT);
    printf("%-9s %-7s %-8s %s\n", "instance", "shards", "answers", "url");
    for (int i = 0; i < map.n; i++) {
      int count = 0;
      for (int k = 0; k < SHARD_COUNT; k++) count += map.map[k] == i;
      store_t *s = NULL;
      store_options_t opt = {.sync = STORE_SYNC_FULL, .busy_timeout_ms = 5000};
      int ok = store_open(map.urls[i], &opt, &s) == 0 && store_ping(s) == 0;
      store_close(s);
      char ishown[512];
      dburl_redact(map.urls[i], ishown, sizeof ishown);
      printf("%-9d %-7d %-8s %s\n", i, count, ok ? "yes" : "NO", ishown);
    }
    store_shardmap_clear(&map);
  }
  return status;
}

static int cmd_where(const config_t *cfg, const char *conv) {
  if (!conv || !util_id_valid(conv))
    return cli_usage_error("shards", "where needs a conversation id ([A-Za-z0-9._:-]{1,128})");
  char shown[512];
  store_shardmap_t map;
  int status = read_map(cfg, &map, shown, sizeof shown);
  if (status == 0) {
    int k = shard_of(conv);
    char ishown[512];
    dburl_redact(map.urls[map.map[k]], ishown, sizeof ishown);
    printf("conversation %s: logical shard %d, instance %d (%s)", conv, k, map.map[k], ishown);
    int nbus = 0;
    if (cfg->bus && busurl_parse(cfg->bus, NULL, &nbus, ishown, sizeof ishown) == 0)
      printf(", bus instance %d of %d", shard_jump(shard_key(conv), nbus), nbus);
    printf("\n");
    store_shardmap_clear(&map);
  }
  return status;
}

/* `v` a decimal integer in lo..hi into *out: 1, else 0. */
static int int_arg(const char *v, int lo, int hi, int *out) {
  char *end = NULL;
  if (!v || !*v) return 0;
  long x = strtol(v, &end, 10);
  if (*end || x < lo || x > hi) return 0;
  *out = (int)x;
  return 1;
}

int shards_main(int argc, char **argv) {
  if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
    usage(argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  const char *sub = argv[0];
  if (strcmp(sub, "init") != 0 && strcmp(sub, "show") != 0 && strcmp(sub, "where") != 0 &&
      strcmp(sub, "move") != 0 && strcmp(sub, "add-instance") != 0 && strcmp(sub, "cleanup") != 0) {
    fprintf(stderr,
            "converger shards: unknown subcommand \"%s\" (init, show, where, move, "
            "add-instance, cleanup; see --help)\n",
            sub);
    return 2;
  }
  shards_move_t mv = {.shard = -1, .to = -1};
  const char *shard_arg = NULL, *to_arg = NULL, *wait_arg = NULL, *lock_arg = NULL;
  const char *urls[STORE_INSTANCES_MAX];
  int nurls = 0;
  const char *conv = NULL;
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
    if ((v = cli_flag_value(argc, argv, &i, "--instance", &missing))) {
      if (nurls == STORE_INSTANCES_MAX) {
        free(rest);
        return cli_usage_error("shards", "at most 64 --instance");
      }
      urls[nurls++] = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--to", &missing))) {
      to_arg = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--wait", &missing))) {
      wait_arg = v;
    } else if ((v = cli_flag_value(argc, argv, &i, "--lock-wait", &missing))) {
      lock_arg = v;
    } else if (strcmp(argv[i], "--keep-source") == 0) {
      mv.keep_source = 1;
    } else if (missing) {
      fprintf(stderr, "converger shards: %s needs a value\n", argv[i]);
      free(rest);
      return 2;
    } else if ((strcmp(sub, "where") == 0 || strcmp(sub, "add-instance") == 0) && !conv &&
               argv[i][0] != '-') {
      conv = argv[i];
    } else if ((strcmp(sub, "move") == 0 || strcmp(sub, "cleanup") == 0) && !shard_arg &&
               argv[i][0] != '-') {
      shard_arg = argv[i];
    } else {
      rest[nrest++] = argv[i];
    }
  }
  config_t cfg;
  int r = config_parse(&cfg, nrest, rest);
  free(rest);
  if (r != 0) {
    config_free(&cfg);
    return r == 1 ? 0 : 2;
  }
  int status;
  if (strcmp(sub, "move") == 0 || strcmp(sub, "cleanup") == 0) {
    if (!int_arg(shard_arg, 0, SHARD_COUNT - 1, &mv.shard) ||
        (strcmp(sub, "move") == 0 && !int_arg(to_arg, 0, STORE_INSTANCES_MAX - 1, &mv.to)) ||
        (wait_arg && !int_arg(wait_arg, 1, 3600, &mv.wait_s)) ||
        (lock_arg && !int_arg(lock_arg, 1, 600000, &mv.lock_wait_ms)))
      status = cli_usage_error("shards", strcmp(sub, "move") == 0
                                             ? "move needs SHARD (0..255) and --to INSTANCE; "
                                               "--wait 1..3600 s, --lock-wait 1..600000 ms"
                                             : "cleanup needs SHARD (0..255); --wait 1..3600 s");
    else if (strcmp(sub, "move") == 0)
      status = shards_move(&cfg, &mv);
    else
      status = shards_cleanup(&cfg, mv.shard, mv.wait_s);
  } else if (strcmp(sub, "add-instance") == 0) {
    status = conv ? shards_add_instance(&cfg, conv)
                  : cli_usage_error("shards", "add-instance needs a PostgreSQL URL");
  } else {
    status = strcmp(sub, "init") == 0   ? cmd_init(&cfg, urls, nurls)
             : strcmp(sub, "show") == 0 ? cmd_show(&cfg)
                                        : cmd_where(&cfg, conv);
  }
  config_free(&cfg);
  return status;
}
