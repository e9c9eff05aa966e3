// Every emulated kernel against a plain-loop reference, as a standalone program, so it can run
// under AddressSanitizer (out-of-bounds reads and writes, global and "shared") and
// ThreadSanitizer (races between the threads of a block). tests/test_emulate.py builds and runs:
//   c++ -std=c++17 -O1 -g -pthread -fsanitize=thread -Icuda cuda/emulate/driver.cpp -o /tmp/emu_tsan
//   /tmp/emu_tsan [--quick] [--shard I/N] [version ...]
//     versions: default every GEMM version of kVersionInfo and autotuning candidate (version 100 + I,
//     float32); --shard I/N: the I-th of every N of them (and the backward kernels in shard 0), so
//     that N processes share the work on N cores; exit status 0 iff all match
// Under AddressSanitizer the block's threads are fibers, as in the library; under ThreadSanitizer
// they are OS threads (cuda_emu.h chooses them there: ThreadSanitizer models pthread barriers).
// Buffers are allocated at their exact size, so a read one element past the end is caught.
// Standard headers before the emulation's keyword macros (cuda_emu.h says why).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "emulate/emulate.cpp"

using namespace dense_kernels;

namespace {

struct Shape {
  int64_t M, N, K;
};
// Small, but across the edges of the 16/32/64/128-wide tiles and the 8/16-deep k steps.
// A small pretend GPU, so that small shapes take the small-batch paths (split-K, row blocks).
constexpr int kSms = 8;
// The last two have every dimension a multiple of 8, so that the 16-byte copies (cp.async) run too,
// across partial tiles, with K long enough for the pipelines' rings of stages to wrap around.
const Shape kShapes[] = {{1, 1, 1},    {0, 5, 3},    {17, 15, 9},  {33, 65, 17},
                         {65, 129, 33}, {37, 41, 43}, {20, 30, 300}, {40, 72, 96}, {24, 136, 520}};

// Values in and out of a storage type (the 16-bit types have no arithmetic of their own).
double value(float v) { return v; }
double value(double v) { return v; }
double value(__nv_bfloat16 v) { return __bfloat162float(v); }
double value(__half v) { return __half2float(v); }
template <typename T>
T stored(double v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(float(v));
  else if constexpr (std::is_same_v<T, __half>) return __float2half(float(v));
  else return T(v);
}
// The tolerance of a type's result against the float64 sum of its (rounded) inputs: the final
// rounding to a 16-bit type dominates there (8 bits of mantissa for bfloat16, 11 for float16).
template <typename T>
double tolerance() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, float>) return 1e-4;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return 1e-2;
  else return 2e-3;
}

template <typename T>
std::vector<T> random_vector(size_t n, std::mt19937& gen) {
  std::normal_distribution<double> dist;
  std::vector<T> v(n);
  for (auto& x : v) x = stored<T>(dist(gen));
  return v;
}

// An exact-size heap copy (vector capacity could hide an overrun from ASan).
template <typename T>
std::unique_ptr<T[]> exact(const std::vector<T>& v) {
  std::unique_ptr<T[]> p(new T[v.size() ? v.size() : 1]);
  std::copy(v.begin(), v.end(), p.get());
  return p;
}

template <typename T>
int check_gemm(int version, const char* layout, Shape s, int epilogue, bool with_bias, std::mt19937& gen) {
  using Acc = acc_t<T>;
  const bool ta = layout[0] == 't', tb = layout[1] == 't';
  const auto a = random_vector<T>(s.M * s.K, gen), b = random_vector<T>(s.K * s.N, gen);
  const auto bias = random_vector<T>(s.N, gen);
  auto A = exact(a), B = exact(b), Bias = exact(bias);
  std::unique_ptr<T[]> C(new T[s.M * s.N ? s.M * s.N : 1]);
  version = emu_resolve_version(version, layout, dtype_of<T>(), A.get(), B.get(), s.M, s.N, s.K, kSms);
  const int64_t work = emu_gemm_workspace(version, dtype_of<T>(), s.M, s.N, s.K, kSms);
  std::unique_ptr<Acc[]> W(work > 0 ? new Acc[work] : nullptr);
  const int rc = emu_gemm(version, layout, dtype_of<T>(), A.get(), B.get(), C.get(), with_bias ? Bias.get() : nullptr,
                          s.M, s.N, s.K, epilogue, kSms, W.get());
  // A TMA version refuses operands whose rows are not whole 16-byte multiples (version 0 then
  // chooses another): that refusal is right, and there is nothing to compare.
  if (rc == 1 && uses_tma(version) && !tma_compatible(layout, A.get(), B.get(), s.M, s.N, s.K, sizeof(T))) return 0;
  if (rc != 0) return std::printf("v%d %s: launch refused (%d)\n", version, layout, rc), 1;
  // v25 multiplies float32 operands rounded to tf32 (10 bits of mantissa): 2^-11 relative a product
  const double tol = version == 25 ? 2e-3 : tolerance<T>();
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t n = 0; n < s.N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < s.K; ++k)
        acc += value(a[ta ? k * s.M + m : m * s.K + k]) * value(b[tb ? n * s.K + k : k * s.N + n]);
      if (epilogue == kBiasSigmoid) acc = 1.0 / (1.0 + std::exp(-(acc + (with_bias ? value(bias[n]) : 0.0))));
      const double got = value(C[m * s.N + n]);
      if (!(std::fabs(got - acc) <= tol * (1 + std::fabs(acc) + std::sqrt(double(s.K))))) {
        std::printf("MISMATCH v%d %s %s M=%lld N=%lld K=%lld epilogue=%d bias=%d at (%lld,%lld): %g vs %g\n", version,
                    layout, kDTypeNames[dtype_of<T>()], (long long)s.M, (long long)s.N, (long long)s.K, epilogue,
                    with_bias, (long long)m, (long long)n, got, acc);
        return 1;
      }
    }
  return 0;
}

template <typename T>
int check_sigmoid_grad(int version, int x4, int64_t rows, int64_t cols, std::mt19937& gen) {
  using Acc = acc_t<T>;
  const auto g = random_vector<T>(rows * cols, gen);
  auto y = random_vector<T>(rows * cols, gen);
  for (auto& v : y) v = stored<T>(1 / (1 + std::exp(-value(v))));
  auto G = exact(g), Y = exact(y);
  std::unique_ptr<T[]> dz(new T[rows * cols ? rows * cols : 1]), db(new T[cols ? cols : 1]);
  const int64_t work = emu_sigmoid_grad_workspace(version, rows, cols, kSms);
  std::unique_ptr<Acc[]> W(work > 0 ? new Acc[work] : nullptr);
  if (emu_sigmoid_grad(version, dtype_of<T>(), x4, G.get(), Y.get(), dz.get(), db.get(), rows, cols, kSms, W.get()) != 0)
    return std::printf("sigmoid-grad v%d refused\n", version), 1;
  const double tol = std::is_same_v<T, double> || std::is_same_v<T, float> ? 1e-6 : tolerance<T>();
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double yv = value(y[r * cols + c]), d = value(g[r * cols + c]) * yv * (1 - yv);
      sum += d;
      if (std::fabs(value(dz[r * cols + c]) - d) > tol * (1 + std::fabs(d))) return std::printf("MISMATCH dz\n"), 1;
    }
    if (std::fabs(value(db[c]) - sum) > 10 * tol * (1 + std::fabs(sum) + rows))
      return std::printf("MISMATCH db col %lld\n", (long long)c), 1;
  }
  return 0;
}

// Every type version v is built for: the fused epilogue with and without bias, and the plain one.
template <typename T>
int check_type(int v, const char* layout, const Shape& s, bool quick, std::mt19937& gen, int& runs) {
  if (!version_builds(v, dtype_of<T>()) && !(is_tune(v) && std::is_same_v<T, float>)) return 0;
  // float16 takes the same addresses, barriers and instruction order as bfloat16 (two bytes an
  // element; only the conversions differ): where a version has both, the sanitizers would see
  // nothing new in the second (tests/test_emulate.py checks float16's results)
  if (std::is_same_v<T, __half> && version_builds(v, kBF16)) return 0;
  const bool first = std::is_same_v<T, float>;
  int failures = check_gemm<T>(v, layout, s, first || !quick ? kBiasSigmoid : kPlain, first, gen);
  ++runs;
  if (quick) return failures;
  failures += check_gemm<T>(v, layout, s, kPlain, false, gen);
  ++runs;
  if (!first) failures += check_gemm<T>(v, layout, s, kBiasSigmoid, true, gen), ++runs;
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> versions;
  bool quick = false;  // --quick: fewer shapes and combinations, for ThreadSanitizer's slower runs
  int shard = 0, shards = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") quick = true;
    else if (std::string(argv[i]) == "--shard" && i + 1 < argc &&
             std::sscanf(argv[i + 1], "%d/%d", &shard, &shards) == 2 && 0 <= shard && shard < shards) ++i;
    else if (std::atoi(argv[i]) > 0) versions.push_back(std::atoi(argv[i]));
    else return std::fprintf(stderr, "usage: %s [--quick] [--shard I/N] [version ...]\n", argv[0]), 2;
  }
  if (versions.empty()) {
    for (const VersionInfo& v : kVersionInfo)
      if (v.id != 0) versions.push_back(v.id);
    for (int i = 0; i < kTuneCount; ++i) versions.push_back(tune_id(i));
  }
  std::vector<int> mine;  // round robin: neighbouring versions cost about the same
  for (size_t i = 0; i < versions.size(); ++i)
    if (int(i % shards) == shard) mine.push_back(versions[i]);
  versions = mine;
  std::mt19937 gen(0);
  int failures = 0, runs = 0, tuned = 0;
  for (int v : versions) {
    tuned += is_tune(v);
    for (const char* layout : {"nt", "nn", "tn"})
      for (const Shape& s : kShapes) {
        // --quick: two shapes, every type once: ragged edges in every dimension (33×65×17), and
        // aligned rows with many k-steps (24×136×520), where every pipeline's ring of stages wraps
        // and TMA can copy the rows (the barriers' and mbarriers' work, what ThreadSanitizer watches)
        if (quick && !(s.M == 33 || s.M == 24)) continue;
        failures += check_type<float>(v, layout, s, quick, gen, runs) + check_type<double>(v, layout, s, quick, gen, runs) +
                    check_type<__nv_bfloat16>(v, layout, s, quick, gen, runs) +
                    check_type<__half>(v, layout, s, quick, gen, runs);
      }
    // a type the version is not built for is refused (1), not run
    for (int t = 0; t < kDTypes; ++t) {
      if (version_builds(v, DType(t)) || (is_tune(v) && t == kF32)) continue;
      double one = 1, out = 0;
      if (emu_gemm(v, "nt", t, &one, &one, &out, nullptr, 1, 1, 1, kPlain, kSms, nullptr) != 1) {
        std::printf("v%d ran a product of type %s, which it is not built for\n", v, kDTypeNames[t]);
        ++failures;
      }
      ++runs;
    }
  }
  for (int v = 1; v <= kGradVersions && shard == 0; ++v)
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {0, 5}, {33, 31}, {300, 36}}) {
      failures += check_sigmoid_grad<float>(v, 0, rows, cols, gen) + check_sigmoid_grad<double>(v, 0, rows, cols, gen) +
                  check_sigmoid_grad<__nv_bfloat16>(v, 0, rows, cols, gen) +
                  check_sigmoid_grad<__half>(v, 0, rows, cols, gen);
      runs += 4;
      if (v == 1 && cols % 4 == 0) failures += check_sigmoid_grad<float>(v, 1, rows, cols, gen), ++runs;
    }
  std::printf("%d of %d kernel runs matched the reference (%zu GEMM versions and candidates, %d of them candidates)\n",
              runs - failures, runs, versions.size(), tuned);
  return failures ? 1 : 0;
}
