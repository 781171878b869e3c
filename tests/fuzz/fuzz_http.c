/* Fuzz target: the first bytes of a connection (net/conn.c, net/http.c on
 * llhttp, the upgrade in net/ws.c), through the netfuzz harness: requests,
 * pipelining, bodies (Content-Length and chunked), Expect, upgrades and
 * whatever follows them. Any bytes must be answered or refused, and the
 * connection closed and freed, never a crash, a leak or a hang. */
#include <stddef.h>
#include <stdint.h>

#include "netfuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  return netfuzz_run(NULL, 0, data, len);
}
