/*
 * The logger the driver passes to a plugin's init, as NCCL passes its own: a printf-style
 * variadic function (which Rust cannot define on stable). It prints what NCCL would print for
 * NCCL_DEBUG (WARN by default, INFO, TRACE) on stderr, one line each, prefixed like NCCL's,
 * and keeps the last WARN line for the driver (a failed call returns only a code; its reason
 * is in the log).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_warning[4096];
static atomic_int echo = 1;

void rsib_driver_echo_warnings(int on) { echo = on; }

size_t rsib_driver_take_warning(char *out, size_t len) {
  pthread_mutex_lock(&last_lock);
  size_t n = strlen(last_warning);
  if (len > 0) {
    snprintf(out, len, "%s", last_warning);
    if (n >= len) n = len - 1;
  }
  last_warning[0] = '\0';
  pthread_mutex_unlock(&last_lock);
  return n;
}

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
  const int warn = level == 2; /* NCCL_LOG_WARN */
  if (level == 0 || (level > threshold() && !warn)) return;
  static const char *names[] = {"", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (warn) {
    pthread_mutex_lock(&last_lock);
    snprintf(last_warning, sizeof last_warning, "%s", msg);
    pthread_mutex_unlock(&last_lock);
    if (!echo || level > threshold()) return;
  }
  fprintf(stderr, "NCCL %s %s\n", level >= 0 && level <= 5 ? names[level] : "?", msg);
}
