#include "common/util.h"

#include <errno.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

int64_t util_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The one piece of mutable process state in common/: a test seam. */
static const uint64_t *fake_mono;

void util_mono_fake(const uint64_t *ms) { fake_mono = ms; }

uint64_t util_mono_ms(void) {
  if (fake_mono) return *fake_mono;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int util_id_valid(const char *s) {
  size_t n = 0;
  if (s == NULL) return 0;
  for (; s[n] != '\0'; n++) {
    char c = s[n];
    if (n >= 128) return 0;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == ':' || c == '-'))
      return 0;
  }
  return n > 0;
}

void util_format_ts(int64_t ts_ms, char out[25]) {
  time_t secs = (time_t)(ts_ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", (tm.tm_year + 1900) % 10000,
           tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts_ms % 1000));
  memcpy(out, buf, 24);
  out[24] = '\0';
}

void util_uuid(char out[37]) {
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) memset(b, 0, sizeof b);
  b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
  b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
           b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
}

int util_random_hex(char *out, size_t n) {
  unsigned char b[64];
  static const char hex[] = "0123456789abcdef";
  size_t done = 0;
  while (done < n) {
    size_t k = n - done < sizeof b ? n - done : sizeof b;
    if (RAND_bytes(b, (int)k) != 1) return -EIO;
    for (size_t i = 0; i < k; i++) {
      out[2 * (done + i)] = hex[b[i] >> 4];
      out[2 * (done + i) + 1] = hex[b[i] & 15];
    }
    done += k;
  }
  out[2 * n] = '\0';
  return 0;
}

static uint64_t rlim_u64(rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : (uint64_t)v; }

int util_raise_nofile(uint64_t *before, uint64_t *after) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    if (before) *before = 0;
    if (after) *after = 0;
    return 0;
  }
  if (before) *before = rlim_u64(rl.rlim_cur);
  rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > UTIL_NOFILE_CEILING
                    ? UTIL_NOFILE_CEILING
                    : rl.rlim_max;
  int raised = 0;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = want;
    raised = setrlimit(RLIMIT_NOFILE, &rl) == 0;
    if (!raised) rl.rlim_cur = was;
  }
  if (after) *after = rlim_u64(rl.rlim_cur);
  return raised;
}
