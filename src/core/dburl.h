/*
 * dburl: the forms of a store URL (CONVERGER_DATABASE_URL), below the store
 * so that configuration can read them without the store itself:
 *   "sqlite:PATH"                          SQLite
 *   "postgres://..." or "postgresql://..." PostgreSQL
 *   or a libpq keyword string              ("host=... dbname=...")
 * Pure functions, any thread.
 */
#ifndef CONVERGER_CORE_DBURL_H
#define CONVERGER_CORE_DBURL_H

#include <stddef.h>

/* The backend `url` selects: "sqlite", "postgres", or NULL when it is none
 * of the forms above. Checks the form only, not that it can connect. */
const char *dburl_backend(const char *url);

/* Copy `url` into `out` (`cap` bytes, always terminated, truncated if need
 * be) with any password replaced by "***": the userinfo password of a URL
 * and every password=VALUE (URL query or keyword string), whatever the
 * scheme. For logs and error messages. */
void dburl_redact(const char *url, char *out, size_t cap);

#endif
