/*
 * ncclNet plugin ABI, version 8, as this project understands it.
 *
 * Written for nccl-net-rsib from the documented facts of the ABI (field order, widths and
 * constant values); no text of NCCL's own headers is reproduced here. The Rust mirror types in
 * src/abi/types.rs must agree with this file field by field: tests/abi_layout.rs compiles a C
 * program against this header and compares every size, offset and constant with the Rust side.
 *
 * Target: LP64 (x86_64, aarch64 Linux).
 */
#ifndef NCCL_NET_RSIB_NCCL_NET_V8_H
#define NCCL_NET_RSIB_NCCL_NET_V8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return code of every entry point (a C enum: 4 bytes). */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7 /* never returned by a plugin */
} ncclResult_t;

/* Severity passed to the logger. */
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem bits passed to the logger (a plugin uses NET, plus INIT during init). */
typedef enum {
  NCCL_INIT = 0x1,
  NCCL_NET = 0x10,
  NCCL_ALL = ~0
} ncclDebugLogSubSys;

/* NCCL's logger: printf-style and variadic. The plugin always passes "%s" as the format. */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char *file, int line, const char *fmt, ...);

#define NCCL_NET_HANDLE_MAXSIZE 128 /* bytes of the listen handle */
#define NCCL_NET_MAX_REQUESTS 32    /* requests in flight per comm that a plugin must accept */
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1 /* sentinel NCCL may store in *request before irecv */

/* ptrSupport bits and the `type` argument of regMr. */
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

/* netDeviceType: a verbs plugin is a HOST device (no device-side offload). */
typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1
} ncclNetDeviceType;
#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

/* Device-side handle for offload plugins; host plugins never fill it. 32 bytes. */
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void *handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;

/* What getProperties reports for one device. 64 bytes. */
typedef struct {
  char *name;           /* unique device name (NCCL's topology key) */
  char *pciPath;        /* realpath of the device's sysfs PCI directory, NULL if none */
  uint64_t guid;        /* NIC identity; same guid and port = same physical port */
  int ptrSupport;       /* NCCL_PTR_* bits */
  int regIsGlobal;      /* 1 = registrations are cached and not tied to a comm */
  int speed;            /* Mbps */
  int port;             /* port number */
  float latency;        /* microseconds, 0 = NCCL's default */
  int maxComms;         /* connections the device can hold */
  int maxRecvs;         /* largest n accepted by a grouped irecv */
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

/* The table exported as the data symbol ncclNetPlugin_v8. 152 bytes: a name and 18 entries. */
typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v8_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v8_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                              int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
                        void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
                        void **mhandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v8_t;

#ifdef __cplusplus
}
#endif

#endif /* NCCL_NET_RSIB_NCCL_NET_V8_H */
