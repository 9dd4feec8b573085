// y = x @ w.T with w in one of ggml's block-quantized formats (Q4_1, Q8_0, ...), as an XLA FFI
// custom call for the CPU: the weights stay compressed inside the matrix-vector product, so a
// one-row decode reads 0.6 (Q4_1) or 1.06 (Q8_0) bytes per weight instead of float32's 4.
//
// The kernels are ggml's own (ggml-cpu's `from_float` and `vec_dot` type traits, the ones
// llama.cpp's matrix-vector products use): the rows of x are quantized to the format's dot type
// (Q8_1 for Q4_1, Q8_0 for Q8_0) and each output is one `vec_dot` over a weight row. Built by
// scripts/kernels/build_ggml_matmul.sh against a native build of ggml; loaded by
// lamina_jax.model.ggml.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

const bool kInitialized = (ggml_cpu_init(), true);  // ggml-cpu's fp16 tables, before any vec_dot

constexpr int64_t kSlice = 64;  // output rows per unit of work

ffi::Error Matmul(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y,
                  int64_t wtype, ffi::ThreadPool pool) {
  const auto type = static_cast<ggml_type>(wtype);
  const ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu(type);
  if (traits->vec_dot == nullptr) return ffi::Error::InvalidArgument("no vec_dot for this ggml type");
  const int64_t rows = x.dimensions()[0], k = x.dimensions()[1], n = y->dimensions()[1];
  const size_t w_row = ggml_row_size(type, k);
  if (w.dimensions()[0] != n || static_cast<size_t>(w.dimensions()[1]) != w_row)
    return ffi::Error::InvalidArgument("weight blocks do not match the shapes of x and y");
  const size_t x_row = ggml_row_size(traits->vec_dot_type, k);
  std::vector<uint8_t> xq(x_row * rows);
  for (int64_t b = 0; b < rows; ++b)
    ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float(x.typed_data() + b * k, xq.data() + b * x_row, k);
  const uint8_t *ws = w.typed_data();
  float *out = y->typed_data();

  // Slices of output rows are claimed from a shared counter by this thread and by helpers on
  // XLA's intra-op pool. This thread works until none is left and then waits only for slices
  // already claimed, so the call completes even if no helper ever runs; the counters are shared
  // with the helpers so that one starting late finds nothing to do.
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  const int64_t slices = (n + kSlice - 1) / kSlice;
  auto counters = std::make_shared<Counters>();
  auto work = [=, &xq](Counters &c) {
    for (int64_t i; (i = c.next.fetch_add(1)) < slices; c.done.fetch_add(1, std::memory_order_release)) {
      const int64_t lo = i * kSlice, hi = std::min(n, lo + kSlice);
      for (int64_t b = 0; b < rows; ++b)
        for (int64_t j = lo; j < hi; ++j)
          traits->vec_dot(k, out + b * n + j, 0, ws + j * w_row, 0, xq.data() + b * x_row, 0, 1);
    }
  };
  for (int64_t t = 1; t < std::min<int64_t>(pool.num_threads(), slices); ++t)
    pool.Schedule([counters, work] { work(*counters); });
  work(*counters);
  while (counters->done.load(std::memory_order_acquire) < slices) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LaminaGgmlMatmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [rows, k]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // w [n, row bytes]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [rows, n]
                                  .Attr<int64_t>("wtype")        // enum ggml_type
                                  .Ctx<ffi::ThreadPool>());

// Host-side helpers, called through ctypes when the weights are loaded.
extern "C" size_t lamina_ggml_row_size(int64_t type, int64_t n) {
  return ggml_row_size(static_cast<ggml_type>(type), n);
}

extern "C" size_t lamina_ggml_quantize(int64_t type, const float *src, void *dst, int64_t rows, int64_t n) {
  return ggml_quantize_chunk(static_cast<ggml_type>(type), src, dst, 0, rows, n, nullptr);
}
