#!/usr/bin/env bash
# The JAX executor on a GPU or TPU machine, in one command: the devices JAX sees, the executor's
# fast tests, and decode tok/s at 1, 16 and 64 streams (benchmarks/executor_throughput.py --quick)
# with the memory bandwidth each uses against the device's peak (a table of known devices below,
# or LAMINA_DEVICE_BW_GBS; "unknown" otherwise), and the backend's decode-attention kernel (the
# Pallas one on a GPU or TPU) against the JAX form (benchmarks/decode_attention.py --quick). Stops at
# once, non-zero, when JAX sees only CPU devices, unless --allow-cpu. With $OUT set, leaves there device_check.json (the summary; also
# the last line of stdout), executor_throughput.log and decode_attention.log (the benchmarks' output).
#
#   bash scripts/device_check.sh [--allow-cpu] [--no-tests] [--no-bench] [-- more benchmark flags]
#
# LAMINA_PYTHON runs Python (default `uv run python`), e.g. `python3` where the packages are
# installed already and uv cannot sync.
set -euo pipefail
cd "$(dirname "$0")/.."

allow_cpu=0 tests=1 bench=1
while [ $# -gt 0 ]; do
    case "$1" in
        --allow-cpu) allow_cpu=1 ;;
        --no-tests) tests=0 ;;
        --no-bench) bench=0 ;;
        --) shift; break ;;
        *) echo "usage: $0 [--allow-cpu] [--no-tests] [--no-bench] [-- benchmark flags]" >&2; exit 2 ;;
    esac
    shift
done
read -ra python <<< "${LAMINA_PYTHON:-uv run python}"
out=${OUT:-$(mktemp -d)}
[ -n "${OUT:-}" ] || trap 'rm -rf "$out"' EXIT

"${python[@]}" - "$allow_cpu" "$out/device_check.json" <<'EOF'
import json, sys
import jax
devices = jax.devices()
print(f"jax {jax.__version__}, backend {jax.default_backend()}: {devices}")
if devices[0].platform == "cpu" and sys.argv[1] != "1":
    sys.exit("JAX sees only CPU devices (is lamina-jax[cuda12] or [tpu] installed?): --allow-cpu to go on")
with open(sys.argv[2], "w") as f:
    json.dump({"jax": jax.__version__, "backend": jax.default_backend(), "device_kind": devices[0].device_kind,
               "devices": [str(d) for d in devices]}, f)
EOF

if [ "$tests" = 1 ]; then
    "${python[@]}" -m pytest -q -p no:cacheprovider plugins/lamina-jax/tests -m "not slow and not tensor_parallel" -x
fi
[ "$bench" = 1 ] || exit 0
"${python[@]}" benchmarks/executor_throughput.py --quick --json --peer none --streams 1,16,64 "$@" \
    | tee "$out/executor_throughput.log"
"${python[@]}" benchmarks/decode_attention.py --quick --json | tee "$out/decode_attention.log"

"${python[@]}" - "$out/executor_throughput.log" "$out/device_check.json" "$out/decode_attention.log" <<'EOF'
import json, os, re, sys

PEAK_GBS = [  # jax's device_kind (lower case) → peak memory bandwidth, GB/s; the first match wins
    (r"\bh200\b", 4800), (r"\bh100 nvl\b", 3900), (r"\bh100 pcie\b", 2000), (r"\bh100\b", 3350),
    (r"\ba100-sxm4-80gb\b", 2039), (r"\ba100 80gb pcie\b", 1935), (r"\ba100\b", 1555), (r"\bb200\b", 8000),
    (r"\bl40s\b", 864), (r"\bl4\b", 300), (r"^tpu v6 lite$", 1640), (r"^tpu v5 lite$", 819), (r"^tpu v5p?$", 2765),
    (r"^tpu v4$", 1228),
]
with open(sys.argv[1]) as f:
    bench = json.loads(f.read().splitlines()[-1])
with open(sys.argv[2]) as f:
    summary = json.load(f)
kind = summary["device_kind"]
given = os.environ.get("LAMINA_DEVICE_BW_GBS")
peak = float(given) if given else next((gbs for pattern, gbs in PEAK_GBS if re.search(pattern, kind.lower())), None)
memory, config = bench["memory"], bench["config"]
context = config["short_prompt_len"] + config["decode_tokens"] / 2  # a stream's mean context while decoding
rows = []
for d in bench["jax"]["decode"]:
    n = d["streams"]
    step_bytes = memory["decode_weights_bytes"][str(n)] + n * context * memory["kv_cache_bytes_per_token"]
    gbs = d["aggregate_decode_tok_s"] / n * step_bytes / 1e9
    rows.append({"streams": n, "decode_tok_s": d["aggregate_decode_tok_s"], "per_stream_tok_s": d["per_stream_tok_s"],
                 "read_gb_s": gbs, "bandwidth_utilisation": gbs / peak if peak else None})
with open(sys.argv[3]) as f:
    attention = json.loads(f.read().splitlines()[-1])
summary.update(peak_gb_s=peak, peak_source="LAMINA_DEVICE_BW_GBS" if given else "table" if peak else None,
               weights_dtype=config["weights_dtype"], formats=bench["formats"], decode=rows,
               decode_attention={"kernel_module": attention["kernel_module"], "results": attention["results"]})
print(f"\n{kind}: peak memory bandwidth " + (f"{peak:.0f} GB/s ({summary['peak_source']})" if peak else "unknown"))
print(f"{'streams':>7} {'tok/s':>9} {'tok/s/stream':>12} {'GB/s read':>10} {'of peak':>8}")
for r in rows:
    share = f"{r['bandwidth_utilisation']:.0%}" if peak else "unknown"
    print(f"{r['streams']:>7} {r['decode_tok_s']:9.1f} {r['per_stream_tok_s']:12.1f} {r['read_gb_s']:10.1f} {share:>8}")
print("(GB/s read: each step's weights and the streams' mean KV, times steps per second)")
with open(sys.argv[2], "w") as f:
    json.dump(summary, f)
print(json.dumps(summary))
EOF
