/*
 * ncclNet plugin ABI, version 9, as this project understands it.
 *
 * Loaded by NCCL 2.24 and later. Changes from version 8: sizes of isend/irecv are size_t;
 * properties gain forceFlush, the list of physical devices a device is made of (vProps) and the
 * largest transfer sizes; makeVDevice lets NCCL fuse devices. The shared types are in
 * nccl_net_common.h, which says how these files were written and are checked.
 */
#ifndef NCCL_NET_RSIB_NCCL_NET_V9_H
#define NCCL_NET_RSIB_NCCL_NET_V9_H

#include "nccl_net_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Physical devices making up a virtual one. 20 bytes. */
typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V11];
} ncclNetVDeviceProps_v9_t;

/* What getProperties reports for one device. 104 bytes. */
typedef struct {
  char *name;           /* unique device name (NCCL's topology key) */
  char *pciPath;        /* realpath of the device's sysfs PCI directory, NULL if none */
  uint64_t guid;        /* NIC identity; same guid and port = same physical port */
  int ptrSupport;       /* NCCL_PTR_* bits */
  int regIsGlobal;      /* 1 = registrations are cached and not tied to a comm */
  int forceFlush;       /* 1 = NCCL must flush after every receive into GPU memory */
  int speed;            /* Mbps */
  int port;             /* port number */
  float latency;        /* microseconds, 0 = NCCL's default */
  int maxComms;         /* connections the device can hold */
  int maxRecvs;         /* largest n accepted by a grouped irecv */
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps; /* the physical devices it is made of */
  size_t maxP2pBytes;   /* largest point-to-point transfer */
  size_t maxCollBytes;  /* largest collective transfer */
} ncclNetProperties_v9_t;

/* The table exported as the data symbol ncclNetPlugin_v9. 160 bytes: a name and 19 entries. */
typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v9_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v9_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                              int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                        void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                        void **mhandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v9_t *props);
} ncclNet_v9_t;

#ifdef __cplusplus
}
#endif

#endif /* NCCL_NET_RSIB_NCCL_NET_V9_H */
