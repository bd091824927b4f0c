#!/usr/bin/env bash
# FP8 weights against BF16, and the combinations the GPU decides (issue 44):
# benchmarks/gpu/fp8_quality.py in process, on the adapters a worker runs.
#
# On a machine with a package index, once:
#   python -m benchmarks.device.wheelhouse      # .wheelhouse/wheels.tar.xz (torchao included)
#   bash benchmarks/device/h3.sh --pack         # .wheelhouse/h3/ (no servers needed here)
# Copy the repository with .wheelhouse/ to the GPU host (it needs no package index) and run
# there from the copy:
#   bash benchmarks/device/fp8.sh --random --combos             # random weights, real sizes
#   bash benchmarks/device/fp8.sh --registry models.toml --model NAME --combos
#                                                               # released weights: an entry
#   bash benchmarks/device/fp8.sh --random --only h3 --fp8-modulation
#                                     # the FP8 sides with fp8_modulation = true (H3's adaLN
#                                     # projections FP8 weight-only too)
#   bash benchmarks/device/fp8.sh --probe-group [--pageable]    # FP8 through group offloading
#                                                               # (benchmarks/gpu/fp8_group_probe.py)
# The wheels of .wheelhouse/h3 go to /tmp/fp8-site with --no-deps over the host's packages
# (preflight.sh's site_install; torch, transformers, accelerate and peft are the image's).
# FP8 needs a GPU of compute capability 8.9 or more (Ada, Hopper, Blackwell): on an older
# one the FP8 sides are refused as a worker refuses them, and the JSON says so.
# JSON to $OUT/gpu_fp8_quality.json, the log to $OUT/gpu_fp8_quality.log (…_modulation.json
# and .log with --fp8-modulation; OUT: ./device-out unless set); copy the JSON to
# docs/evidence/.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check
OUT=${OUT:-$PWD/device-out}
SITE=/tmp/fp8-site
site_install "$SITE" .wheelhouse/h3/wheels.tar.xz
mkdir -p "$OUT"
export PYTHONPATH="$SITE:$PWD"
python3 -c 'import torch, torchao
print("torch", torch.__version__, "torchao", torchao.__version__,
      "capability", torch.cuda.get_device_capability(0))'
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
if [ "${1:-}" = "--probe-group" ]; then  # FP8 weights through group offloading
    shift
    python3 -m benchmarks.gpu.fp8_group_probe "$@" | tee "$OUT/gpu_fp8_group_probe.json"
    exit 0
fi
mode=""  # the run's files are its mode's: fp8_quality.py names them the same way
case " $* " in *" --fp8-modulation "*) mode=_modulation ;; esac
bench_with python3 "$OUT/gpu_fp8_quality$mode.log" gpu.fp8_quality "$@"
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for name, m in d["models"].items():
    print(name, "fp8_modulation", m.get("fp8_modulation"), "transformer_gib",
          {label: s.get("transformer_gib") for label, s in m["sides"].items()})
    for label, c in m["against"].items():
        keep = ("latent_cosine_min", "frames_psnr_db", "resident_mib_saved",
                "transformer_gib_saved", "step_speedup")
        print(name, label, "vs", c["baseline"], {k: c.get(k) for k in keep})' \
    "$OUT/gpu_fp8_quality$mode.json"
