// Memory-bound reference kernels for tools/bench_stages.py (issue 29): the
// memory traffic of each stage of the sparse step with nothing else (no
// hashing, no TensorFlow, no checks), on all cores, so a stage's time can
// be put beside the limit of this machine. Not part of the op library.
//
//   membound R U N DIM THREADS CALLS IDX_FILE
//
// IDX_FILE holds the batch's N int32 indices into [0, U) in batch order
// (the combine's reads). Prints one line per kernel: "<name> <ms per call>"
// (the median of CALLS calls).
//   gather_u   copy U random DIM-float rows of an [R, DIM] table
//   gather_n   sum-read the rows of N indices (batch order) from [U, DIM]
//   scatter_n  add N DIM-float rows into [U, DIM] at the N indices
//   rmw_u      Adagrad-shaped read-modify-write of U random rows of
//              [R, 2 * DIM] (weights + accumulator side by side)
//   probe_n    per id: read its 8-byte key (in order), one random 16-byte
//              read from a [2U] array of pairs, write a 4-byte index
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace {

template <typename Fn>
void Parallel(int threads, int64_t n, Fn fn) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    pool.emplace_back([=] { fn(t, b, e); });
  }
  for (auto& th : pool) th.join();
}

template <typename Fn>
double MedianMs(int calls, Fn fn) {
  std::vector<double> ms;
  fn();  // warm
  for (int c = 0; c < calls; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: membound R U N DIM THREADS CALLS IDX_FILE\n");
    return 2;
  }
  const int64_t R = std::atoll(argv[1]), U = std::atoll(argv[2]),
                N = std::atoll(argv[3]);
  const int dim = std::atoi(argv[4]), threads = std::atoi(argv[5]),
            calls = std::atoi(argv[6]);
  std::vector<int32_t> idx(N);
  FILE* f = std::fopen(argv[7], "rb");
  if (!f || std::fread(idx.data(), sizeof(int32_t), N, f) != size_t(N)) {
    std::fprintf(stderr, "membound: cannot read %lld indices from %s\n",
                 static_cast<long long>(N), argv[7]);
    return 2;
  }
  std::fclose(f);
  std::mt19937_64 rng(42);
  std::vector<int64_t> rand_u(U);
  for (auto& r : rand_u) r = static_cast<int64_t>(rng() % R);
  std::vector<int64_t> rand_probe(N);
  for (auto& r : rand_probe) r = static_cast<int64_t>(rng() % (2 * U));

  std::vector<float> table(R * dim, 0.5f), wide(R * 2 * dim, 0.1f);
  std::vector<float> e(U * dim, 0.25f), out(U * dim), grad(U * dim, 1e-3f);
  std::vector<float> rows_n(N * dim, 1e-3f);
  std::vector<uint64_t> probe(4 * U, 7), keys(N, 3);
  std::vector<int32_t> idx_out(N);
  std::vector<double> sink(threads);

  std::printf("gather_u %.4f\n", MedianMs(calls, [&] {
    Parallel(threads, U, [&](int, int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        if (i + 8 < end)
          __builtin_prefetch(&table[rand_u[i + 8] * dim]);
        std::copy_n(&table[rand_u[i] * dim], dim, &out[i * dim]);
      }
    });
  }));
  std::printf("gather_n %.4f\n", MedianMs(calls, [&] {
    Parallel(threads, N, [&](int t, int64_t b, int64_t end) {
      float acc[64] = {0};
      for (int64_t i = b; i < end; ++i) {
        const float* row = &e[int64_t(idx[i]) * dim];
        for (int d = 0; d < dim; ++d) acc[d] += row[d];
      }
      double s = 0;
      for (int d = 0; d < dim; ++d) s += acc[d];
      sink[t] = s;
    });
  }));
  std::printf("scatter_n %.4f\n", MedianMs(calls, [&] {
    // Each thread owns the destination rows of its half of [0, U) and
    // scans all indices (4 bytes each): no atomics, no reduction.
    std::fill(out.begin(), out.end(), 0.0f);
    Parallel(threads, U, [&](int, int64_t lo, int64_t hi) {
      for (int64_t i = 0; i < N; ++i) {
        const int64_t r = idx[i];
        if (r < lo || r >= hi) continue;
        float* dst = &out[r * dim];
        const float* src = &rows_n[i * dim];
        for (int d = 0; d < dim; ++d) dst[d] += src[d];
      }
    });
  }));
  std::printf("rmw_u %.4f\n", MedianMs(calls, [&] {
    Parallel(threads, U, [&](int, int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        if (i + 8 < end)
          __builtin_prefetch(&wide[rand_u[i + 8] * 2 * dim], 1);
        float* w = &wide[rand_u[i] * 2 * dim];
        float* a = w + dim;
        const float* g = &grad[i * dim];
        for (int d = 0; d < dim; ++d) {
          a[d] += g[d] * g[d];
          w[d] -= 0.05f * g[d] / std::sqrt(a[d]);
        }
      }
    });
  }));
  std::printf("probe_n %.4f\n", MedianMs(calls, [&] {
    Parallel(threads, N, [&](int t, int64_t b, int64_t end) {
      uint64_t s = 0;
      for (int64_t i = b; i < end; ++i) {
        if (i + 8 < end) __builtin_prefetch(&probe[2 * rand_probe[i + 8]]);
        s += probe[2 * rand_probe[i]] ^ probe[2 * rand_probe[i] + 1] ^ keys[i];
        idx_out[i] = static_cast<int32_t>(s);
      }
      sink[t] = double(s);
    });
  }));
  double total = 0;
  for (double s : sink) total += s;
  std::fprintf(stderr, "(sink %g)\n", total);
  return 0;
}
