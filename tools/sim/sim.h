/*
 * sim: `converger sim`, a discrete-event simulation of rolling restarts and
 * reconnect storms at fleet scale (issue 8; docs/benchmarks/sim.md). Its
 * parts: sim/params.h (parameters, scenarios, flags), sim/model.h (the
 * model), sim/report.h (summary.json, timeline.csv, sim.png); and
 * `converger sim fanout`, the fleet's bus bytes on paper (sim/fanout.h).
 *
 * Main thread; runs on one core and owns the process while it runs.
 */
#ifndef CONVERGER_TOOLS_SIM_H
#define CONVERGER_TOOLS_SIM_H

/* argv excludes "sim"; with "fanout" first, fanout_main (sim/fanout.h)
 * runs instead. Prints the summary to stdout and a progress line per
 * simulated minute to stderr, writes --out. Returns the exit status: 0
 * after a run, 1 when memory or the output fails, 2 on bad usage. */
int sim_main(int argc, char **argv);

#endif
