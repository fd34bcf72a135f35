/* For measuring against other plugins on Soft-RoCE only (scripts/bench-interleaved.sh
 * --preload scripts/rxe-realpath.c): an rxe device has no /sys/class/infiniband/<dev>/device
 * link, so realpath() of that path fails. Some plugins (nccl-rdma-sharp-plugins' IB plugin
 * among them) then log the failure with a bad format argument and crash. This preload answers
 * such a path, and only such a path, with a made-up one under /sys/devices/virtual. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *realpath(const char *path, char *resolved) {
  static char *(*next)(const char *, char *);
  if (!next) next = (char *(*)(const char *, char *))dlsym(RTLD_NEXT, "realpath");
  char *found = next(path, resolved);
  char name[64];
  int end = 0;
  if (found || !path ||
      sscanf(path, "/sys/class/infiniband/%63[^/]/device%n", name, &end) != 1 || end == 0 ||
      path[end] != '\0')
    return found;
  char made_up[PATH_MAX];
  snprintf(made_up, sizeof made_up, "/sys/devices/virtual/infiniband/%s/0000", name);
  if (!resolved) return strdup(made_up);
  return strcpy(resolved, made_up);
}
