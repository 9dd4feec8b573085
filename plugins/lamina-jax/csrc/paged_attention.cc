// Decode attention over a paged KV cache, as an XLA FFI custom call for the CPU: one query
// position per sequence attends to the positions its block table names, read where they lie in
// the pools. XLA:CPU has no such kernel: the JAX form (`_paged_attention` in model/llama.py) must
// gather each chunk of blocks into a new array and loop over the chunks, and at 32 sequences of a
// few hundred positions that gather and loop cost more than all the matrix products of a step.
// Nor does a library offer one for these pools (ggml's flash attention wants each sequence's K and
// V contiguous), so it is written here, short: decode reads every position once, so it is bound
// by memory, not arithmetic.
//
// Each unit of work is one sequence and one KV head: its group of query heads share every key and
// value they read, and a running softmax (max, normaliser, weighted sum) folds in one tile of
// positions (one vector's lanes) at a time. Pools are float32 or bfloat16 (the quantized KV dtypes
// keep the JAX form).
//
// Built with the other CPU kernels by scripts/kernels/build_cpu_kernels.sh; called by
// lamina_jax.model.attention_kernel.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "slices.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The CPU's own vector width: 16 float32 lanes with AVX-512, 8 with AVX2 (GCC vector extensions).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float Vec __attribute__((vector_size(kLanes * 4)));
typedef int32_t IVec __attribute__((vector_size(kLanes * 4)));
typedef uint32_t UVec __attribute__((vector_size(kLanes * 4)));
typedef uint16_t HVec __attribute__((vector_size(kLanes * 2)));

#define INLINE inline __attribute__((always_inline))

constexpr int kMaxGroup = 16;     // query heads per KV head
constexpr int kMaxHeadDim = 256;  // and head sizes: multiples of 16 up to this

template <typename V>
INLINE V Load(const void *p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// kLanes values of a pool as float32.
INLINE Vec Widen(const float *p) { return Load<Vec>(p); }
INLINE Vec Widen(const uint16_t *p) {  // bfloat16: the high half of a float32
  return reinterpret_cast<Vec>(__builtin_convertvector(Load<HVec>(p), UVec) << 16);
}

INLINE float Sum(Vec v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

INLINE float Max(Vec v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}

// Lane t of the result is the sum of v[t]'s lanes: the kLanes horizontal sums of a tile of
// positions, folded pairwise (half of each vector onto the other, then again) so that each step
// serves every vector at once.
INLINE Vec Sums(const Vec *v) {
#if defined(__AVX512F__)
  Vec r0[8], r1[4], r2[2];
  for (int j = 0; j < 8; ++j)
    r0[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(v[2 * j], v[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                    31);
  for (int j = 0; j < 4; ++j)
    r1[j] = __builtin_shufflevector(r0[2 * j], r0[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                                    27) +
            __builtin_shufflevector(r0[2 * j], r0[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                    31);
  for (int j = 0; j < 2; ++j)
    r2[j] = __builtin_shufflevector(r1[2 * j], r1[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28,
                                    29) +
            __builtin_shufflevector(r1[2 * j], r1[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                    31);
  return __builtin_shufflevector(r2[0], r2[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(r2[0], r2[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
  Vec r1[4], r2[2];
  for (int j = 0; j < 4; ++j)
    r1[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
            __builtin_shufflevector(v[2 * j], v[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int j = 0; j < 2; ++j)
    r2[j] = __builtin_shufflevector(r1[2 * j], r1[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
            __builtin_shufflevector(r1[2 * j], r1[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(r2[0], r2[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(r2[0], r2[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

// e^x lane by lane (Cephes' expf: powers of 2 taken out, then a degree-5 polynomial; within
// 2 ulp of std::exp over float32's range, and 0 below -87).
INLINE Vec Exp(Vec x) {
  const Vec low = Vec{} - 87.0f, high = Vec{} + 88.0f, round = Vec{} + 12582912.0f;  // 1.5 * 2^23
  const Vec c = x < low ? low : (x > high ? high : x);
  const Vec n = (c * 1.44269504088896341f + round) - round;  // nearest integer to c / ln 2
  const Vec r = c - n * 0.693359375f + n * 2.12194440e-4f;   // ln 2 in two parts
  Vec p = Vec{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const IVec scale = (__builtin_convertvector(n, IVec) + 127) << 23;
  return x < low ? Vec{} : p * reinterpret_cast<Vec>(scale);
}

struct Shapes {
  int64_t rows, heads, kv_heads, group, head_dim, blocks, block_size, table_width;
};

// One sequence's attention for KV head g over its first `length` positions: out[h] for the
// group's query heads h, a tile of kLanes positions at a time.
template <typename T, int D>
void Attend(const Shapes &s, const float *q, const T *k_pool, const T *v_pool, const int32_t *table, int64_t length,
            int64_t g, float *out) {
  constexpr int N = D / kLanes;
  const int64_t group = s.group;
  Vec queries[kMaxGroup][N], acc[kMaxGroup][N];
  float top[kMaxGroup], norm[kMaxGroup];
  for (int64_t h = 0; h < group; ++h) {
    top[h] = -std::numeric_limits<float>::infinity(), norm[h] = 0;
    for (int i = 0; i < N; ++i) queries[h][i] = Load<Vec>(q + (g * group + h) * D + i * kLanes), acc[h][i] = Vec{};
  }
  IVec lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  for (int64_t start = 0; start < length; start += kLanes) {
    const int64_t count = std::min<int64_t>(kLanes, length - start);
    const T *keys[kLanes], *values[kLanes];
    for (int t = 0; t < kLanes; ++t) {  // a short tile repeats its last position, masked below
      const int64_t pos = start + std::min<int64_t>(t, count - 1), block = table[pos / s.block_size];
      const int64_t offset = ((block * s.kv_heads + g) * s.block_size + pos % s.block_size) * D;
      keys[t] = k_pool + offset, values[t] = v_pool + offset;
    }
    Vec products[kMaxGroup][kLanes];
    for (int t = 0; t < kLanes; ++t) {
      Vec key[N];
      for (int i = 0; i < N; ++i) key[i] = Widen(keys[t] + i * kLanes);
      for (int64_t h = 0; h < group; ++h) {
        Vec dot = queries[h][0] * key[0];
        for (int i = 1; i < N; ++i) dot += queries[h][i] * key[i];
        products[h][t] = dot;
      }
    }
    float probs[kMaxGroup][kLanes];
    for (int64_t h = 0; h < group; ++h) {
      const Vec scores = lane < static_cast<int32_t>(count) ? Sums(products[h])
                                                            : Vec{} - std::numeric_limits<float>::infinity();
      const float tile_top = Max(scores);
      if (tile_top > top[h]) {  // a new maximum: rescale what came before
        const float rescale = std::exp(top[h] - tile_top);
        norm[h] *= rescale;
        for (int i = 0; i < N; ++i) acc[h][i] *= rescale;
        top[h] = tile_top;
      }
      const Vec p = Exp(scores - top[h]);
      norm[h] += Sum(p);
      std::memcpy(probs[h], &p, sizeof p);
    }
    for (int64_t t = 0; t < count; ++t) {
      Vec value[N];
      for (int i = 0; i < N; ++i) value[i] = Widen(values[t] + i * kLanes);
      for (int64_t h = 0; h < group; ++h)
        for (int i = 0; i < N; ++i) acc[h][i] += probs[h][t] * value[i];
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    const float inv = norm[h] > 0 ? 1.0f / norm[h] : 0.0f;
    for (int i = 0; i < N; ++i) {
      const Vec o = acc[h][i] * inv;
      std::memcpy(out + (g * group + h) * D + i * kLanes, &o, sizeof o);
    }
  }
}

template <typename T>
using AttendFn = void (*)(const Shapes &, const float *, const T *, const T *, const int32_t *, int64_t, int64_t,
                          float *);

// Attend<T, D> for D = 16, 32, ..., kMaxHeadDim, by D / 16 - 1.
template <typename T, size_t... I>
constexpr std::array<AttendFn<T>, sizeof...(I)> AttendBySize(std::index_sequence<I...>) {
  return {Attend<T, 16 * (I + 1)>...};
}

template <typename T>
void DecodeAttention(const Shapes &s, const float *q, const T *k_pool, const T *v_pool, const int32_t *tables,
                     const int32_t *lengths, float *out, ffi::ThreadPool &pool) {
  static constexpr auto kBySize = AttendBySize<T>(std::make_index_sequence<kMaxHeadDim / 16>());
  const AttendFn<T> attend = kBySize[s.head_dim / 16 - 1];
  lamina::InSlices(s.rows * s.kv_heads, 1, pool, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t row = item / s.kv_heads, g = item % s.kv_heads;
      const int64_t length = std::clamp<int64_t>(lengths[row], 0, s.table_width * s.block_size);
      attend(s, q + row * s.heads * s.head_dim, k_pool, v_pool, tables + row * s.table_width, length, g,
             out + row * s.heads * s.head_dim);
    }
  });
}

ffi::Error Run(ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_pool, ffi::AnyBuffer v_pool, ffi::Buffer<ffi::S32> tables,
               ffi::Buffer<ffi::S32> lengths, ffi::ResultBuffer<ffi::F32> out, ffi::ThreadPool pool) {
  const auto qd = q.dimensions(), kd = k_pool.dimensions(), td = tables.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || td.size() != 2 || td[0] != qd[0] || lengths.element_count() != qd[0] ||
      !std::equal(kd.begin(), kd.end(), v_pool.dimensions().begin(), v_pool.dimensions().end()) || kd[3] != qd[2] ||
      v_pool.element_type() != k_pool.element_type())
    return ffi::Error::InvalidArgument("q [B, H, d], pools [N, H_kv, block, d], tables [B, n] and lengths [B]");
  const Shapes s{qd[0], qd[1], kd[1], qd[1] / kd[1], qd[2], kd[0], kd[2], td[1]};
  if (s.heads % s.kv_heads != 0 || s.group > kMaxGroup || s.head_dim % 16 != 0 || s.head_dim > kMaxHeadDim)
    return ffi::Error::InvalidArgument("heads must be a multiple of KV heads, at most 16 per KV head, and the head "
                                       "size a multiple of 16 up to 256");
  // A block id outside the pool would read outside it: reject the call rather than trust the tables
  // (only the entries a row reads: padding entries may name anything).
  const int32_t *t = tables.typed_data(), *len = lengths.typed_data();
  for (int64_t row = 0; row < s.rows; ++row) {
    const int64_t used = (std::clamp<int64_t>(len[row], 0, s.table_width * s.block_size) + s.block_size - 1) /
                         s.block_size;
    const int32_t *entries = t + row * s.table_width;
    if (std::any_of(entries, entries + used, [&](int32_t b) { return b < 0 || b >= s.blocks; }))
      return ffi::Error::InvalidArgument("a block table names a block outside the pool");
  }
  if (k_pool.element_type() == ffi::DataType::F32)
    DecodeAttention(s, q.typed_data(), static_cast<const float *>(k_pool.untyped_data()),
                    static_cast<const float *>(v_pool.untyped_data()), t, len, out->typed_data(),
                    pool);
  else if (k_pool.element_type() == ffi::DataType::BF16)
    DecodeAttention(s, q.typed_data(), static_cast<const uint16_t *>(k_pool.untyped_data()),
                    static_cast<const uint16_t *>(v_pool.untyped_data()), t, len, out->typed_data(),
                    pool);
  else
    return ffi::Error::InvalidArgument("pools must be float32 or bfloat16");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LaminaPagedDecodeAttention, Run,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, H, d], already scaled by 1/sqrt(d)
                                  .Arg<ffi::AnyBuffer>()         // k_pool [N, H_kv, block, d]
                                  .Arg<ffi::AnyBuffer>()         // v_pool [N, H_kv, block, d]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // tables [B, n]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lengths [B]: positions each row sees
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, H, d]
                                  .Ctx<ffi::ThreadPool>());
