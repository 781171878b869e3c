/*
 * sim.c: `converger sim`: parse, run, report (see sim.h).
 */
#include "sim/sim.h"

#include <stdio.h>
#include <time.h>

#include "sim/model.h"
#include "sim/params.h"
#include "sim/report.h"

static void progress(const sim_t *s, int second) {
  const sim_second_t *r = &s->sec[second];
  fprintf(stderr,
          "converger sim: %d/%lld s, connected %.2f %%, %lld attempts in the last s, "
          "busiest node %.0f %%, %lld collapses, batch %d/%d\n",
          second + 1, (long long)s->p.duration_s,
          100.0 * (double)r->connected / (double)s->p.clients, (long long)r->attempts,
          100 * r->max_cpu, (long long)s->collapses, s->next_batch, s->nbatches);
}

int sim_main(int argc, char **argv) {
  sim_params_t p;
  const char *out_dir;
  int rc = sim_params_parse(&p, &out_dir, argc, argv);
  if (rc != 0) return rc == 1 ? 0 : rc;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  sim_t s;
  if (sim_init(&s, &p) != 0) {
    fprintf(stderr, "converger sim: out of memory for %lld clients\n", (long long)p.clients);
    return 1;
  }
  if (sim_run(&s, progress) != 0) {
    fprintf(stderr, "converger sim: out of memory at %u s\n", s.now / SIM_TICKS_PER_S);
    sim_free(&s);
    return 1;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  json_t *sum = report_summary(&s);
  char err[512];
  rc = 0;
  if (!sum) {
    fprintf(stderr, "converger sim: out of memory for the summary\n");
    rc = 1;
  } else if (report_write(&s, sum, out_dir, err, sizeof err) != 0) {
    fprintf(stderr, "converger sim: %s\n", err);
    rc = 1;
  } else {
    report_print(sum, stdout);
    printf("\n%lld simulated s in %.1f s of wall time; output in %s/\n", (long long)p.duration_s,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9, out_dir);
  }
  json_decref(sum);
  sim_free(&s);
  return rc;
}
