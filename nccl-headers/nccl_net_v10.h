/*
 * ncclNet plugin ABI, version 10, as this project understands it.
 *
 * Loaded by NCCL 2.26 and later. Changes from version 9: init also gets a profiler callback;
 * connect gets the communicator's config (its traffic class); isend and irecv get profiler
 * handles. Properties and virtual-device lists are laid out as in version 9. The shared types
 * are in nccl_net_common.h, which says how these files were written and are checked.
 */
#ifndef NCCL_NET_RSIB_NCCL_NET_V10_H
#define NCCL_NET_RSIB_NCCL_NET_V10_H

#include "nccl_net_v9.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

/* A communicator's network configuration. */
typedef struct {
  int trafficClass; /* QoS class asked for, or NCCL_NET_TRAFFIC_CLASS_UNDEF */
} ncclNetCommConfig_v10_t;

/* The table exported as the data symbol ncclNetPlugin_v10. 160 bytes: a name and 19 entries. */
typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t *config, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v10_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v10_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                              int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                        void *phandle, void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                        void **mhandles, void **phandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v10_t *props);
} ncclNet_v10_t;

#ifdef __cplusplus
}
#endif

#endif /* NCCL_NET_RSIB_NCCL_NET_V10_H */
