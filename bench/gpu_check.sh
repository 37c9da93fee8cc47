#!/usr/bin/env bash
# The GPU suite as one prepared script (issue 21): what a machine with one GPU and no network
# runs in under 7 minutes, printing a table and one JSON line. On a CPU machine it runs the
# parts a CPU can (facts, the monitoring cost on the CPU step) and says why the rest is skipped.
#
#   bench/gpu_check.sh [OUT_DIR]        # figures and logs land in OUT_DIR (default .unicron/gpu)
#
# Two NCCL ranks share the machine's one GPU in tests/gpu: each agent gets its own NCCL_HOSTID,
# a test-only trick that makes NCCL treat the two processes as two hosts. Production never
# needs it: an agent gives each rank a GPU of its own.
#
# A lent machine has Python and a CUDA torch but not this project's other packages: put their
# wheels in .whl/ (bench/gpu_wheels.sh fetches them here) and carry that folder; this script
# installs them, without the network, into a directory of its own.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.unicron/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"

if [ -d .whl ] && ! "$PY" -c "import unicron" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/unicron-site .whl/*.whl \
    && "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/unicron-site . \
    || { echo "gpu_check: cannot install the carried wheels" >&2; exit 2; }
  export PYTHONPATH=/tmp/unicron-site
fi
# the stacks' logs (agents, workers, NCCL's warnings) land in $OUT too, so a failure comes back
# with its cause from a machine that is gone once the run ends
export PYTHONUNBUFFERED=1 UNICRON_GPU_FIGURES="$OUT/gpu.json" UNICRON_GPU_LOGS="$OUT/stacks"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
rm -f "$UNICRON_GPU_FIGURES"

echo "== facts"
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: no NVIDIA driver here"
"$PY" - <<'PY' | tee "$OUT/facts.json"
import json, platform, torch
cuda = torch.cuda.is_available()
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "cuda_available": cuda,
                  "device": torch.cuda.get_device_name(0) if cuda else None}))
PY

echo "== NVML health, read once"
"$PY" - > "$OUT/nvml.json" 2> "$OUT/nvml.err" <<'PY' || echo "NVML: $(tail -1 "$OUT/nvml.err")"
# what the agent's watch reads at each look (services/agent/gpuhealth.py), once
import dataclasses, json
from unicron.services.agent.gpuhealth import _look
from unicron.services.agent.nvml import import_pynvml, open_session
session = open_session(import_pynvml)
try:
    print(json.dumps([{**dataclasses.asdict(g), **dataclasses.asdict(r)} for g, r in _look(session)],
                     default=str))
finally:
    session.close()
PY
cat "$OUT/nvml.json" 2>/dev/null

echo "== the GPU tests (train API on CUDA and its resume; two NCCL ranks: SIGKILL, CUDA error, hang)"
timeout 420 "$PY" -m pytest -m gpu -rs -p no:randomly -q tests/gpu 2>&1 | tee "$OUT/tests.log" | tail -15
tests_rc=${PIPESTATUS[0]}

echo "== the monitoring cost per step"
device=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
timeout 180 "$PY" bench/overhead.py --device "$device" 2>&1 | tee "$OUT/overhead.log" | tail -12

"$PY" - "$OUT" "$tests_rc" <<'PY'
import json, pathlib, sys
out, tests_rc = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def load(name):
    try:
        return json.loads((out / name).read_text().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {}
figures = {**load("facts.json"), **load("gpu.json"), "tests_exit_code": tests_rc}
overhead = load("overhead.log")
figures.update({f"overhead_{k}": v for k, v in overhead.items() if isinstance(v, (int, float))})
width = max(map(len, figures))
print("\n".join(f"{k:<{width}}  {v}" for k, v in figures.items()))
print(json.dumps(figures))
PY
