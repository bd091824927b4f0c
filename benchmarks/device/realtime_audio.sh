#!/usr/bin/env bash
# benchmarks/realtime/audio.py on a GPU host's CPUs (it uses no GPU; it ran on a 16-core
# GPU host beside the GPU benchmarks, with the same wheelhouse).
# On a machine with a package index, build the wheelhouse (the wheels the host's python3
# lacks): `python -m benchmarks.device.wheelhouse` -> .wheelhouse/wheels.tar.xz. Copy the
# repository with .wheelhouse/ to the host (it needs no package index) and run there from
# the copy:
#
#   bash benchmarks/device/realtime_audio.sh [realtime/audio.py args]
#   e.g. --sessions 20,50 --realtime-workers 2 --api-processes 2
#
# First run: unpack, make a venv that sees the host's packages, install (seconds; venv.sh);
# later runs reuse it. Then the benchmark; its JSON goes to $OUT/realtime_audio<TAG>.json and
# its stderr to $OUT/realtime_audio<TAG>.log (TAG: from the arguments unless set). Env: OUT
# (default ./device-out), WHEELHOUSE (.wheelhouse), VENV (/tmp/oq-venv), PYTHON (python3),
# TAG.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check --optional
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"

echo "nproc: $(nproc)"
lscpu | grep 'Model name' || true

# shellcheck source=benchmarks/device/venv.sh
source benchmarks/device/venv.sh

TAG=${TAG-$(printf '%s' "$*" | sed 's/--//g; s/,/-/g; s/ /_/g' | tr -c 'A-Za-z0-9._-' '_')}
TAG=${TAG:+-$TAG}
json="$OUT/realtime_audio${TAG}.json"
t0=$(date +%s)
PYTHONUNBUFFERED=1 "$VENV/bin/python" -m benchmarks.realtime.audio "$@" >"$json" \
    2> >(tee "$OUT/realtime_audio${TAG}.log" >&2)
echo "benchmark_s: $(($(date +%s) - t0))  json: $json"
"$VENV/bin/python" - "$json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["machine"], "| realtime_workers", d.get("realtime_workers"),
      "| api_processes", d.get("api_processes"), "| slots", d.get("slots"))
p95 = lambda r, k: (r.get(k) or {}).get("p95")
for r in d["results"]:
    print(f"sessions={r['sessions']} ok={r['completed_checks']} errors={r['errors']}"
          f" sessions_with_underruns={r['sessions_with_underruns']}"
          f" first_audio_p95={p95(r, 'first_audio_after_speech_stopped_ms')}"
          f" barge_in_to_done_p95={p95(r, 'barge_in_to_done_ms')}"
          f" vad_onset_p95={p95(r, 'vad_onset_ms')} rtf_p50={(r.get('rtf') or {}).get('p50')}")
    print("  cpu_ms_per_session_second", r["cpu_ms_per_session_second"])
    print("  cores_used", r["cores_used"])
EOF
