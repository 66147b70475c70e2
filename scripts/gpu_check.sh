#!/usr/bin/env bash
# Issue 52: everything a lent GPU machine should run, in one command, within 4 minutes on one H100.
#
#   OUT=/some/folder bash scripts/gpu_check.sh                 # every part
#   OUT=/some/folder bash scripts/gpu_check.sh --parts tests,verify
#
# Runs from the checkout with PYTHONPATH=. (pdsr need not be installed). The machine has Python 3.12, torch +
# CUDA, triton, transformers, numba and pyarrow but not pydantic, pytest, ...: first the pins of
# scripts/gpu_wheels.txt it lacks are installed from .gpu_wheels/ (fetch them beforehand with
# scripts/gpu_wheels.sh, and carry that folder: git ignores it) into .gpu_site/, which goes on PYTHONPATH.
# Then each part runs under its own timeout and writes its JSON into $OUT as it goes, so a part that runs out of
# time loses only itself:
#   tests    pytest -m cuda (Triton GAE, CUDA IPC across two processes, packed vs unpacked scoring)
#            -> tests.json (+ tests.junit.xml, tests.log)
#   gae      bench/gpu.py --part gae: GAE at B=256 x T=131072 against a device copy  -> gpu_gae.json
#   score    bench/gpu.py --part score: tokens/s of the token quota and packed, MFU, against the no-padding
#            ideal -> gpu_score.json
#   verify   bench/verify_cost.py: one 7B-shaped layer, tokens per step 1..8 x batch 1..256 -> verify_cost.json
# and summary.json (each part's exit status, seconds, timeout), install.json, env.json and a .log per part.
# Without CUDA every part still runs and says so (the tests skip; the benches write "skipped": "no CUDA device").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    cat <<'EOF'
Options:
  --parts LIST     comma-separated subset of: tests,gae,score,verify (default: all, in that order)
  --wheels DIR     the wheel folder (default .gpu_wheels, or $GPU_WHEELS)
  --site DIR       where they are installed (default .gpu_site, or $GPU_SITE)
  --no-install     use the interpreter as it is (its own packages)
  --python PY      the interpreter (default $PYTHON, else python3)
  -h, --help       this text
Environment: OUT (required: the output folder), and the per-part timeouts in seconds:
  T_TESTS (default 100), T_GAE (30), T_SCORE (170), T_VERIFY (30); install takes a few seconds.
On an H100 (2026-11-27) the parts took 83, 17, about 110 and 18 s.
Exit status: 0 when every part exited 0 (skips included), else 1; 2 for bad arguments.
EOF
}

parts="tests,gae,score,verify"
wheels="${GPU_WHEELS:-.gpu_wheels}"
site="${GPU_SITE:-.gpu_site}"
py="${PYTHON:-python3}"
do_install=1
while [ $# -gt 0 ]; do
    case "$1" in
        --parts) parts="${2:?--parts needs a list}"; shift 2 ;;
        --parts=*) parts="${1#*=}"; shift ;;
        --wheels) wheels="${2:?--wheels needs a folder}"; shift 2 ;;
        --site) site="${2:?--site needs a folder}"; shift 2 ;;
        --python) py="${2:?--python needs an interpreter}"; shift 2 ;;
        --no-install) do_install=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "${OUT:-}" ]; then
    echo "gpu_check.sh: set OUT to the folder the results go to (OUT=/tmp/gpucheck bash scripts/gpu_check.sh)" >&2
    exit 2
fi
IFS=',' read -r -a wanted <<< "$parts"
for p in "${wanted[@]}"; do
    case "$p" in tests|gae|score|verify) ;; *) echo "gpu_check.sh: unknown part '$p' (tests, gae, score, verify)" >&2; exit 2 ;; esac
done
if ! command -v "$py" >/dev/null 2>&1; then
    echo "gpu_check.sh: no Python interpreter '$py' (pass --python)" >&2
    exit 2
fi
T_TESTS="${T_TESTS:-100}" T_GAE="${T_GAE:-30}" T_SCORE="${T_SCORE:-170}" T_VERIFY="${T_VERIFY:-30}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
start_all=$(date +%s)
status=0
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
helper=scripts/gpu_check_helper.py

echo "gpu_check.sh: results in $OUT; parts: $parts; python: $($py -c 'import sys; print(sys.version.split()[0])')"
if [ "$do_install" = 1 ]; then
    if [ -d "$wheels" ]; then
        "$py" "$helper" install "$wheels" "$site" "$OUT/install.json" 2>&1 | tee "$OUT/install.log"
    else
        echo "gpu_check.sh: no wheel folder '$wheels' (run scripts/gpu_wheels.sh where a registry can be reached and carry it); going on without" | tee "$OUT/install.log"
    fi
    site_abs="$(mkdir -p "$site" && cd "$site" && pwd)"
    export PYTHONPATH=".:$site_abs${PYTHONPATH#.}"
fi

"$py" - "$OUT/env.json" <<'EOF' 2>&1 | tee "$OUT/env.log"
import json, platform, subprocess, sys
env = {"python": sys.version.split()[0], "platform": platform.platform()}
try:
    import torch
    env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), memory_gib=round(p.total_memory / 2**30, 1),
                   device_count=torch.cuda.device_count())
except Exception as exc:  # noqa: BLE001
    env["torch_error"] = repr(exc)
for mod in ("triton", "transformers", "numba", "pyarrow", "pydantic", "pytest"):
    try:
        env[mod] = __import__(mod).__version__
    except Exception as exc:  # noqa: BLE001
        env[mod] = f"missing: {exc!r}"[:200]
try:
    env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                        "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
except Exception:  # noqa: BLE001
    env["nvidia_smi"] = None
json.dump(env, open(sys.argv[1], "w"), indent=1)
print("env:", ", ".join(f"{k} {v}" for k, v in env.items() if k != "platform"))
EOF

# run_part NAME TIMEOUT JSON_FILE COMMAND...: the command under its own timeout, its output in NAME.log
run_part() {
    local name="$1" limit="$2" json_file="$3"
    shift 3
    echo
    echo "== $name (timeout ${limit}s): $*"
    local t0 rc
    t0=$(date +%s)
    timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    local secs=$(( $(date +%s) - t0 ))
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "== $name: TIMED OUT after ${secs}s (rc $rc); what it wrote to $json_file stays"
    else
        echo "== $name: rc $rc in ${secs}s"
    fi
    PART_RC=$rc PART_SECS=$secs
    [ "$rc" = 0 ] || status=1
    "$py" "$helper" part "$OUT/summary.json" "$name" "$rc" "$secs" "$limit" "$json_file"
}

for p in "${wanted[@]}"; do
    case "$p" in
        tests)
            # -o addopts="": one process (pyproject's `-n 2` needs pytest-xdist, which the machine lacks)
            rm -f "$OUT/tests.junit.xml"
            run_part tests "$T_TESTS" "$OUT/tests.json" \
                "$py" -m pytest -o addopts="" -m cuda -v -rA -p no:cacheprovider --continue-on-collection-errors \
                --junitxml="$OUT/tests.junit.xml" tests
            "$py" "$helper" pytest-json "$OUT/tests.log" "$OUT/tests.junit.xml" "$OUT/tests.json" "$PART_RC" "$PART_SECS"
            "$py" "$helper" part "$OUT/summary.json" tests "$PART_RC" "$PART_SECS" "$T_TESTS" "$OUT/tests.json"
            ;;
        gae)
            run_part gae "$T_GAE" "$OUT/gpu_gae.json" "$py" bench/gpu.py --part gae --json "$OUT/gpu_gae.json" ;;
        score)
            run_part score "$T_SCORE" "$OUT/gpu_score.json" \
                "$py" bench/gpu.py --part score --budgets 65536 16384 --fixed-mbs --json "$OUT/gpu_score.json" ;;
        verify)
            run_part verify "$T_VERIFY" "$OUT/verify_cost.json" \
                "$py" bench/verify_cost.py --repeat 10 --json "$OUT/verify_cost.json" ;;
    esac
done

echo
echo "gpu_check.sh: done in $(( $(date +%s) - start_all ))s; JSON in $OUT:"
ls -1 "$OUT"/*.json 2>/dev/null | sed 's/^/  /'
"$py" "$helper" summary "$OUT/summary.json"
exit "$status"
