/* gradcomp's C ABI: a small, stable surface for adapters written in other languages.
 * Every call that can fail returns GRADCOMP_OK or an error code and writes a message naming
 * the tensor, setting or value at fault into `error` (error_len bytes, NUL-terminated).
 * Data types and ops use the C++ codes: dtype uint8=0 int8=1 int32=2 int64=3 float16=4
 * bfloat16=5 float32=6 float64=7 bool=8 int16=9; op sum=0 average=1 min=2 max=3 product=4
 * adasum=6 (allreduce of floating-point tensors). */
#ifndef GRADCOMP_C_API_H_
#define GRADCOMP_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gradcomp_runtime gradcomp_runtime_t;
typedef struct gradcomp_handle gradcomp_handle_t;

enum { GRADCOMP_OK = 0, GRADCOMP_INVALID_ARGUMENT = 1, GRADCOMP_ERROR = 2 };

/** Collective: starts gradcomp over MPI's world with settings from the environment. */
int gradcomp_init(gradcomp_runtime_t** runtime, char* error, size_t error_len);
/** Stops the runtime (pending operations fail) and frees it. */
void gradcomp_shutdown(gradcomp_runtime_t* runtime);

int gradcomp_rank(const gradcomp_runtime_t* runtime);
int gradcomp_size(const gradcomp_runtime_t* runtime);
int gradcomp_local_rank(const gradcomp_runtime_t* runtime);
int gradcomp_local_size(const gradcomp_runtime_t* runtime);
int gradcomp_cross_rank(const gradcomp_runtime_t* runtime);
int gradcomp_cross_size(const gradcomp_runtime_t* runtime);

/** Enqueues output = op over ranks of input (output may equal input). */
int gradcomp_allreduce_async(gradcomp_runtime_t* runtime, const char* name, int dtype, const int64_t* shape, int ndim,
                             const void* input, void* output, int op, double prescale, double postscale,
                             gradcomp_handle_t** handle, char* error, size_t error_len);
/** Enqueues an allgather along the first dimension; the result is read with gradcomp_handle_output. */
int gradcomp_allgather_async(gradcomp_runtime_t* runtime, const char* name, int dtype, const int64_t* shape, int ndim,
                             const void* input, gradcomp_handle_t** handle, char* error, size_t error_len);
/** Enqueues a broadcast of root's buffer into every rank's buffer. */
int gradcomp_broadcast_async(gradcomp_runtime_t* runtime, const char* name, int dtype, const int64_t* shape,
                             int ndim, void* buffer, int root, gradcomp_handle_t** handle, char* error,
                             size_t error_len);
/** Blocks until every rank has called it. */
int gradcomp_barrier(gradcomp_runtime_t* runtime, char* error, size_t error_len);
/** Blocks until every rank has joined; `last_rank` receives the last rank to join. */
int gradcomp_join(gradcomp_runtime_t* runtime, int* last_rank, char* error, size_t error_len);

/** 1 once the operation finished, 0 otherwise; never blocks. */
int gradcomp_poll(const gradcomp_handle_t* handle);
/** Blocks until the operation finished; returns its status. */
int gradcomp_wait(gradcomp_handle_t* handle, char* error, size_t error_len);
/** After a successful wait: the runtime-allocated result (allgather) and its shape. */
int gradcomp_handle_output(const gradcomp_handle_t* handle, const void** data, size_t* bytes, const int64_t** shape,
                           int* ndim);
/** Frees a handle (the operation itself is not cancelled). */
void gradcomp_handle_free(gradcomp_handle_t* handle);

#ifdef __cplusplus
}
#endif

#endif /* GRADCOMP_C_API_H_ */
