/*
 * The logger the driver passes to a plugin's init, as NCCL passes its own: a printf-style
 * variadic function (which Rust cannot define on stable). It prints what NCCL would print for
 * NCCL_DEBUG (WARN by default, INFO, TRACE) on stderr, one line each, prefixed like NCCL's.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

static int threshold(void) {
  static int level = -1;
  if (level < 0) {
    const char *debug = getenv("NCCL_DEBUG");
    level = 2; /* NCCL_LOG_WARN */
    if (debug && strcasecmp(debug, "INFO") == 0) level = 3;
    if (debug && strcasecmp(debug, "TRACE") == 0) level = 5;
    if (debug && strcasecmp(debug, "VERSION") == 0) level = 1;
  }
  return level;
}

void rsib_driver_logger(int level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level > threshold() || level == 0) return;
  static const char *names[] = {"", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "NCCL %s %s\n", level >= 0 && level <= 5 ? names[level] : "?", msg);
}
