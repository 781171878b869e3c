#include "cli/token.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dburl.h"
#include "gate/auth.h"
#include "cli/args.h"
#include "core/config.h"
#include "common/util.h"
#include "store/store.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: converger token --sub USER --convs C1,C2|'*' [--ttl SECONDS] [serve settings]\n\n"
          "Prints a client token (JWT, HS256) signed with CONVERGER_TOKEN_SECRET, or with the\n"
          "secret the node stored in the data directory of CONVERGER_DATABASE_URL (default\n"
          "data/, relative to the working directory: run it where the node runs).\n"
          "--convs '*' covers every conversation. Default ttl 3600 seconds.\n");
}

int token_main(int argc, char **argv) {
  const char *sub = NULL, *convs = NULL, *ttl_s = NULL;
  long ttl = 3600;
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  for (int i = 0; i < argc; i++) {
    const char *v;
    int missing = 0;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      free(rest);
      return 0;
    }
    if ((v = cli_flag_value(argc, argv, &i, "--sub", &missing)))
      sub = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--convs", &missing)))
      convs = v;
    else if ((v = cli_flag_value(argc, argv, &i, "--ttl", &missing)))
      ttl_s = v;
    else if (!missing)
      rest[nrest++] = argv[i];
    if (missing) {
      fprintf(stderr, "converger token: %s needs a value\n", argv[i]);
      free(rest);
      return 2;
    }
  }
  if (ttl_s) {
    char *end;
    errno = 0;
    ttl = strtol(ttl_s, &end, 10);
    if (errno || *end || ttl < 1 || ttl > 366L * 86400) {
      fprintf(stderr, "converger token: invalid --ttl \"%s\": want seconds in [1, 31622400]\n",
              ttl_s);
      free(rest);
      return 2;
    }
  }
  if (!util_id_valid(sub) || !convs || !*convs) {
    fprintf(stderr, "converger token: %s\n\n",
            !sub                  ? "--sub is required"
            : !util_id_valid(sub) ? "--sub must be an id ([A-Za-z0-9._:-]{1,128})"
                                  : "--convs is required");
    usage(stderr);
    free(rest);
    return 2;
  }
  config_t cfg;
  int r = config_parse(&cfg, nrest, rest);
  free(rest);
  if (r != 0) {
    config_free(&cfg);
    return r == 1 ? 0 : 2;
  }
  if (!cfg.api_key) cfg.api_key = strdup("unused"); /* signing needs only the secret */
  int from_file;
  if (config_load_secrets(&cfg, 0, &from_file) != 0) {
    char db_shown[512];
    dburl_redact(cfg.database_url, db_shown, sizeof db_shown);
    fprintf(stderr,
            "converger token: no token secret: set CONVERGER_TOKEN_SECRET, or run this where the "
            "node runs (its data directory is %s, from CONVERGER_DATABASE_URL %s)\n",
            cfg.data_dir, db_shown);
    config_free(&cfg);
    return 1;
  }
  json_t *arr = json_array();
  char *list = strdup(convs);
  int status = 0;
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    if (strcmp(tok, "*") != 0 && !util_id_valid(tok)) {
      fprintf(stderr, "converger token: invalid conversation id \"%s\"\n", tok);
      status = 2;
    }
    json_array_append_new(arr, json_string(tok));
  }
  if (status == 0) {
    auth_t *a = auth_new(cfg.api_key, cfg.token_secret);
    char *token = NULL, jti[37];
    int64_t exp;
    if (!a || auth_sign(a, sub, arr, util_now_ms() / 1000, ttl, &token, jti, &exp) != 0) {
      fprintf(stderr, "converger token: cannot sign\n");
      status = 1;
    } else {
      printf("%s\n", token);
    }
    free(token);
    auth_free(a);
  }
  free(list);
  json_decref(arr);
  config_free(&cfg);
  return status;
}
