/* LD_PRELOAD shim for the relaxed-ordering tests: records the access flags of every memory
 * registration the plugin makes (RSIB_REG_LOG names the file) and, with RSIB_REFUSE_RO=1,
 * refuses registrations that ask for relaxed ordering with EINVAL, as a driver that cannot
 * honour the flag does. Every registration that is not refused goes to the real libibverbs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct ibv_pd;
struct ibv_mr;

#define ACCESS_RELAXED_ORDERING (1u << 20)

/* libibverbs' ibv_reg_mr calls ibv_reg_mr_iova2 through its own PLT, which lands here again:
 * only the plugin's call (depth 0) is recorded. */
static __thread int depth;

/* Log the call; returns 1 when it must be refused. */
static int screen(const char *verb, unsigned access) {
  if (depth > 0) return 0;
  const char *refuse_env = getenv("RSIB_REFUSE_RO");
  int refuse = refuse_env && refuse_env[0] == '1' && (access & ACCESS_RELAXED_ORDERING);
  const char *path = getenv("RSIB_REG_LOG");
  FILE *log = path ? fopen(path, "a") : NULL;
  if (log) {
    fprintf(log, "%s access=0x%x%s\n", verb, access, refuse ? " refused" : "");
    fclose(log);
  }
  if (refuse) errno = EINVAL;
  return refuse;
}

/* The real function: libibverbs is usually not in the global scope (the plugin that needs it
 * was dlopen'ed locally), so look it up in the library itself. */
static void *next(const char *name) {
  void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libibverbs.so.1", RTLD_NOW);
  void *sym = lib ? dlsym(lib, name) : NULL;
  if (!sym) {
    fprintf(stderr, "reg_shim: %s not found in libibverbs\n", name);
    abort();
  }
  return sym;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  struct ibv_mr *(*real)(struct ibv_pd *, void *, size_t, int) = next("ibv_reg_mr");
  if (screen("ibv_reg_mr", (unsigned)access)) return NULL;
  depth++;
  struct ibv_mr *mr = real(pd, addr, len, access);
  depth--;
  return mr;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                                unsigned access) {
  struct ibv_mr *(*real)(struct ibv_pd *, void *, size_t, uint64_t, unsigned) =
      next("ibv_reg_mr_iova2");
  if (screen("ibv_reg_mr_iova2", access)) return NULL;
  depth++;
  struct ibv_mr *mr = real(pd, addr, len, iova, access);
  depth--;
  return mr;
}
