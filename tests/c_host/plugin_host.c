/*
 * A minimal stand-in for NCCL's plugin loader, used by the tests: it dlopens a plugin with
 * RTLD_NOW | RTLD_LOCAL, looks up the data symbol ncclNetPlugin_v8, calls init with a C variadic
 * logger, then devices and getProperties, and prints one fact per line for the test to parse.
 *
 * usage: plugin_host PLUGIN.so [--misuse] [--reload]
 *   --misuse  also make the calls NCCL must never make (NULL out-pointers, an index past the
 *             last device) and print their result codes.
 *   --reload  also dlclose, dlopen again and re-run init/devices, as NCCL does when a plugin's
 *             last communicator is destroyed and a new one is created.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "nccl_net_v8.h"

static void capture_logger(ncclDebugLogLevel level, unsigned long flags, const char *file,
                           int line, const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("LOG level=%d flags=%lu src=%s:%d msg=%s\n", (int)level, flags, file, line, msg);
  fflush(stdout);
}

static ncclNet_v8_t *load(const char *path, void **lib) {
  *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!*lib) {
    printf("ERROR dlopen: %s\n", dlerror());
    return NULL;
  }
  ncclNet_v8_t *net = (ncclNet_v8_t *)dlsym(*lib, "ncclNetPlugin_v8");
  if (!net) printf("ERROR dlsym ncclNetPlugin_v8: %s\n", dlerror());
  return net;
}

static int list_devices(ncclNet_v8_t *net) {
  int ndev = -1;
  ncclResult_t rc = net->devices(&ndev);
  printf("CALL devices rc=%d ndev=%d\n", (int)rc, ndev);
  for (int i = 0; i < ndev; i++) {
    ncclNetProperties_v8_t p;
    memset(&p, 0xab, sizeof p);
    rc = net->getProperties(i, &p);
    printf("DEV index=%d rc=%d name=%s pciPath=%s guid=0x%llx ptrSupport=%d regIsGlobal=%d "
           "speed=%d port=%d latency=%g maxComms=%d maxRecvs=%d netDeviceType=%d "
           "netDeviceVersion=%d\n",
           i, (int)rc, p.name ? p.name : "(null)", p.pciPath ? p.pciPath : "(null)",
           (unsigned long long)p.guid, p.ptrSupport, p.regIsGlobal, p.speed, p.port,
           (double)p.latency, p.maxComms, p.maxRecvs, (int)p.netDeviceType, p.netDeviceVersion);
  }
  return ndev;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN.so [--misuse] [--reload]\n", argv[0]);
    return 2;
  }
  int misuse = 0, reload = 0;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--misuse") == 0) {
      misuse = 1;
    } else if (strcmp(argv[i], "--reload") == 0) {
      reload = 1;
    } else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  void *lib;
  ncclNet_v8_t *net = load(argv[1], &lib);
  if (!net) return 2;
  printf("NAME %s\n", net->name);
  printf("ENTRIES init=%d devices=%d getProperties=%d listen=%d connect=%d accept=%d regMr=%d "
         "deregMr=%d isend=%d irecv=%d iflush=%d test=%d closeSend=%d closeRecv=%d "
         "closeListen=%d\n",
         !!net->init, !!net->devices, !!net->getProperties, !!net->listen, !!net->connect,
         !!net->accept, !!net->regMr, !!net->deregMr, !!net->isend, !!net->irecv, !!net->iflush,
         !!net->test, !!net->closeSend, !!net->closeRecv, !!net->closeListen);
  printf("CALL init rc=%d\n", (int)net->init(capture_logger));
  int ndev = list_devices(net);

  if (misuse) {
    ncclNetProperties_v8_t p;
    printf("CALL getProperties(out-of-range) rc=%d\n", (int)net->getProperties(ndev, &p));
    printf("CALL getProperties(NULL) rc=%d\n", (int)net->getProperties(0, NULL));
    printf("CALL devices(NULL) rc=%d\n", (int)net->devices(NULL));
  }

  if (reload) {
    void *first = (void *)net;
    dlclose(lib);
    net = load(argv[1], &lib);
    if (!net) return 2;
    printf("RELOAD same_address=%d\n", (void *)net == first);
    printf("CALL init rc=%d\n", (int)net->init(capture_logger));
    list_devices(net);
    dlclose(lib);
  }
  return 0;
}
