/*
 * tlscert: a throw-away TLS certificate for a bench node that serves TLS
 * (converger bench admission --transport wss).
 *
 * One self-signed P-256 certificate for IP 127.0.0.1 and DNS localhost,
 * valid for a day, written as PEM with its key; the certificate is also
 * the clients' trust anchor (cvg_options_t.tls_ca_file,
 * httpc_request_t.tls_ca_file), so verification stays on, as it is for a
 * real client. Made with OpenSSL's X509 API, no openssl command needed.
 *
 * Main thread only.
 */
#ifndef CONVERGER_TOOLS_BENCH_TLSCERT_H
#define CONVERGER_TOOLS_BENCH_TLSCERT_H

#include <stddef.h>

/* Write the certificate to `cert_path` and its key to `key_path` (mode
 * 0600). Returns 0, or -1 with the reason in err[errlen]. */
int tlscert_make(const char *cert_path, const char *key_path, char *err, size_t errlen);

#endif
