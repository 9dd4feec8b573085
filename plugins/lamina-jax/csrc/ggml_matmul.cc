// y = x @ w.T with w in one of ggml's block-quantized formats (Q4_1, Q8_0, ...), as XLA FFI
// custom calls for the CPU: the weights stay compressed inside the matrix-vector product, so a
// one-row decode reads 0.6 (Q4_1) or 1.06 (Q8_0) bytes per weight instead of float32's 4.
//
// LaminaGgmlMatmul runs ggml's own kernels (ggml-cpu's `from_float` and `vec_dot` type traits,
// the ones llama.cpp's matrix-vector products use): the rows of x are quantized to the format's
// dot type (Q8_1 for Q4_1, Q8_0 for Q8_0) and each output is one `vec_dot` over a weight row.
//
// LaminaGgmlMatmulF32 keeps x in float32 and decodes each block in registers into the float32
// weights it holds (Q4_1: w = d*q + m; Q8_0: w = d*q), once for a tile of rows of x, so its
// products are those of the float32 matrix, up to the order of the float32 sums: ggml has no
// kernel that leaves the activations unrounded, and this one changes no greedy token of a GGUF
// whose matrices are these blocks.
//
// Built by scripts/kernels/build_cpu_kernels.sh against a native build of ggml; loaded by
// lamina_jax.model.ggml.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <immintrin.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "slices.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

const bool kInitialized = (ggml_cpu_init(), true);  // ggml-cpu's fp16 tables, before any vec_dot

constexpr int64_t kSlice = 48;  // output rows per unit of work: a multiple of every tile's weight rows

ffi::Error CheckShapes(ggml_type type, const ffi::Buffer<ffi::F32> &x, const ffi::Buffer<ffi::U8> &w, int64_t n) {
  const int64_t k = x.dimensions()[1];
  if (w.dimensions()[0] != n || static_cast<size_t>(w.dimensions()[1]) != ggml_row_size(type, k))
    return ffi::Error::InvalidArgument("weight blocks do not match the shapes of x and y");
  return ffi::Error::Success();
}

ffi::Error Matmul(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y,
                  int64_t wtype, ffi::ThreadPool pool) {
  const auto type = static_cast<ggml_type>(wtype);
  const ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu(type);
  if (traits->vec_dot == nullptr) return ffi::Error::InvalidArgument("no vec_dot for this ggml type");
  if (ffi::Error error = CheckShapes(type, x, w, y->dimensions()[1]); error.failure()) return error;
  const int64_t rows = x.dimensions()[0], k = x.dimensions()[1], n = y->dimensions()[1];
  const size_t w_row = ggml_row_size(type, k), x_row = ggml_row_size(traits->vec_dot_type, k);
  std::vector<uint8_t> xq(x_row * rows);
  for (int64_t b = 0; b < rows; ++b)
    ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float(x.typed_data() + b * k, xq.data() + b * x_row, k);
  const uint8_t *ws = w.typed_data();
  float *out = y->typed_data();
  lamina::InSlices(n, kSlice, pool, [&](int64_t lo, int64_t hi) {
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t j = lo; j < hi; ++j)
        traits->vec_dot(k, out + b * n + j, 0, ws + j * w_row, 0, xq.data() + b * x_row, 0, 1);
  });
  return ffi::Error::Success();
}

// The CPU's own vector of float32 (GCC vector extensions): 16 lanes with AVX-512, 8 with AVX2. A
// block of 32 weights is kParts such vectors.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
constexpr int kParts = 32 / kLanes;
typedef float Vec __attribute__((vector_size(kLanes * 4)));

#define INLINE inline __attribute__((always_inline))

template <typename V>
INLINE V Load(const void *p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

INLINE __m128i Bytes(const uint8_t *p) { return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)); }

// Bytes to float32 lanes by intrinsics: GCC's vector conversions of bytes can come out as scalar code.
#if defined(__AVX512F__)
INLINE Vec Floats(__m512i q) { return reinterpret_cast<Vec>(_mm512_cvtepi32_ps(q)); }
// 16 nibbles pairs: the low nibbles of bytes 0-15, then their high nibbles.
INLINE void Nibbles(__m128i bytes, Vec *q) {
  const __m512i wide = _mm512_cvtepu8_epi32(bytes);
  q[0] = Floats(_mm512_and_si512(wide, _mm512_set1_epi32(0x0F))), q[1] = Floats(_mm512_srli_epi32(wide, 4));
}
INLINE void SignedBytes(const uint8_t *p, Vec *q) {
  q[0] = Floats(_mm512_cvtepi8_epi32(Bytes(p))), q[1] = Floats(_mm512_cvtepi8_epi32(Bytes(p + 16)));
}
#else
INLINE Vec Floats(__m256i q) { return reinterpret_cast<Vec>(_mm256_cvtepi32_ps(q)); }
INLINE void Nibbles(__m128i bytes, Vec *q) {
  const __m256i a = _mm256_cvtepu8_epi32(bytes), b = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
  const __m256i low = _mm256_set1_epi32(0x0F);
  q[0] = Floats(_mm256_and_si256(a, low)), q[1] = Floats(_mm256_and_si256(b, low));
  q[2] = Floats(_mm256_srli_epi32(a, 4)), q[3] = Floats(_mm256_srli_epi32(b, 4));
}
INLINE void SignedBytes(const uint8_t *p, Vec *q) {
  for (int i = 0; i < 4; ++i) q[i] = Floats(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + 8 * i))));
}
#endif

INLINE float Half(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

INLINE void Halves(const uint8_t *p, float &a, float &b) {  // two fp16 values, in one conversion
  int32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  const __m128 both = _mm_cvtph_ps(_mm_cvtsi32_si128(pair));
  a = _mm_cvtss_f32(both), b = _mm_cvtss_f32(_mm_movehdup_ps(both));
}

INLINE float Sum(Vec v) {  // a tree, not a chain of dependent additions: 16 lanes folded to 8, then pairs
  float s[kLanes];
  std::memcpy(s, &v, sizeof s);
  if constexpr (kLanes == 16)
    for (int i = 0; i < 8; ++i) s[i] += s[i + 8];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// Q4_1 block: d, m (fp16), then 16 bytes of nibbles, weights 0-15 low and 16-31 high; w = d*q + m.
struct Q4_1 {
  static constexpr int kBytes = 20;
  static INLINE void Decode(const uint8_t *w, Vec *out) {
    float d, m;
    Halves(w, d, m);
    Nibbles(Bytes(w + 4), out);
    for (int p = 0; p < kParts; ++p) out[p] = out[p] * d + m;
  }
};

// Q8_0 block: d (fp16), then 32 signed bytes; w = d*q.
struct Q8_0 {
  static constexpr int kBytes = 34;
  static INLINE void Decode(const uint8_t *w, Vec *out) {
    const float d = Half(w);
    SignedBytes(w + 2, out);
    for (int p = 0; p < kParts; ++p) out[p] = out[p] * d;
  }
};

// A tile of the product: R rows of x against C weight rows, each block of the C weight rows decoded
// once (into the float32 weights it holds: d*q is exact in float32, so d*q + m is the weight as
// ggml decodes it) and multiplied with all R rows. R*C accumulators, one per output, are independent
// chains. The tile sizes are the fastest measured on one core (benchmarks/README.md, "the q4_1-f32
// product in tiles"); they keep accumulators and decoded blocks in the CPU's 32 (AVX-512) or 16
// (AVX2) vector registers, or nearly.
#if defined(__AVX512F__)
constexpr int kRowTile = 4;
constexpr int Channels(int rows) { return rows == 1 ? 4 : 6; }
#else
constexpr int kRowTile = 8;
constexpr int Channels(int rows) { return rows <= 2 ? 2 : 1; }
#endif

template <typename Block, int R, int C>
INLINE void Tile(const uint8_t *w, size_t w_row, int64_t blocks, const float *x, int64_t k, float *out,
                 int64_t n) {
  Vec acc[R][C] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    Vec wv[C][kParts];
    for (int c = 0; c < C; ++c) Block::Decode(w + c * w_row + b * Block::kBytes, wv[c]);
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < kParts; ++p) {
        const Vec xv = Load<Vec>(x + r * k + b * 32 + p * kLanes);
        for (int c = 0; c < C; ++c) acc[r][c] += wv[c][p] * xv;
      }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * n + c] = Sum(acc[r][c]);
}

// Output columns [lo, hi) for R rows of x: tiles of Channels(R) weight rows, then one at a time.
template <typename Block, int R>
void Columns(const uint8_t *ws, size_t w_row, int64_t blocks, const float *x, int64_t k, float *out, int64_t n,
             int64_t lo, int64_t hi) {
  constexpr int C = Channels(R);
  int64_t j = lo;
  for (; j + C <= hi; j += C) Tile<Block, R, C>(ws + j * w_row, w_row, blocks, x, k, out + j, n);
  for (; j < hi; ++j) Tile<Block, R, 1>(ws + j * w_row, w_row, blocks, x, k, out + j, n);
}

using ColumnsFn = void (*)(const uint8_t *, size_t, int64_t, const float *, int64_t, float *, int64_t, int64_t,
                           int64_t);

// Columns<Block, R> for R = 1 .. kRowTile, by R - 1.
template <typename Block, size_t... I>
constexpr std::array<ColumnsFn, sizeof...(I)> ColumnsByRows(std::index_sequence<I...>) {
  return {Columns<Block, I + 1>...};
}

template <typename Block>
ffi::Error MatmulF32With(const ffi::Buffer<ffi::F32> &x, const uint8_t *ws, size_t w_row, float *out, int64_t n,
                         ffi::ThreadPool &pool) {
  const int64_t rows = x.dimensions()[0], k = x.dimensions()[1], blocks = k / 32;
  const float *xs = x.typed_data();
  static constexpr auto kColumns = ColumnsByRows<Block>(std::make_index_sequence<kRowTile>());
  lamina::InSlices(n, kSlice, pool, [&](int64_t lo, int64_t hi) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRowTile) {
      const int tile = static_cast<int>(std::min<int64_t>(kRowTile, rows - r0));
      kColumns[tile - 1](ws, w_row, blocks, xs + r0 * k, k, out + r0 * n, n, lo, hi);
    }
  });
  return ffi::Error::Success();
}

ffi::Error MatmulF32(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y,
                     int64_t wtype, ffi::ThreadPool pool) {
  const auto type = static_cast<ggml_type>(wtype);
  if (ffi::Error error = CheckShapes(type, x, w, y->dimensions()[1]); error.failure()) return error;
  const size_t w_row = ggml_row_size(type, x.dimensions()[1]);
  const int64_t n = y->dimensions()[1];
  if (type == GGML_TYPE_Q4_1) return MatmulF32With<Q4_1>(x, w.typed_data(), w_row, y->typed_data(), n, pool);
  if (type == GGML_TYPE_Q8_0) return MatmulF32With<Q8_0>(x, w.typed_data(), w_row, y->typed_data(), n, pool);
  return ffi::Error::InvalidArgument("float32 products handle Q4_1 and Q8_0 blocks only");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LaminaGgmlMatmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [rows, k]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // w [n, row bytes]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [rows, n]
                                  .Attr<int64_t>("wtype")        // enum ggml_type
                                  .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(LaminaGgmlMatmulF32, MatmulF32,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [rows, k]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // w [n, row bytes]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [rows, n]
                                  .Attr<int64_t>("wtype")        // GGML_TYPE_Q4_1 or GGML_TYPE_Q8_0
                                  .Ctx<ffi::ThreadPool>());

// Host-side helpers, called through ctypes when the weights are loaded.
extern "C" size_t lamina_ggml_row_size(int64_t type, int64_t n) {
  return ggml_row_size(static_cast<ggml_type>(type), n);
}

extern "C" size_t lamina_ggml_quantize(int64_t type, const float *src, void *dst, int64_t rows, int64_t n) {
  return ggml_quantize_chunk(static_cast<ggml_type>(type), src, dst, 0, rows, n, nullptr);
}

extern "C" void lamina_ggml_dequantize(int64_t type, const void *src, float *dst, int64_t n) {
  ggml_get_type_traits(static_cast<ggml_type>(type))->to_float(src, dst, n);
}
