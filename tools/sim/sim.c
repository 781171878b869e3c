/*
 * sim.c: `converger sim`: parse, run, report (see sim.h).
 */
#include "sim/sim.h"

#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "sim/fanout.h"
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
  if (argc > 0 && strcmp(argv[0], "fanout") == 0) return fanout_main(argc - 1, argv + 1);
  sim_params_t p;
  const char *out_dir;
  int rc = sim_params_parse(&p, &out_dir, argc, argv);
  if (rc != 0) return rc == 1 ? 0 : rc;
  uint64_t t0 = util_mono_ms();
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
  double wall_s = (double)(util_mono_ms() - t0) / 1000.0;
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
           wall_s, out_dir);
  }
  json_decref(sum);
  sim_free(&s);
  return rc;
}
