/*
 * util: small helpers shared by every module: container_of, wall and
 * monotonic clocks, id validation, random ids. Any thread may call.
 */
#ifndef CONVERGER_COMMON_UTIL_H
#define CONVERGER_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define CV_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Wall-clock time, ms since the Unix epoch (UTC). */
int64_t util_now_ms(void);

/* Monotonic time in ms (CLOCK_MONOTONIC), for durations; the fake clock's
 * value while one is set (util_mono_fake). Any thread. */
uint64_t util_mono_ms(void);

/* Tests only: make util_mono_ms return *ms (the caller owns it and moves
 * it forward), or the real clock again when `ms` is NULL. Set it before
 * any other thread starts; the caller's value is read with no lock. */
void util_mono_fake(const uint64_t *ms);

/* 1 when `s` matches [A-Za-z0-9._:-]{1,128} (PROTOCOL.md ids), else 0. */
int util_id_valid(const char *s);

/* Format ts_ms as RFC 3339 UTC with milliseconds, "2026-11-29T21:40:00.123Z",
 * into out (at least 25 bytes). */
void util_format_ts(int64_t ts_ms, char out[25]);

/* Fill `out` (37 bytes) with a random version-4 UUID from OpenSSL's CSPRNG. */
void util_uuid(char out[37]);

/* Fill `out` with 2*n+1 bytes: n random bytes (OpenSSL CSPRNG) as lowercase
 * hex. Returns 0, or -EIO when the RNG fails. */
int util_random_hex(char *out, size_t n);

/* The most util_raise_nofile raises the soft open-file limit to. */
#define UTIL_NOFILE_CEILING 1048576

/* Raise RLIMIT_NOFILE's soft limit to the hard one, at most
 * UTIL_NOFILE_CEILING, as nginx's worker_rlimit_nofile and Go's runtime do:
 * containers and login sessions often start with a soft 1024 under a hard
 * limit of a million, and a gateway (or a load client) holds one
 * descriptor per connection. The hard limit stays the operator's.
 * *before and *after (either may be NULL) get the soft limit before and in
 * force afterwards (UINT64_MAX: unlimited). Returns 1 when it was raised,
 * else 0. Children inherit the limit. Call it before other threads open
 * files. */
int util_raise_nofile(uint64_t *before, uint64_t *after);

#endif
