/*
 * converger error codes.
 *
 * Functions return int: 0 on success, a negative errno, or -CV_E... from the
 * list below. One X-macro list generates the enum and cv_strerror(), as
 * libuv's UV_ERRNO_MAP does. Project codes start at 10000 so they never
 * collide with errno values.
 */
#ifndef CONVERGER_CORE_ERRORS_H
#define CONVERGER_CORE_ERRORS_H

#define CV_ERRNO_MAP(X)                                                                            \
  X(NOTFOUND, "not found")                                                                         \
  X(EXISTS, "already exists")                                                                      \
  X(INACTIVE, "channel is inactive")                                                               \
  X(INVAL, "invalid argument")                                                                     \
  X(STORE, "store error")                                                                          \
  X(BUSY, "store busy")                                                                            \
  X(TOOLARGE, "too large")                                                                         \
  X(NOMEM, "out of memory")                                                                        \
  X(CANCELED, "canceled")                                                                          \
  X(UNAUTHORIZED, "unauthorized")                                                                  \
  X(TIMEDOUT, "store deadline passed")                                                             \
  X(SHARD, "shard unavailable")                                                                    \
  X(MOVED, "shard moved to another instance")

enum {
  CV_E_BASE_ = 9999,
#define CV_ERR_ENUM_(name, msg) CV_E##name,
  CV_ERRNO_MAP(CV_ERR_ENUM_)
#undef CV_ERR_ENUM_
};

/* Human-readable text for an error returned by any converger function
 * (negative project code or negative errno). Never NULL; static storage.
 * Any thread. */
const char *cv_strerror(int err);

#endif
