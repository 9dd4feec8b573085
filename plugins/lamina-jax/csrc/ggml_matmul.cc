// y = x @ w.T with w in one of ggml's block-quantized formats (Q4_1, Q8_0, ...), as XLA FFI
// custom calls for the CPU: the weights stay compressed inside the matrix-vector product, so a
// one-row decode reads 0.6 (Q4_1) or 1.06 (Q8_0) bytes per weight instead of float32's 4.
//
// LaminaGgmlMatmul runs ggml's own kernels (ggml-cpu's `from_float` and `vec_dot` type traits,
// the ones llama.cpp's matrix-vector products use): the rows of x are quantized to the format's
// dot type (Q8_1 for Q4_1, Q8_0 for Q8_0) and each output is one `vec_dot` over a weight row.
//
// LaminaGgmlMatmulF32 keeps x in float32 and decodes each block in registers, so its products are
// those of the float32 matrix the blocks hold, up to the order of the float32 sums: ggml has no
// kernel that leaves the activations unrounded, and this one changes no greedy token of a GGUF
// whose matrices are these blocks. It handles Q4_1 (w = d*q + m, summed as d*sum(q*x) + m*sum(x))
// and Q8_0 (w = d*q).
//
// Built by scripts/kernels/build_ggml_matmul.sh against a native build of ggml; loaded by
// lamina_jax.model.ggml.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <immintrin.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

const bool kInitialized = (ggml_cpu_init(), true);  // ggml-cpu's fp16 tables, before any vec_dot

constexpr int64_t kSlice = 64;  // output rows per unit of work

// Runs work(lo, hi) over slices of [0, n), claimed from a shared counter by this thread and by
// helpers on XLA's intra-op pool. This thread works until none is left and then waits only for
// slices already claimed, so the call completes even if no helper ever runs; the counters are
// shared with the helpers so that one starting late finds nothing to do.
template <typename Work>
void InSlices(int64_t n, ffi::ThreadPool &pool, const Work &work) {
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  const int64_t slices = (n + kSlice - 1) / kSlice;
  auto counters = std::make_shared<Counters>();
  auto run = [=, &work](Counters &c) {
    for (int64_t i; (i = c.next.fetch_add(1)) < slices; c.done.fetch_add(1, std::memory_order_release))
      work(i * kSlice, std::min(n, (i + 1) * kSlice));
  };
  for (int64_t t = 1; t < std::min<int64_t>(pool.num_threads(), slices); ++t)
    pool.Schedule([counters, run] { run(*counters); });
  run(*counters);
  while (counters->done.load(std::memory_order_acquire) < slices) std::this_thread::yield();
}

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
  InSlices(n, pool, [&](int64_t lo, int64_t hi) {
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t j = lo; j < hi; ++j)
        traits->vec_dot(k, out + b * n + j, 0, ws + j * w_row, 0, xq.data() + b * x_row, 0, 1);
  });
  return ffi::Error::Success();
}

// Sixteen lanes of float32 and of bytes (GCC vector extensions: AVX-512 registers where the CPU
// has them, pairs of AVX2 ones elsewhere).
typedef float F32x16 __attribute__((vector_size(64)));
typedef uint8_t U8x16 __attribute__((vector_size(16)));
typedef int8_t I8x16 __attribute__((vector_size(16)));
typedef int32_t I32x16 __attribute__((vector_size(64)));

// Through int32: GCC leaves a direct byte-to-float conversion in scalar code.
template <typename V>
F32x16 Floats(V bytes) {
  return __builtin_convertvector(__builtin_convertvector(bytes, I32x16), F32x16);
}

template <typename V>
V Load(const void *p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float Half(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

float Sum(F32x16 v) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

constexpr int kRowGroup = 4;  // rows of x against each decoded block: weights are decoded once per group

// out[r] = x[r] . (row of blocks), for R rows of x; xsum[r][b] = the sum of x[r]'s block b (Q4_1).
template <int R>
void DotQ4_1(const uint8_t *w, int64_t blocks, const float *const *x, const float *const *xsum, float *const *out) {
  F32x16 acc[R] = {};
  float offsets[R] = {};
  for (int64_t b = 0; b < blocks; ++b, w += 20) {
    const float d = Half(w), m = Half(w + 2);
    const U8x16 q = Load<U8x16>(w + 4);
    const F32x16 lo = Floats<U8x16>(q & 0x0F), hi = Floats<U8x16>(q >> 4);
    for (int r = 0; r < R; ++r) {
      const float *xb = x[r] + b * 32;
      acc[r] += d * (lo * Load<F32x16>(xb) + hi * Load<F32x16>(xb + 16));
      offsets[r] += m * xsum[r][b];
    }
  }
  for (int r = 0; r < R; ++r) *out[r] = Sum(acc[r]) + offsets[r];
}

template <int R>
void DotQ8_0(const uint8_t *w, int64_t blocks, const float *const *x, const float *const *, float *const *out) {
  F32x16 acc[R] = {};
  for (int64_t b = 0; b < blocks; ++b, w += 34) {
    const float d = Half(w);
    const F32x16 lo = Floats(Load<I8x16>(w + 2)), hi = Floats(Load<I8x16>(w + 18));
    for (int r = 0; r < R; ++r) {
      const float *xb = x[r] + b * 32;
      acc[r] += d * (lo * Load<F32x16>(xb) + hi * Load<F32x16>(xb + 16));
    }
  }
  for (int r = 0; r < R; ++r) *out[r] = Sum(acc[r]);
}

using DotFn = void (*)(const uint8_t *, int64_t, const float *const *, const float *const *, float *const *);

template <DotFn F1, DotFn F2, DotFn F3, DotFn F4>
ffi::Error MatmulF32With(const ffi::Buffer<ffi::F32> &x, const uint8_t *ws, size_t w_row, float *out, int64_t n,
                         bool sums, ffi::ThreadPool &pool) {
  const int64_t rows = x.dimensions()[0], k = x.dimensions()[1], blocks = k / 32;
  const float *xs = x.typed_data();
  std::vector<float> xsum(sums ? rows * blocks : 0);
  for (int64_t r = 0; sums && r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      float s = 0;
      for (int i = 0; i < 32; ++i) s += xs[r * k + b * 32 + i];
      xsum[r * blocks + b] = s;
    }
  constexpr DotFn kDots[kRowGroup] = {F1, F2, F3, F4};
  InSlices(n, pool, [&](int64_t lo, int64_t hi) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
      const int group = static_cast<int>(std::min<int64_t>(kRowGroup, rows - r0));
      const float *x_rows[kRowGroup], *sum_rows[kRowGroup];
      float *out_rows[kRowGroup];
      for (int r = 0; r < group; ++r) {
        x_rows[r] = xs + (r0 + r) * k;
        sum_rows[r] = sums ? xsum.data() + (r0 + r) * blocks : nullptr;
      }
      for (int64_t j = lo; j < hi; ++j) {
        for (int r = 0; r < group; ++r) out_rows[r] = out + (r0 + r) * n + j;
        kDots[group - 1](ws + j * w_row, blocks, x_rows, sum_rows, out_rows);
      }
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
  if (type == GGML_TYPE_Q4_1)
    return MatmulF32With<DotQ4_1<1>, DotQ4_1<2>, DotQ4_1<3>, DotQ4_1<4>>(x, w.typed_data(), w_row, y->typed_data(),
                                                                       n, true, pool);
  if (type == GGML_TYPE_Q8_0)
    return MatmulF32With<DotQ8_0<1>, DotQ8_0<2>, DotQ8_0<3>, DotQ8_0<4>>(x, w.typed_data(), w_row, y->typed_data(),
                                                                       n, false, pool);
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
