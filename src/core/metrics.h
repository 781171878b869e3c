/*
 * metrics: a small Prometheus registry (text exposition format 0.0.4).
 *
 * Families are declared once in metrics.c (name, type, help). Series are
 * created on first use from a family name plus a label string such as
 * `route="/v1/ws",code="101"`. Counters and gauges are updated on the loop
 * thread only; histograms may be observed from any thread (a mutex guards
 * them: the pool workers record checkout waits).
 */
#ifndef CONVERGER_CORE_METRICS_H
#define CONVERGER_CORE_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* Add n to a counter series. `labels` may be NULL or "" for none; it is
 * copied. Loop thread. Unknown families are a programming error (logged). */
void metrics_add(const char *family, const char *labels, uint64_t n);

/* Set a gauge series. Loop thread. */
void metrics_set(const char *family, const char *labels, double value);

/* Record one observation (ms) in a histogram family. Any thread. */
void metrics_observe(const char *family, double value_ms);

/* The same in the series of `labels` (e.g. `result="ok"`; copied). */
void metrics_observe_labels(const char *family, const char *labels, double value_ms);

/* Render every family into a heap buffer (caller frees). *len is set to
 * its length in bytes. Loop thread. */
char *metrics_render(size_t *len);

/* Free every series (tests and shutdown). Loop thread, no other users. */
void metrics_reset(void);

#endif
