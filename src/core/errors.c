#include "core/errors.h"

#include <string.h>

const char *cv_strerror(int err) {
  switch (-err) {
#define CV_ERR_CASE_(name, msg)                                                                    \
  case CV_E##name:                                                                                 \
    return msg;
    CV_ERRNO_MAP(CV_ERR_CASE_)
#undef CV_ERR_CASE_
  default:
    break;
  }
  if (err == 0) return "success";
  return strerror(-err);
}
