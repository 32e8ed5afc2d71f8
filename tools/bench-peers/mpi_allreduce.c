/* SPDX-License-Identifier: Apache-2.0
 * mpi_allreduce: times MPI_Allreduce (float32 sum) per message size, the
 * Open MPI peer of tools/bench-peers.sh. Built with mpicc by that script.
 *
 *   mpirun -np N mpi_allreduce 8 65536 1048576 ...
 *
 * Per size: a data check (integer-valued inputs, exact sums), warm-up, then
 * 3 repetitions of back-to-back calls, each after a barrier; time = the
 * slowest rank's, the median repetition. Rank 0 prints one line per size:
 *   <bytes> <time_us> <busbw_GBps> <wrong>
 * with nccl-tests' bus bandwidth: bytes / time * 2 (N - 1) / N. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int iterations(size_t bytes) {
  size_t it = (256u << 20) / (bytes ? bytes : 1);
  if (it < 5) it = 5;
  if (it > 1000) it = 1000;
  return (int)it;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int a = 1; a < argc; ++a) {
    const size_t bytes = strtoull(argv[a], NULL, 10);
    const size_t count = bytes / sizeof(float) ? bytes / sizeof(float) : 1;
    float* in = malloc(count * sizeof(float));
    float* out = malloc(count * sizeof(float));
    if (!in || !out) {
      fprintf(stderr, "mpi_allreduce: rank %d: out of memory for %zu bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < count; ++i) in[i] = (float)((i * 7 + (size_t)rank * 3) % 9) - 4.0f;
    memset(out, 0, count * sizeof(float));
    MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += (float)((i * 7 + (size_t)r * 3) % 9) - 4.0f;
      wrong += out[i] != want;
    }
    long all_wrong = 0;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    const int iters = iterations(count * sizeof(float));
    for (int i = 0; i < 3; ++i)
      MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double samples[3], slowest[3];
    for (int rep = 0; rep < 3; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i)
        MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      samples[rep] = (MPI_Wtime() - t0) * 1e6 / iters;
    }
    MPI_Reduce(samples, slowest, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      qsort(slowest, 3, sizeof(double), cmp_double);
      const double t = slowest[1];
      const double busbw = (double)(count * sizeof(float)) / t / 1e3 * 2.0 * (size - 1) / size;
      printf("%zu %.2f %.3f %ld\n", count * sizeof(float), t, busbw, all_wrong);
      fflush(stdout);
    }
    free(in);
    free(out);
  }
  MPI_Finalize();
  return 0;
}
