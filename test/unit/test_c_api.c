/* The C ABI from plain C (checks the header compiles as C): allreduce, allgather, broadcast,
 * barrier, join and error reporting. Run under mpirun by ctest. */
#include <stdio.h>
#include <string.h>

#include "core/c_api.h"

#define CHECK(cond, ...)                   \
  do {                                     \
    if (!(cond)) {                         \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);        \
      fprintf(stderr, "\n");               \
      return 1;                            \
    }                                      \
  } while (0)

int main(void) {
  char err[512];
  gradcomp_runtime_t* rt = NULL;
  CHECK(gradcomp_init(&rt, err, sizeof err) == GRADCOMP_OK, "init: %s", err);
  const int rank = gradcomp_rank(rt), size = gradcomp_size(rt);
  CHECK(size >= 1 && rank >= 0 && rank < size, "rank %d size %d", rank, size);

  float x[4] = {1, 2, 3, 4};
  const int64_t shape[1] = {4};
  gradcomp_handle_t* h = NULL;
  CHECK(gradcomp_allreduce_async(rt, "x", 6, shape, 1, x, x, 0, 1.0, 1.0, &h, err, sizeof err) == GRADCOMP_OK,
        "allreduce: %s", err);
  CHECK(gradcomp_wait(h, err, sizeof err) == GRADCOMP_OK, "wait: %s", err);
  CHECK(gradcomp_poll(h) == 1, "poll after wait");
  gradcomp_handle_free(h);
  for (int i = 0; i < 4; ++i) CHECK(x[i] == (float)((i + 1) * size), "x[%d] = %f", i, x[i]);

  int32_t mine[2] = {rank, rank};
  const int64_t gshape[2] = {1, 2};
  CHECK(gradcomp_allgather_async(rt, "g", 2, gshape, 2, mine, &h, err, sizeof err) == GRADCOMP_OK, "%s", err);
  CHECK(gradcomp_wait(h, err, sizeof err) == GRADCOMP_OK, "%s", err);
  const void* data = NULL;
  size_t bytes = 0;
  const int64_t* oshape = NULL;
  int ndim = 0;
  CHECK(gradcomp_handle_output(h, &data, &bytes, &oshape, &ndim) == GRADCOMP_OK, "output");
  CHECK(ndim == 2 && oshape[0] == size && oshape[1] == 2 && bytes == (size_t)size * 8, "allgather shape");
  for (int r = 0; r < size; ++r) CHECK(((const int32_t*)data)[2 * r] == r, "allgather value");
  gradcomp_handle_free(h);

  double b[3] = {rank, rank, rank};
  const int64_t bshape[1] = {3};
  CHECK(gradcomp_broadcast_async(rt, "b", 7, bshape, 1, b, size - 1, &h, err, sizeof err) == GRADCOMP_OK, "%s", err);
  CHECK(gradcomp_wait(h, err, sizeof err) == GRADCOMP_OK, "%s", err);
  gradcomp_handle_free(h);
  CHECK(b[2] == size - 1, "broadcast value %f", b[2]);

  CHECK(gradcomp_broadcast_async(rt, "bad", 7, bshape, 1, b, size, &h, err, sizeof err) == GRADCOMP_INVALID_ARGUMENT,
        "bad root accepted");
  CHECK(strstr(err, "root rank") != NULL, "message: %s", err);
  CHECK(gradcomp_allreduce_async(rt, "t", 42, shape, 1, x, x, 0, 1, 1, &h, err, sizeof err) ==
            GRADCOMP_INVALID_ARGUMENT && strstr(err, "unknown data type code 42") != NULL,
        "bad dtype: %s", err);

  CHECK(gradcomp_barrier(rt, err, sizeof err) == GRADCOMP_OK, "%s", err);
  int last = -1;
  CHECK(gradcomp_join(rt, &last, err, sizeof err) == GRADCOMP_OK && last >= 0 && last < size, "join %d", last);
  gradcomp_shutdown(rt);
  if (rank == 0) printf("c api: all checks passed on %d ranks\n", size);
  return 0;
}
