// An emulated NCCL on the emulated CUDA runtime (cuda_runtime.h), for the ranks of one process
// (test threads, one GPU each): ops/comm/nccl_communicator.cc compiles against this header
// instead of NCCL's and runs in CI (nccl_emulation.cc).
//
// Each operation is stream work on the stream it is given: it meets its peers' operations when
// each rank's host synchronizes with its stream, as NCCL's kernels meet on GPUs. What it checks
// that a GPU might let pass by luck, each a clear error:
//  - two ranks of a communicator on one GPU (NCCL's "duplicate GPU"), a buffer that is not device
//    memory of the communicator's GPU in full, a stream of another GPU, a root or peer outside
//    the communicator (ncclInvalidArgument / ncclInvalidUsage when called);
//  - the ranks of a collective disagreeing on its kind, count, type, operation or root, and a
//    receive whose size is not its send's (fatal, naming both);
//  - an operation whose peers do not come within 5 minutes (fatal, naming the missing ranks:
//    NCCL would hang).
// Reductions run in rank order with gradcomp's host arithmetic (float16 and bfloat16 in float32,
// rounded back): NCCL's ring may order a floating-point sum differently.
#pragma once

#include <cstddef>

#include "test/support/cuda_emulation/cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE 22809
#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SPLIT_NOCOLOR -1

struct ncclComm;
using ncclComm_t = ncclComm*;
struct ncclConfig_t;  // the split's options: only null is taken

struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclDataType_t {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
};

enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

const char* ncclGetErrorString(ncclResult_t result);
/// The message of this thread's last failed call.
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
/// Blocks until all `nranks` ranks have joined, on the calling thread's current device.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(ncclComm_t comm, int* device);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

namespace gc_cuda_emulation {
/// Bytes the emulated NCCL's operations have sent or reduced so far, every rank's (tests: whether
/// a run used NCCL).
size_t NcclBytes();
}  // namespace gc_cuda_emulation
