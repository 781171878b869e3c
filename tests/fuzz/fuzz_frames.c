/* Fuzz target: client frame decoding (proto/frames.c). Any bytes must give
 * 0 or -CV_EINVAL with a message, never a crash or a leak. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "proto/frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  frame_client_t f;
  char why[200];
  if (frame_decode((const char *)data, len, 100, &f, why, sizeof why) == 0) {
    /* A decoded frame is usable: touch what the session would. */
    if (f.type == FRAME_HELLO)
      for (size_t i = 0; i < f.nsubs; i++) (void)strlen(f.subs[i].conv);
    if (f.type == FRAME_SEND) {
      char *body = frame_dump(f.body);
      free(body);
    }
    frame_client_clear(&f);
  } else if (why[0] == '\0') {
    __builtin_trap(); /* a failure must say why */
  }
  return 0;
}
