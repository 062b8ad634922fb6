// Concurrency stress of TableShard without TensorFlow, for ThreadSanitizer
// and AddressSanitizer (`make sanitize`) and as a plain stress (`make stress`).
//
// It lives here, not under tnet_ops/, because setup.py compiles every
// tnet_ops/**/*.cc into the op library.
//
//   table_stress [seconds=10] [pushers=4] [num_stripes=4] [tier_bytes=0]
//
// tier_bytes > 0 gives the table a disk tier (in $TMPDIR or /tmp) whose
// cache holds that many bytes of rows, so every operation also moves rows
// between memory and disk.
//
// Phase 1 (first half): pushers, training and inference pullers, an
// exporter walking the table in small chunks, an evictor with
// compact=false, a size watcher. Phase 2: the same without the exporter and
// with compacting eviction (which moves rows under the pushes and pulls).
// Hot keys [0, kHot) get SGD gradients c * (1, 2, .., dim) with small
// integer c and lr 0.5, so float sums are exact; cold keys are inserted by
// training pulls with show 0 and evicted (threshold 0.5).
// Checked: every read hot row is w = -lr * S * (j + 1) for one integer S (no
// torn row); an export walk returns each hot key exactly once; size never
// drops below kHot; at the end every hot key's weights are exactly
// -lr * sum(c) * (j + 1) (no lost or doubled update) and size equals the
// live keys. Exits 1 with a message on the first violation.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tnet_ops/optimizers/rules.h"
#include "tnet_ops/table/table_shard.h"

namespace {

using tnet::TableShard;

constexpr int kDim = 4;
constexpr float kLr = 0.5f;
constexpr int64_t kHot = 2000;
constexpr int64_t kColdBase = int64_t{1} << 40;
constexpr int64_t kColdKeys = 1 << 14;

std::atomic<bool> g_failed{false};
std::mutex g_print;

void Fail(const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_print);
  if (!g_failed.exchange(true)) std::fprintf(stderr, "FAIL: %s\n", msg.c_str());
}

// Runs the table's parallel work inline: concurrency comes from the
// driver's threads.
void Inline(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  fn(0, n);
}

void CheckRows(const int64_t* keys, const float* w, int64_t n, const char* where) {
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] < 0 || keys[i] >= kHot) continue;
    const float s = -w[i * kDim] / kLr;
    bool ok = s == static_cast<float>(static_cast<int64_t>(s));
    for (int j = 1; j < kDim; ++j) ok &= -w[i * kDim + j] / (kLr * (j + 1)) == s;
    if (!ok) Fail(std::string(where) + ": torn row of key " + std::to_string(keys[i]));
  }
}

struct Driver {
  TableShard table;
  std::atomic<bool> stop{false};
  std::atomic<bool> phase2{false};
  std::mutex sums_mu;
  std::vector<int64_t> sums = std::vector<int64_t>(kHot, 0);
  std::atomic<int64_t> pushes{0}, pulls{0}, walks{0}, evictions{0}, evicted{0};

  Driver(int stripes, int64_t tier_bytes) : table(Config(stripes, tier_bytes)) {}

  static tnet::TableConfig Config(int stripes, int64_t tier_bytes) {
    tnet::TableConfig c;
    c.memory_budget_bytes = tier_bytes;
    const char* tmp = std::getenv("TMPDIR");
    c.storage_dir = tmp != nullptr ? tmp : "/tmp";
    c.dim = kDim;
    c.num_stripes = stripes;
    tnet::FindRule("sgd", &c.optimizer.rule);
    c.initializer.kind = tnet::InitKind::kZeros;
    return c;
  }

  void Pusher(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> local(kHot, 0), keys;
    std::vector<float> grads;
    while (!stop && !g_failed) {
      const int n = 1 + rng() % 256;
      keys.resize(n);
      grads.resize(n * kDim);
      for (int i = 0; i < n; ++i) {
        keys[i] = rng() % kHot;
        const int c = static_cast<int>(rng() % 7) - 3;
        for (int j = 0; j < kDim; ++j) grads[i * kDim + j] = c * (j + 1.0f);
        local[keys[i]] += c;
      }
      if (!table.Push(keys.data(), n, grads.data(), kLr, 1, nullptr, nullptr,
                      Inline)) {
        Fail("push ran out of memory");
      }
      ++pushes;
    }
    std::lock_guard<std::mutex> lock(sums_mu);
    for (int64_t k = 0; k < kHot; ++k) sums[k] += local[k];
  }

  void Puller(uint64_t seed, bool training) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> keys(320);
    std::vector<float> out(keys.size() * kDim);
    while (!stop && !g_failed) {
      for (size_t i = 0; i < keys.size(); ++i) {
        keys[i] = i < 64 ? rng() % kHot : kColdBase + rng() % kColdKeys;
      }
      table.Pull(keys.data(), keys.size(), training, out.data(), Inline);
      CheckRows(keys.data(), out.data(), keys.size(),
                training ? "training pull" : "inference pull");
      ++pulls;
    }
  }

  void Exporter(uint64_t seed) {
    std::mt19937_64 rng(seed);
    while (!stop && !phase2 && !g_failed) {
      std::vector<int> seen(kHot, 0);
      int64_t cursor = 0;
      while (cursor != -1) {
        std::vector<int64_t> keys;
        std::vector<float> w, s;
        std::vector<tnet::RowMeta> meta;
        cursor = table.Export(cursor, 1 + rng() % 1000, -1, &keys, &w, &s, &meta);
        CheckRows(keys.data(), w.data(), keys.size(), "export");
        for (int64_t k : keys) {
          if (k >= 0 && k < kHot) ++seen[k];
        }
      }
      for (int64_t k = 0; k < kHot; ++k) {
        if (seen[k] != 1) {
          Fail("an export walk returned hot key " + std::to_string(k) + " " +
               std::to_string(seen[k]) + " times");
          break;
        }
      }
      ++walks;
    }
  }

  void Evictor() {
    while (!stop && !g_failed) {
      const tnet::EvictStats st =
          table.Evict(1.0f, 0.5f, 0, 0, /*compact=*/phase2.load(), Inline);
      evicted += st.evicted;
      ++evictions;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  void Watcher() {
    while (!stop && !g_failed) {
      if (table.Size() < kHot) Fail("size dropped below the hot keys");
      if (table.MemoryBytes() <= 0) Fail("memory_bytes not positive");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void FinalChecks() {
    std::vector<int64_t> keys;
    std::vector<float> w, s;
    std::vector<tnet::RowMeta> meta;
    if (table.Export(0, int64_t{1} << 62, -1, &keys, &w, &s, &meta) != -1) {
      Fail("final export did not finish");
    }
    if (static_cast<int64_t>(keys.size()) != table.Size()) {
      Fail("size " + std::to_string(table.Size()) + " != " +
           std::to_string(keys.size()) + " exported live keys");
    }
    std::vector<int64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      Fail("final export returned a key twice");
    }
    int64_t hot_seen = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      const int64_t k = keys[i];
      if (k < 0 || k >= kHot) continue;
      ++hot_seen;
      for (int j = 0; j < kDim; ++j) {
        const float want = -kLr * static_cast<float>(sums[k]) * (j + 1);
        if (w[i * kDim + j] != want) {
          Fail("key " + std::to_string(k) + " lost or doubled an update: " +
               std::to_string(w[i * kDim + j]) + " != " + std::to_string(want));
          return;
        }
      }
    }
    if (hot_seen != kHot) Fail("final export lacks hot keys");
    table.Evict(1.0f, 0.5f, 0, 0, true, Inline);
    if (table.Size() != kHot) Fail("cold rows survived the final eviction");
  }
};

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
  const int pushers = argc > 2 ? std::atoi(argv[2]) : 4;
  const int stripes = argc > 3 ? std::atoi(argv[3]) : 4;
  const int64_t tier_bytes = argc > 4 ? std::atoll(argv[4]) : 0;
  // With a tier, read ahead on every batch (the files sit in the page
  // cache, where the tier would not) so that path runs under the threads.
  if (tier_bytes > 0) setenv("TNET_TEST_TIER_READAHEAD", "1", 1);
  Driver d(stripes, tier_bytes);
  if (!d.table.TierError().empty()) {
    std::fprintf(stderr, "FAIL: %s\n", d.table.TierError().c_str());
    return 1;
  }
  {  // Every hot key exists (show 1) before the threads start.
    std::vector<int64_t> hot(kHot);
    for (int64_t k = 0; k < kHot; ++k) hot[k] = k;
    std::vector<float> zeros(kHot * kDim, 0.0f);
    d.table.Push(hot.data(), kHot, zeros.data(), kLr, 1, nullptr, nullptr,
                 Inline);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < pushers; ++i) threads.emplace_back([&d, i] { d.Pusher(i); });
  threads.emplace_back([&d] { d.Puller(100, true); });
  threads.emplace_back([&d] { d.Puller(101, true); });
  threads.emplace_back([&d] { d.Puller(102, false); });
  threads.emplace_back([&d] { d.Exporter(103); });
  threads.emplace_back([&d] { d.Evictor(); });
  threads.emplace_back([&d] { d.Watcher(); });
  const auto half = std::chrono::duration<double>(seconds / 2);
  std::this_thread::sleep_for(half);
  d.phase2 = true;
  std::this_thread::sleep_for(half);
  d.stop = true;
  for (auto& t : threads) t.join();
  if (!g_failed) d.FinalChecks();
  std::printf(
      "TABLE_STRESS {\"ok\": %s, \"seconds\": %.1f, \"threads\": %zu, "
      "\"num_stripes\": %d, \"pushes\": %lld, \"pulls\": %lld, "
      "\"export_walks\": %lld, \"evictions\": %lld, \"evicted_rows\": %lld, "
      "\"tier_misses\": %lld, \"tier_writebacks\": %lld}\n",
      g_failed ? "false" : "true", seconds, threads.size(), stripes,
      static_cast<long long>(d.pushes), static_cast<long long>(d.pulls),
      static_cast<long long>(d.walks), static_cast<long long>(d.evictions),
      static_cast<long long>(d.evicted),
      static_cast<long long>(d.table.Stats().tier_misses),
      static_cast<long long>(d.table.Stats().tier_writebacks));
  if (!d.table.TierError().empty()) {
    std::fprintf(stderr, "FAIL: %s\n", d.table.TierError().c_str());
    return 1;
  }
  if (tier_bytes > 0 && d.table.Stats().tier_writebacks == 0) {
    std::fprintf(stderr, "FAIL: the tier never wrote a row back\n");
    return 1;
  }
  return g_failed ? 1 : 0;
}
