/*
 * A fixture ncclNet v12 plugin for testing clients (the benchmark, the driver), written for this
 * project. It behaves the way real plugins are allowed to and careless clients trip over:
 *
 * - init calls the logger unconditionally (NCCL always passes one);
 * - the exported table starts with every entry but init failing, and init rewrites the table
 *   with the working entries (a client that copied the table before init, or cached entries,
 *   calls the failing ones).
 *
 * Transport: one device ("fixture0"); each comm is a TCP connection on 127.0.0.1; a message is
 * an 8-byte length followed by the payload; isend writes the whole message (blocking), and test
 * of a receive reads the next messages in order (blocking) until that receive is filled;
 * oversized messages are truncated to the posted size. One receive per irecv (maxRecvs 1).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nccl_net_v12.h"

#define MAGIC 0x46495854u /* "FIXT" */
#define MAX_REQS 64

struct handle {
  uint32_t magic;
  uint16_t port;
};
struct listen_comm {
  int fd;
};
struct comm;
struct request {
  struct comm *owner;
  int used, done, is_recv;
  size_t size; /* bytes sent or received */
  char *data;
  size_t capacity;
};
struct comm {
  int fd;
  struct request reqs[MAX_REQS];
  int recv_order[MAX_REQS]; /* receives in posting order, a ring */
  int head, tail;
};

static ncclDebugLogger_t logger;

static int full_io(int fd, void *buf, size_t len, int writing) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static ncclResult_t fx_devices(int *ndev) {
  *ndev = 1;
  return ncclSuccess;
}

static ncclResult_t fx_get_properties(int dev, ncclNetProperties_v12_t *props) {
  if (dev != 0) return ncclInternalError;
  memset(props, 0, sizeof *props);
  props->name = "fixture0";
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = 10000;
  props->maxComms = 1024;
  props->maxRecvs = 1;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->vProps.ndevs = 1;
  props->maxP2pBytes = 1ULL << 30;
  props->maxCollBytes = 1ULL << 30;
  props->maxMultiRequestSize = 1;
  props->railId = NCCL_NET_ID_UNDEF;
  props->planeId = NCCL_NET_ID_UNDEF;
  return ncclSuccess;
}

static ncclResult_t fx_listen(void *ctx, int dev, void *handle, void **listen_comm) {
  (void)ctx;
  (void)dev;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16) ||
      getsockname(fd, (struct sockaddr *)&a, &len))
    return ncclSystemError;
  struct handle h = {MAGIC, ntohs(a.sin_port)};
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  memcpy(handle, &h, sizeof h);
  struct listen_comm *lc = calloc(1, sizeof *lc);
  lc->fd = fd;
  *listen_comm = lc;
  return ncclSuccess;
}

static struct comm *new_comm(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct comm *c = calloc(1, sizeof *c);
  c->fd = fd;
  return c;
}

static ncclResult_t fx_connect(void *ctx, int dev, void *handle, void **send_comm,
                               ncclNetDeviceHandle_v12_t **dev_comm) {
  (void)ctx;
  (void)dev;
  (void)dev_comm;
  struct handle h;
  memcpy(&h, handle, sizeof h);
  if (h.magic != MAGIC) return ncclInternalError;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(h.port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) return ncclRemoteError;
  *send_comm = new_comm(fd);
  return ncclSuccess;
}

static ncclResult_t fx_accept(void *listen_comm, void **recv_comm,
                              ncclNetDeviceHandle_v12_t **dev_comm) {
  (void)dev_comm;
  struct listen_comm *lc = listen_comm;
  int fd = accept(lc->fd, NULL, NULL);
  if (fd < 0) {
    *recv_comm = NULL;
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? ncclSuccess : ncclSystemError;
  }
  /* accept() does not pass O_NONBLOCK on: the comm's socket blocks, as test expects. */
  *recv_comm = new_comm(fd);
  return ncclSuccess;
}

static ncclResult_t fx_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
  (void)comm;
  (void)data;
  (void)size;
  if (type != NCCL_PTR_HOST) return ncclInternalError;
  *mhandle = (void *)0x1234;
  return ncclSuccess;
}

static ncclResult_t fx_dereg_mr(void *comm, void *mhandle) {
  (void)comm;
  (void)mhandle;
  return ncclSuccess;
}

static struct request *new_request(struct comm *c) {
  for (int i = 0; i < MAX_REQS; i++) {
    if (!c->reqs[i].used) {
      memset(&c->reqs[i], 0, sizeof c->reqs[i]);
      c->reqs[i].owner = c;
      c->reqs[i].used = 1;
      return &c->reqs[i];
    }
  }
  return NULL;
}

static ncclResult_t fx_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                             void *phandle, void **request) {
  (void)tag;
  (void)mhandle;
  (void)phandle;
  struct comm *c = send_comm;
  struct request *r = new_request(c);
  if (!r) {
    *request = NULL;
    return ncclSuccess;
  }
  uint64_t len = size;
  if (full_io(c->fd, &len, sizeof len, 1) || full_io(c->fd, data, size, 1)) return ncclRemoteError;
  r->done = 1;
  r->size = size;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t fx_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                             void **mhandles, void **phandles, void **request) {
  (void)tags;
  (void)mhandles;
  (void)phandles;
  struct comm *c = recv_comm;
  if (n != 1) return ncclInternalError;
  struct request *r = new_request(c);
  if (!r) {
    *request = NULL;
    return ncclSuccess;
  }
  r->is_recv = 1;
  r->data = data[0];
  r->capacity = sizes[0];
  c->recv_order[c->tail++ % MAX_REQS] = (int)(r - c->reqs);
  *request = r;
  return ncclSuccess;
}

/* Receive the next message into the oldest posted receive. */
static int receive_next(struct comm *c) {
  struct request *r = &c->reqs[c->recv_order[c->head++ % MAX_REQS]];
  uint64_t len;
  if (full_io(c->fd, &len, sizeof len, 0)) return -1;
  size_t keep = len < r->capacity ? len : r->capacity;
  if (full_io(c->fd, r->data, keep, 0)) return -1;
  for (uint64_t rest = len - keep; rest > 0;) {
    char sink[4096];
    size_t chunk = rest < sizeof sink ? rest : sizeof sink;
    if (full_io(c->fd, sink, chunk, 0)) return -1;
    rest -= chunk;
  }
  r->size = keep;
  r->done = 1;
  return 0;
}

static ncclResult_t fx_test(void *request, int *done, int *sizes) {
  struct request *r = request;
  struct comm *c = r->owner;
  while (r->is_recv && !r->done) {
    if (receive_next(c)) return ncclRemoteError;
  }
  *done = 1;
  if (sizes) sizes[0] = (int)r->size;
  r->used = 0;
  return ncclSuccess;
}

static ncclResult_t fx_close(void *comm) {
  struct comm *c = comm;
  close(c->fd);
  free(c);
  return ncclSuccess;
}

static ncclResult_t fx_close_listen(void *listen_comm) {
  struct listen_comm *lc = listen_comm;
  close(lc->fd);
  free(lc);
  return ncclSuccess;
}

static ncclResult_t fx_finalize(void *ctx) {
  (void)ctx;
  return ncclSuccess;
}

/* Every entry of the table before init. */
static ncclResult_t not_initialised(void) {
  return ncclInternalError;
}

static ncclResult_t fx_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v12_t *config,
                            ncclDebugLogger_t log, ncclProfilerCallback_t prof);

/* Non-const on purpose: init rewrites it. The placeholder takes each slot's type through a cast
 * via void (*)(void), which C allows for function pointers. */
ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = "Fixture",
    .init = fx_init,
    .devices = (ncclResult_t(*)(int *))(void (*)(void))not_initialised,
    .getProperties = (ncclResult_t(*)(int, ncclNetProperties_v12_t *))(void (*)(void))not_initialised,
    .listen = (ncclResult_t(*)(void *, int, void *, void **))(void (*)(void))not_initialised,
    .connect = (ncclResult_t(*)(void *, int, void *, void **,
                                ncclNetDeviceHandle_v12_t **))(void (*)(void))not_initialised,
    .accept = (ncclResult_t(*)(void *, void **, ncclNetDeviceHandle_v12_t **))(void (*)(void))not_initialised,
    .regMr = (ncclResult_t(*)(void *, void *, size_t, int, void **))(void (*)(void))not_initialised,
    .deregMr = (ncclResult_t(*)(void *, void *))(void (*)(void))not_initialised,
    .isend = (ncclResult_t(*)(void *, void *, size_t, int, void *, void *, void **))(void (*)(void))not_initialised,
    .irecv = (ncclResult_t(*)(void *, int, void **, size_t *, int *, void **, void **, void **))(void (*)(void))not_initialised,
    .test = (ncclResult_t(*)(void *, int *, int *))(void (*)(void))not_initialised,
    .closeSend = (ncclResult_t(*)(void *))(void (*)(void))not_initialised,
    .closeRecv = (ncclResult_t(*)(void *))(void (*)(void))not_initialised,
    .closeListen = (ncclResult_t(*)(void *))(void (*)(void))not_initialised,
    .finalize = fx_finalize,
};

static ncclResult_t fx_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v12_t *config,
                            ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  (void)config;
  (void)prof;
  logger = log;
  /* No NULL check, as real plugins do: NCCL always passes a logger. */
  logger(NCCL_LOG_INFO, NCCL_INIT | NCCL_NET, __FILE__, __LINE__,
         "fixture plugin init for comm %lx", (unsigned long)comm_id);
  *ctx = &ncclNetPlugin_v12;
  ncclNetPlugin_v12.devices = fx_devices;
  ncclNetPlugin_v12.getProperties = fx_get_properties;
  ncclNetPlugin_v12.listen = fx_listen;
  ncclNetPlugin_v12.connect = fx_connect;
  ncclNetPlugin_v12.accept = fx_accept;
  ncclNetPlugin_v12.regMr = fx_reg_mr;
  ncclNetPlugin_v12.deregMr = fx_dereg_mr;
  ncclNetPlugin_v12.isend = fx_isend;
  ncclNetPlugin_v12.irecv = fx_irecv;
  ncclNetPlugin_v12.test = fx_test;
  ncclNetPlugin_v12.closeSend = fx_close;
  ncclNetPlugin_v12.closeRecv = fx_close;
  ncclNetPlugin_v12.closeListen = fx_close_listen;
  return ncclSuccess;
}
