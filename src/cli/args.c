#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cli_flag_value(int argc, char **argv, int *i, const char *name, int *missing) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  return argv[++*i];
}

int cli_usage_error(const char *cmd, const char *message) {
  fprintf(stderr, "converger %s: %s (see converger %s --help)\n", cmd, message, cmd);
  return 2;
}

int cli_parse_ll(const char *text, long long min, long long max, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < min || v > max) return -1;
  *out = v;
  return 0;
}
