/* A libFuzzer-compatible driver for builds without libFuzzer (gcc, CTest):
 * runs every seed file in the directory given as argv[1], then N
 * deterministic mutations of them (bit flips, byte changes, insertions,
 * deletions, truncations, splices). With clang, build the same targets with
 * -fsanitize=fuzzer instead (cmake -DCONVERGER_LIBFUZZER=ON). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);

typedef struct {
  uint8_t *p;
  size_t n;
} buf_t;

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void run(const uint8_t *p, size_t n) {
  /* A fresh copy of exactly n bytes, so ASan sees reads past the end. */
  uint8_t *copy = malloc(n ? n : 1);
  memcpy(copy, p, n);
  LLVMFuzzerTestOneInput(copy, n);
  free(copy);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SEED_DIR [ITERATIONS]\n", argv[0]);
    return 2;
  }
  long iterations = argc > 2 ? atol(argv[2]) : 20000;
  buf_t seeds[256];
  size_t nseeds = 0;
  DIR *d = opendir(argv[1]);
  if (!d) {
    perror(argv[1]);
    return 2;
  }
  struct dirent *e;
  while ((e = readdir(d)) && nseeds < 256) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    buf_t b = {malloc(1 << 16), 0};
    b.n = fread(b.p, 1, 1 << 16, f);
    fclose(f);
    seeds[nseeds++] = b;
  }
  closedir(d);
  if (nseeds == 0) {
    fprintf(stderr, "no seeds in %s\n", argv[1]);
    return 2;
  }
  for (size_t i = 0; i < nseeds; i++) run(seeds[i].p, seeds[i].n);
  uint8_t *m = malloc(1 << 17);
  for (long it = 0; it < iterations; it++) {
    buf_t *s = &seeds[next() % nseeds];
    size_t n = s->n;
    memcpy(m, s->p, n);
    int edits = 1 + (int)(next() % 4);
    for (int k = 0; k < edits; k++) {
      size_t pos = n ? next() % n : 0;
      switch (next() % 6) {
      case 0:
        if (n) m[pos] ^= (uint8_t)(1u << (next() % 8));
        break;
      case 1:
        if (n) m[pos] = (uint8_t)next();
        break;
      case 2: /* insert an interesting byte */
        if (n < (1 << 16)) {
          static const uint8_t pick[] = {'"', '\\', '{',  '}',  '[', ']', ',',
                                         ':', 0,    0xff, 0xc3, '.', '-', '9'};
          memmove(m + pos + 1, m + pos, n - pos);
          m[pos] = pick[next() % sizeof pick];
          n++;
        }
        break;
      case 3:
        if (n) {
          memmove(m + pos, m + pos + 1, n - pos - 1);
          n--;
        }
        break;
      case 4:
        n = pos;
        break;  /* truncate */
      case 5: { /* splice the tail of another seed */
        buf_t *o = &seeds[next() % nseeds];
        size_t from = o->n ? next() % o->n : 0;
        size_t take = o->n - from;
        if (pos + take > (1 << 16)) take = (1 << 16) - pos;
        memcpy(m + pos, o->p + from, take);
        n = pos + take;
        break;
      }
      }
    }
    run(m, n);
  }
  free(m);
  for (size_t i = 0; i < nseeds; i++) free(seeds[i].p);
  printf("%zu seeds, %ld mutations: no crash\n", nseeds, iterations);
  return 0;
}
