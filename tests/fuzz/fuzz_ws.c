/* Fuzz target: a WebSocket client's bytes (net/ws.c on wslay, the fake
 * session of netfuzz.h behind it). The harness sends a valid upgrade
 * request first; the input is what the client sends after it: masked or
 * unmasked frames, fragmentation, control frames, close, garbage. Any
 * bytes must end in a close or a reply, never a crash, a leak or a hang. */
#include <stddef.h>
#include <stdint.h>

#include "netfuzz.h"

static const char upgrade[] = "GET /v1/ws HTTP/1.1\r\n"
                              "Host: fuzz\r\n"
                              "Upgrade: websocket\r\n"
                              "Connection: Upgrade\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              "Sec-WebSocket-Version: 13\r\n"
                              "Sec-WebSocket-Protocol: converger.v1\r\n"
                              "\r\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  return netfuzz_run((const uint8_t *)upgrade, sizeof upgrade - 1, data, len);
}
