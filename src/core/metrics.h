/*
 * metrics: a small Prometheus registry (text exposition format 0.0.4).
 *
 * Families are declared once in metrics.c (name, type, help). Series are
 * created on first use from a family name plus a label string such as
 * `route="/v1/ws",code="101"`. Counters and gauges are updated on the loop
 * thread only; histograms may be observed from any thread (the registry's
 * mutex guards them: the pool workers record checkout waits).
 *
 * A registry (metrics_t) belongs to one node: serve.c makes it, and every
 * module that records keeps a borrowed pointer to it, set when the module
 * is built (net_t, the pool, the bus, the drain, the sessions, api_t). A
 * NULL registry records nothing, so a module built alone (a unit test, a
 * fuzz target) needs none.
 */
#ifndef CONVERGER_CORE_METRICS_H
#define CONVERGER_CORE_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct metrics_s metrics_t;

/* A new, empty registry (every family declared, no series yet), or NULL
 * when out of memory. The caller frees it with metrics_free, after every
 * module that records into it has stopped (the pool's workers joined). */
metrics_t *metrics_new(void);

/* Free every series and the registry. NULL is allowed. Loop thread, no
 * other users. */
void metrics_free(metrics_t *m);

/* Add n to a counter series. `labels` may be NULL or "" for none; it is
 * copied. Loop thread. Unknown families are a programming error (logged). */
void metrics_add(metrics_t *m, const char *family, const char *labels, uint64_t n);

/* Set a gauge series. Loop thread. */
void metrics_set(metrics_t *m, const char *family, const char *labels, double value);

/* Record one observation (ms) in a histogram family. Any thread. */
void metrics_observe(metrics_t *m, const char *family, double value_ms);

/* The same in the series of `labels` (e.g. `result="ok"`; copied). */
void metrics_observe_labels(metrics_t *m, const char *family, const char *labels, double value_ms);

/* Render every family of `m` into a heap buffer (caller frees). *len is
 * set to its length in bytes. NULL on OOM. Loop thread. */
char *metrics_render(metrics_t *m, size_t *len);

/* Free every series of `m`: it reads as new again (tests). Loop thread, no
 * other users. */
void metrics_reset(metrics_t *m);

#endif
