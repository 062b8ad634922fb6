// Memory-bound reference kernels for tools/bench_stages.py (issue 29): the
// memory traffic of each stage of the sparse step with nothing else (no
// hashing, no TensorFlow, no checks), on all cores, so a stage's time can
// be put beside the limit of this machine. Not part of the op library.
//
//   membound R U N DIM THREADS CALLS IDX_FILE SEG_FILE NSEG ROW_BYTES
//
// IDX_FILE holds the batch's N int32 indices into [0, U) in the combine's
// merged order and SEG_FILE the N int32 output rows (segments, in
// [0, NSEG); each segment's ids contiguous) they are combined into. Prints
// one line per kernel: "<name> <ms per call>" (the median of CALLS calls).
// Each kernel is compiled for its row width (DIM 1 and 16 unrolled, others
// generic) and prefetches the rows it reads at random.
// ROW_BYTES is the table's memory per row (rows, index and bookkeeping:
// its memory_bytes() / size()); gather_u and rmw_u touch R rows that far
// apart (at least 2 * DIM floats), so their working set is the table's.
//   gather_u     copy the first DIM floats of U random rows
//   gather_seg   sum the rows of the N indices from [U, DIM] into their
//                segments, writing NSEG rows (a combine's traffic)
//   scatter_seg  zero [U, DIM], then add each id's segment row of
//                [NSEG, DIM] into its index's row (a combine gradient's),
//                each thread listing the ids of the rows it owns
//   rmw_u        Adagrad-shaped read-modify-write of the first 2 * DIM
//                floats (weights + accumulator side by side) of U random
//                rows
//   probe_n      per id: read its 8-byte key (in order), one random 16-byte
//                read from a [2U] array of pairs, write a 4-byte index
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

constexpr int kAhead = 16;  // prefetch distance, in ids or keys

struct Data {
  int64_t R, U, N, nseg;
  int64_t row_floats;  // the rows' stride
  int threads, calls;
  std::vector<int32_t> idx, seg;
  std::vector<int64_t> rand_u, rand_probe;
};

// Splits [0, n) into `threads` ranges whose ends fall on segment starts, so
// each segment is summed by one thread.
std::vector<int64_t> SegmentCuts(const Data& d) {
  std::vector<int64_t> cuts(d.threads + 1, d.N);
  cuts[0] = 0;
  for (int t = 1; t < d.threads; ++t) {
    int64_t c = d.N * t / d.threads;
    while (c > 0 && c < d.N && d.seg[c] == d.seg[c - 1]) ++c;
    cuts[t] = std::max(c, cuts[t - 1]);
  }
  return cuts;
}

template <int D>
void Run(const Data& d, int dim_arg) {
  const int dim = D > 0 ? D : dim_arg;
  const int64_t R = d.R, U = d.U, N = d.N;
  const int32_t* idx = d.idx.data();
  const int32_t* seg = d.seg.data();
  const int64_t stride = d.row_floats;
  std::vector<float> table(R * stride, 0.5f);
  std::vector<float> e(U * dim, 0.25f), out(U * dim), grad(U * dim, 1e-3f);
  std::vector<float> seg_out(d.nseg * dim), dseg(d.nseg * dim, 1e-3f);
  std::vector<uint64_t> probe(4 * U, 7), keys(N, 3);
  std::vector<int32_t> idx_out(N);
  std::vector<double> sink(d.threads);
  const std::vector<int64_t> cuts = SegmentCuts(d);

  std::printf("gather_u %.4f\n", MedianMs(d.calls, [&] {
    Parallel(d.threads, U, [&](int, int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        if (i + kAhead < end)
          __builtin_prefetch(&table[d.rand_u[i + kAhead] * stride]);
        const float* src = &table[d.rand_u[i] * stride];
        float* dst = &out[i * dim];
        for (int k = 0; k < dim; ++k) dst[k] = src[k];
      }
    });
  }));
  std::printf("gather_seg %.4f\n", MedianMs(d.calls, [&] {
    Parallel(d.threads, d.threads, [&](int t, int64_t, int64_t) {
      const int64_t b = cuts[t], end = cuts[t + 1];
      float acc[D > 0 ? D : 64] = {0};
      for (int64_t i = b; i < end; ++i) {
        if (i + kAhead < end)
          __builtin_prefetch(&e[int64_t(idx[i + kAhead]) * dim]);
        const float* row = &e[int64_t(idx[i]) * dim];
        for (int k = 0; k < dim; ++k) acc[k] += row[k];
        if (i + 1 == end || seg[i + 1] != seg[i]) {
          float* o = &seg_out[int64_t(seg[i]) * dim];
          for (int k = 0; k < dim; ++k) {
            o[k] = acc[k];
            acc[k] = 0;
          }
        }
      }
    });
  }));
  std::vector<std::vector<int32_t>> mine(d.threads, std::vector<int32_t>(N));
  std::printf("scatter_seg %.4f\n", MedianMs(d.calls, [&] {
    // Each thread owns the destination rows of its part of [0, U): it
    // zeroes them, lists the ids that add into them (branch-free: a skip
    // test per id would mispredict half the time), then adds those, with
    // prefetch. No atomics, no reduction.
    Parallel(d.threads, U, [&](int t, int64_t lo, int64_t hi) {
      std::fill(out.begin() + lo * dim, out.begin() + hi * dim, 0.0f);
      int32_t* list = mine[t].data();
      const uint32_t span = static_cast<uint32_t>(hi - lo);
      int64_t n = 0;
      for (int64_t i = 0; i < N; ++i) {
        list[n] = static_cast<int32_t>(i);
        n += static_cast<uint32_t>(idx[i] - lo) < span;
      }
      for (int64_t j = 0; j < n; ++j) {
        if (j + kAhead < n)
          __builtin_prefetch(&out[int64_t(idx[list[j + kAhead]]) * dim], 1);
        const int64_t i = list[j];
        float* dst = &out[int64_t(idx[i]) * dim];
        const float* src = &dseg[int64_t(seg[i]) * dim];
        for (int k = 0; k < dim; ++k) dst[k] += src[k];
      }
    });
  }));
  std::printf("rmw_u %.4f\n", MedianMs(d.calls, [&] {
    Parallel(d.threads, U, [&](int, int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        if (i + kAhead < end)
          __builtin_prefetch(&table[d.rand_u[i + kAhead] * stride], 1);
        float* w = &table[d.rand_u[i] * stride];
        float* a = w + dim;
        const float* g = &grad[i * dim];
        for (int k = 0; k < dim; ++k) {
          a[k] += g[k] * g[k];
          w[k] -= 0.05f * g[k] / std::sqrt(a[k]);
        }
      }
    });
  }));
  std::printf("probe_n %.4f\n", MedianMs(d.calls, [&] {
    Parallel(d.threads, N, [&](int t, int64_t b, int64_t end) {
      uint64_t s = 0;
      for (int64_t i = b; i < end; ++i) {
        if (i + kAhead < end)
          __builtin_prefetch(&probe[2 * d.rand_probe[i + kAhead]]);
        const int64_t p = 2 * d.rand_probe[i];
        s += probe[p] ^ probe[p + 1] ^ keys[i];
        idx_out[i] = static_cast<int32_t>(s);
      }
      sink[t] = double(s);
    });
  }));
  double total = 0;
  for (float v : seg_out) total += v;
  for (double s : sink) total += s;
  std::fprintf(stderr, "(sink %g)\n", total);
}

bool ReadInt32(const char* path, int64_t n, std::vector<int32_t>* v) {
  v->resize(n);
  FILE* f = std::fopen(path, "rb");
  const bool ok = f && std::fread(v->data(), sizeof(int32_t), n, f) == size_t(n);
  if (f) std::fclose(f);
  if (!ok)
    std::fprintf(stderr, "membound: cannot read %lld int32 from %s\n",
                 static_cast<long long>(n), path);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 11) {
    std::fprintf(stderr,
                 "usage: membound R U N DIM THREADS CALLS IDX_FILE SEG_FILE "
                 "NSEG ROW_BYTES\n");
    return 2;
  }
  Data d;
  d.R = std::atoll(argv[1]);
  d.U = std::atoll(argv[2]);
  d.N = std::atoll(argv[3]);
  const int dim = std::atoi(argv[4]);
  d.threads = std::atoi(argv[5]);
  d.calls = std::atoi(argv[6]);
  d.nseg = std::atoll(argv[9]);
  d.row_floats = std::max<int64_t>(2 * dim, (std::atoll(argv[10]) + 3) / 4);
  if (dim < 1 || dim > 64 || d.threads < 1 || d.calls < 1 || d.U < 1 ||
      d.R < d.U || d.nseg < 1) {
    std::fprintf(stderr, "membound: need 1 <= DIM <= 64, THREADS, CALLS, "
                         "U, NSEG >= 1 and R >= U\n");
    return 2;
  }
  if (!ReadInt32(argv[7], d.N, &d.idx) || !ReadInt32(argv[8], d.N, &d.seg))
    return 2;
  std::vector<char> seen(d.nseg, 0);
  for (int64_t i = 0; i < d.N; ++i) {
    const bool starts = i == 0 || d.seg[i] != d.seg[i - 1];
    if (d.idx[i] < 0 || d.idx[i] >= d.U || d.seg[i] < 0 ||
        d.seg[i] >= d.nseg || (starts && seen[d.seg[i]])) {
      std::fprintf(stderr, "membound: id %lld: index %d or segment %d out "
                   "of range, or the segment's ids not contiguous\n",
                   static_cast<long long>(i), d.idx[i], d.seg[i]);
      return 2;
    }
    seen[d.seg[i]] = 1;
  }
  std::mt19937_64 rng(42);
  d.rand_u.resize(d.U);
  for (auto& r : d.rand_u) r = static_cast<int64_t>(rng() % d.R);
  d.rand_probe.resize(d.N);
  for (auto& r : d.rand_probe) r = static_cast<int64_t>(rng() % (2 * d.U));
  if (dim == 1) Run<1>(d, dim);
  else if (dim == 16) Run<16>(d, dim);
  else Run<0>(d, dim);
  return 0;
}
