#!/usr/bin/env bash
# The whole comparison in one go: the SQS runner (one ministack for all SQS systems),
# then the one-machine runner (SQLite / Redis). Prints both tables; keeps the full
# output and the JSON figures in OUT (default /tmp/peers-results).
#
#   bash bench/peers/setup.sh && bash bench/peers/run_all.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PEERS_VENV:-/tmp/peers-venv}/bin/python"
OUT="${OUT:-/tmp/peers-results}"
SQS_ARGS="${SQS_ARGS:---jobs 5000 --entities 100 --concurrency 4 --fail-rate 0.1}"
LOCAL_ARGS="${LOCAL_ARGS:---jobs 20000 --entities 2000 --concurrency 4}"
mkdir -p "$OUT"
cd "$REPO"
echo "start: $(date -u +%FT%TZ) $(uptime)"
# shellcheck disable=SC2086
"$PY" bench/peers/compare_sqs.py $SQS_ARGS --json-out "$OUT/sqs.json" 2>&1 | tee "$OUT/sqs.txt"
# shellcheck disable=SC2086
"$PY" bench/peers/compare_local.py $LOCAL_ARGS --json-out "$OUT/local.json" 2>&1 |
    tee "$OUT/local.txt"
echo "end: $(date -u +%FT%TZ) $(uptime)"
