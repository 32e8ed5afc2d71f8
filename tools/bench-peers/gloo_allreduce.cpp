// SPDX-License-Identifier: Apache-2.0
// gloo_allreduce: times Gloo's ring-chunked all-reduce (float32 sum) over
// its TCP transport per message size, the Gloo peer of tools/bench-peers.sh
// (built there with g++ against Debian's libgloo-dev).
//
//   gloo_allreduce RANK SIZE STORE_DIR BYTES...
//
// The processes of a job are started by the caller, one per rank; they meet
// through a gloo::rendezvous::FileStore in STORE_DIR (an empty directory)
// and connect a full mesh on 127.0.0.1. Per size: a data check (integer
// inputs, exact sums), warm-up, 3 repetitions of back-to-back calls each
// after a barrier; time = the slowest rank's (max over ranks through Gloo),
// the median repetition. Rank 0 prints one line per size:
//   <bytes> <time_us> <busbw_GBps> <wrong>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

int iterations(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((256u << 20) / std::max<std::size_t>(bytes, 1), 5, 1000));
}

float input(int rank, std::size_t i) { return static_cast<float>((i * 7 + rank * 3) % 9) - 4.0f; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: gloo_allreduce RANK SIZE STORE_DIR BYTES...\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  try {
    gloo::rendezvous::FileStore store(argv[3]);
    gloo::transport::tcp::attr attr("127.0.0.1");
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::seconds(120));
    context->connectFullMesh(store, device);
    gloo::BarrierAllToOne barrier(context);
    for (int a = 4; a < argc; ++a) {
      const std::size_t bytes = std::strtoull(argv[a], nullptr, 10);
      const std::size_t count = std::max<std::size_t>(bytes / sizeof(float), 1);
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = input(rank, i);
      std::vector<float*> ptrs{data.data()};
      gloo::AllreduceRingChunked<float> allreduce(context, ptrs, static_cast<int>(count));
      allreduce.run();
      long wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < size; ++r) want += input(r, i);
        wrong += data[i] != want;
      }
      const int iters = iterations(count * sizeof(float));
      for (int i = 0; i < 3; ++i) allreduce.run();
      std::vector<double> samples(3);
      for (int rep = 0; rep < 3; ++rep) {
        barrier.run();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) allreduce.run();
        samples[rep] =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            iters;
      }
      // Slowest rank per repetition, and the wrong elements of every rank.
      std::vector<double> figures = samples;
      figures.push_back(static_cast<double>(wrong));
      std::vector<double*> fptrs{figures.data()};
      gloo::AllreduceRing<double> slowest(context, fptrs, 3, gloo::ReductionFunction<double>::max);
      slowest.run();
      std::vector<double> wrong_sum{static_cast<double>(wrong)};
      std::vector<double*> wptrs{wrong_sum.data()};
      gloo::AllreduceRing<double> total(context, wptrs, 1);
      total.run();
      if (rank == 0) {
        std::sort(figures.begin(), figures.begin() + 3);
        const double t = figures[1];
        const double busbw = static_cast<double>(count * sizeof(float)) / t / 1e3 * 2.0 * (size - 1) / size;
        std::printf("%zu %.2f %.3f %.0f\n", count * sizeof(float), t, busbw, wrong_sum[0]);
        std::fflush(stdout);
      }
    }
    barrier.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce: rank %d of %d: %s\n", rank, size, e.what());
    return 1;
  }
  return 0;
}
