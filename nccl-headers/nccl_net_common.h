/*
 * Types shared by every version of the ncclNet plugin ABI (8 to 12), as this project understands
 * them.
 *
 * Written for nccl-net-rsib from the documented facts of the ABI (field order, widths and
 * constant values); no text of NCCL's own headers is reproduced here. The Rust mirror types in
 * src/abi/types.rs must agree with these files field by field: tests/abi_layout.rs compiles a C
 * program against them and compares every size, offset and constant with the Rust side.
 *
 * Target: LP64 (x86_64, aarch64 Linux).
 */
#ifndef NCCL_NET_RSIB_NCCL_NET_COMMON_H
#define NCCL_NET_RSIB_NCCL_NET_COMMON_H

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

/* Device-side handle for offload plugins; host plugins never fill it. 32 bytes, the same in
 * every version from 8 to 12. */
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void *handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v12_t;

/* NCCL's profiler callback (v10+). A plugin starts an event with type
 * NCCL_PROFILER_NET_EVENT_START, the pHandle NCCL passed with the request, its pluginId and a
 * descriptor; NCCL writes the event's handle to *eHandle. It stops it with
 * NCCL_PROFILER_NET_EVENT_STOP and that handle. */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *pHandle,
                                               int64_t pluginId, void *extData);

#define NCCL_PROFILER_NET_EVENT_START 0
#define NCCL_PROFILER_NET_EVENT_STOP 1
#define NCCL_PROFILER_NET_TYPE_IB (1 << 16) /* pluginId: IB-style descriptors */
#define NCCL_PROFILER_NET_IB_VER 1          /* pluginId: their version */
#define NCCL_PROFILE_QP 1                   /* descriptor type: one work request on a QP */

/* A work request on a QP: the plugin's device, the request's id and ibv_wr_opcode, the QP's
 * number and the bytes it moves. */
typedef struct {
  int device;
  uint64_t wr_id;
  int opcode;
  int qpNum;
  size_t length;
} ncclProfilerNetIbQp_v1_t;

/* extData of an IB-style event (version 1). */
typedef struct {
  uint8_t type;
  union {
    ncclProfilerNetIbQp_v1_t qp;
  };
} ncclProfilerNetIbDescr_v1_t;

#define NCCL_NET_MAX_DEVS_PER_NIC_V11 4 /* members of a virtual device, v9 to v11 */
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8 /* members of a virtual device, v12 */
#define NCCL_NET_TRAFFIC_CLASS_UNDEF -1 /* a communicator without a traffic class */
#define NCCL_NET_ID_UNDEF -1            /* rail or plane unknown (v12) */
#define NCCL_MAX_NET_SIZE_BYTES (1ULL << 40) /* largest maxP2pBytes/maxCollBytes NCCL accepts */

#ifdef __cplusplus
}
#endif

#endif /* NCCL_NET_RSIB_NCCL_NET_COMMON_H */
