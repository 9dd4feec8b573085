// Attention over a paged KV cache, as an XLA FFI custom call for the CPU: each row is one query
// position (a decoding sequence's, or one token of a prompt chunk) that attends to the positions
// its block table names, read where they lie in the pools. XLA:CPU has no such kernel: the JAX
// form (`_paged_attention` in model/llama.py) must gather each chunk of blocks into a new array
// and loop over the chunks, and in a packed prefill every query scores the keys of every sequence
// in the pack before the mask drops them. Nor does a library offer one for these pools (ggml's
// flash attention wants each sequence's K and V contiguous), so it is written here, short.
//
// A unit of work is a tile of consecutive rows that read the same block table (a prompt chunk's
// tokens; a decoding row is a tile of its own) and one KV head: their query heads share every key
// and value read, and a running softmax (max, normaliser, weighted sum) per query folds in one
// tile of positions (one vector's lanes) at a time, up to that query's own length. Pools are
// float32 or bfloat16 (the quantized KV dtypes keep the JAX form).
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
#include <vector>

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

constexpr int kMaxQueries = 16;  // query heads attended together: a tile's rows times the group
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

// The largest lane, by halves (a loop over lanes would move each one out on its own).
INLINE float Max(Vec v) {
#if defined(__AVX512F__)
  const Vec halves = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v = v > halves ? v : halves;
#endif
  typedef float Half __attribute__((vector_size(32)));
  Half h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const Half quarters = __builtin_shufflevector(h, h, 4, 5, 6, 7, 0, 1, 2, 3);
  h = h > quarters ? h : quarters;
  const Half eighths = __builtin_shufflevector(h, h, 2, 3, 0, 1, 6, 7, 4, 5);
  h = h > eighths ? h : eighths;
  return std::max(h[0], h[1]);
}

INLINE float Sum(Vec v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
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
  int64_t rows, heads, kv_heads, group, head_dim, blocks, block_size, table_size;
};

// Rows first .. first + count - 1, which read the same block table `table`, attending together
// for KV head g: out[row, h] for each row and each of the group's query heads h, where row sees
// its first lengths[row] positions (which `Run` has checked lie within the table and the pools).
template <typename T, int D>
void Attend(const Shapes &s, const float *q, const T *k_pool, const T *v_pool, const int32_t *table,
            const int64_t *lengths, int64_t first, int64_t count, int64_t g, float *out) {
  constexpr int N = D / kLanes;
  const int64_t nq = count * s.group;
  Vec queries[kMaxQueries][N], acc[kMaxQueries][N], norm[kMaxQueries];  // norm: summed over lanes at the end
  float top[kMaxQueries];
  int64_t limit[kMaxQueries], length = 0;
  auto at = [&](int64_t j) { return (first + j / s.group) * s.heads + g * s.group + j % s.group; };
  for (int64_t j = 0; j < nq; ++j) {
    limit[j] = lengths[first + j / s.group], length = std::max(length, limit[j]);
    top[j] = -std::numeric_limits<float>::infinity(), norm[j] = Vec{};
    for (int i = 0; i < N; ++i) queries[j][i] = Load<Vec>(q + at(j) * D + i * kLanes), acc[j][i] = Vec{};
  }
  IVec lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  // the block (index into `table`) and offset of position `start`, stepped rather than divided
  int64_t block = 0, offset = 0;
  for (int64_t start = 0; start < length; start += kLanes) {
    const int64_t n = std::min<int64_t>(kLanes, length - start);
    const T *keys[kLanes], *values[kLanes];
    for (int64_t t = 0, b = block, o = offset; t < kLanes; ++t) {  // a short tile repeats its last position
      const int64_t at_pos = ((table[b] * s.kv_heads + g) * s.block_size + o) * D;
      keys[t] = k_pool + at_pos, values[t] = v_pool + at_pos;
      if (t + 1 < n && ++o == s.block_size) o = 0, ++b;
    }
    for (offset += kLanes; offset >= s.block_size; offset -= s.block_size) ++block;
    Vec products[kMaxQueries][kLanes];
    for (int t = 0; t < kLanes; ++t) {
      Vec key[N];
      for (int i = 0; i < N; ++i) key[i] = Widen(keys[t] + i * kLanes);
      for (int64_t j = 0; j < nq; ++j) {
        Vec dot = queries[j][0] * key[0];
        for (int i = 1; i < N; ++i) dot += queries[j][i] * key[i];
        products[j][t] = dot;
      }
    }
    float probs[kMaxQueries][kLanes];
    for (int64_t j = 0; j < nq; ++j) {
      const int64_t visible = std::min<int64_t>(n, limit[j] - start);
      if (visible <= 0) {  // past this query's own position: it sees none of the tile
        std::fill(probs[j], probs[j] + kLanes, 0.0f);
        continue;
      }
      const Vec scores = lane < static_cast<int32_t>(visible) ? Sums(products[j])
                                                              : Vec{} - std::numeric_limits<float>::infinity();
      const float tile_top = Max(scores);
      if (tile_top > top[j]) {  // a new maximum: rescale what came before
        const float rescale = std::exp(top[j] - tile_top);
        norm[j] *= rescale;
        for (int i = 0; i < N; ++i) acc[j][i] *= rescale;
        top[j] = tile_top;
      }
      const Vec p = Exp(scores - top[j]);
      norm[j] += p;
      std::memcpy(probs[j], &p, sizeof p);
    }
    for (int64_t j = 0; j < nq; ++j) {  // each query's sum in registers, two per lane group to hide latency
      Vec even[N], odd[N];
      for (int i = 0; i < N; ++i) even[i] = acc[j][i], odd[i] = Vec{};
      int64_t t = 0;
      for (; t + 1 < n; t += 2)
        for (int i = 0; i < N; ++i) {
          even[i] += probs[j][t] * Widen(values[t] + i * kLanes);
          odd[i] += probs[j][t + 1] * Widen(values[t + 1] + i * kLanes);
        }
      if (t < n)
        for (int i = 0; i < N; ++i) even[i] += probs[j][t] * Widen(values[t] + i * kLanes);
      for (int i = 0; i < N; ++i) acc[j][i] = even[i] + odd[i];
    }
  }
  for (int64_t j = 0; j < nq; ++j) {
    const float total = Sum(norm[j]), inv = total > 0 ? 1.0f / total : 0.0f;
    for (int i = 0; i < N; ++i) {
      const Vec o = acc[j][i] * inv;
      std::memcpy(out + at(j) * D + i * kLanes, &o, sizeof o);
    }
  }
}

template <typename T>
using AttendFn = void (*)(const Shapes &, const float *, const T *, const T *, const int32_t *, const int64_t *,
                          int64_t, int64_t, int64_t, float *);

// Attend<T, D> for D = 16, 32, ..., kMaxHeadDim, by D / 16 - 1.
template <typename T, size_t... I>
constexpr std::array<AttendFn<T>, sizeof...(I)> AttendBySize(std::index_sequence<I...>) {
  return {Attend<T, 16 * (I + 1)>...};
}

template <typename T>
void PagedAttention(const Shapes &s, const float *q, const T *k_pool, const T *v_pool, const int32_t *table,
                    const int32_t *starts, const int64_t *lengths, float *out, ffi::ThreadPool &pool) {
  static constexpr auto kBySize = AttendBySize<T>(std::make_index_sequence<kMaxHeadDim / 16>());
  const AttendFn<T> attend = kBySize[s.head_dim / 16 - 1];
  // tiles of consecutive rows with the same table, as many as fill kMaxQueries query heads
  const int64_t per_tile = std::max<int64_t>(1, kMaxQueries / s.group);
  std::vector<std::pair<int64_t, int64_t>> tiles;  // first row, rows
  for (int64_t row = 0, count; row < s.rows; row += count) {
    for (count = 1; count < per_tile && row + count < s.rows && starts[row + count] == starts[row];) ++count;
    tiles.emplace_back(row, count);
  }
  const int64_t items = static_cast<int64_t>(tiles.size()) * s.kv_heads;
  lamina::InSlices(items, 1, pool, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const auto [first, count] = tiles[item / s.kv_heads];
      attend(s, q, k_pool, v_pool, table + starts[first], lengths, first, count, item % s.kv_heads, out);
    }
  });
}

ffi::Error Run(ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_pool, ffi::AnyBuffer v_pool, ffi::Buffer<ffi::S32> table,
               ffi::Buffer<ffi::S32> starts, ffi::Buffer<ffi::S32> lengths, ffi::ResultBuffer<ffi::F32> out,
               ffi::ThreadPool pool) {
  const auto qd = q.dimensions(), kd = k_pool.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || table.dimensions().size() != 1 || starts.element_count() != qd[0] ||
      lengths.element_count() != qd[0] ||
      !std::equal(kd.begin(), kd.end(), v_pool.dimensions().begin(), v_pool.dimensions().end()) || kd[3] != qd[2] ||
      v_pool.element_type() != k_pool.element_type())
    return ffi::Error::InvalidArgument("q [B, H, d], pools [N, H_kv, block, d], table [n], starts [B] and lengths [B]");
  const Shapes s{qd[0], qd[1], kd[1], qd[1] / kd[1], qd[2], kd[0], kd[2], table.dimensions()[0]};
  if (s.heads % s.kv_heads != 0 || s.group > kMaxQueries || s.head_dim % 16 != 0 || s.head_dim > kMaxHeadDim)
    return ffi::Error::InvalidArgument("heads must be a multiple of KV heads, at most 16 per KV head, and the head "
                                       "size a multiple of 16 up to 256");
  // A block id outside the pool, or a table running past `table`, would read outside them: reject
  // the call rather than trust the arguments (only the entries a row reads: others may name anything).
  const int32_t *t = table.typed_data(), *start = starts.typed_data(), *len = lengths.typed_data();
  std::vector<int64_t> seen(s.rows);
  for (int64_t row = 0; row < s.rows; ++row) {
    seen[row] = std::max<int64_t>(len[row], 0);
    const int64_t used = (seen[row] + s.block_size - 1) / s.block_size;
    if (used == 0) continue;
    if (start[row] < 0 || start[row] + used > s.table_size)
      return ffi::Error::InvalidArgument("a row's block table runs outside the table");
    const int32_t *entries = t + start[row];
    if (std::any_of(entries, entries + used, [&](int32_t b) { return b < 0 || b >= s.blocks; }))
      return ffi::Error::InvalidArgument("a block table names a block outside the pool");
  }
  if (k_pool.element_type() == ffi::DataType::F32)
    PagedAttention(s, q.typed_data(), static_cast<const float *>(k_pool.untyped_data()),
                   static_cast<const float *>(v_pool.untyped_data()), t, start, seen.data(), out->typed_data(), pool);
  else if (k_pool.element_type() == ffi::DataType::BF16)
    PagedAttention(s, q.typed_data(), static_cast<const uint16_t *>(k_pool.untyped_data()),
                   static_cast<const uint16_t *>(v_pool.untyped_data()), t, start, seen.data(), out->typed_data(),
                   pool);
  else
    return ffi::Error::InvalidArgument("pools must be float32 or bfloat16");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LaminaPagedAttention, Run,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, H, d], already scaled by 1/sqrt(d)
                                  .Arg<ffi::AnyBuffer>()         // k_pool [N, H_kv, block, d]
                                  .Arg<ffi::AnyBuffer>()         // v_pool [N, H_kv, block, d]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // table [n]: every row's block table
                                  .Arg<ffi::Buffer<ffi::S32>>()  // starts [B]: where each row's begins in it
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lengths [B]: positions each row sees
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, H, d]
                                  .Ctx<ffi::ThreadPool>());
