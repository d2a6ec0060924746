#!/usr/bin/env bash
# Create the peers' benchmark virtualenv: shardq (editable, from this repo) plus the
# systems it is compared with, at exact versions. The peers are never dependencies of
# shardq: they live only in this virtualenv (default /tmp/peers-venv).
#
#   bash bench/peers/setup.sh            # or: PEERS_VENV=/path PYTHON=python3.11 bash ...
#   bash bench/peers/setup.sh --apt      # also apt-get install the system packages
#
# System packages (Debian): libcurl4-openssl-dev and libssl-dev to build pycurl (kombu's
# SQS transport needs it), redis-server for RQ.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${PEERS_VENV:-/tmp/peers-venv}"
PY="${PYTHON:-python3}"

if [[ "${1:-}" == "--apt" ]]; then
    apt-get update -q
    apt-get install -y -q libcurl4-openssl-dev libssl-dev redis-server
fi
# pycurl ships binary wheels (with their own libcurl) for common platforms; the -dev
# packages are needed only where pip has to build it. redis-server: compare_local.py.
command -v curl-config >/dev/null ||
    echo "note: no curl-config; if pip must build pycurl: apt-get install -y" \
        "libcurl4-openssl-dev libssl-dev (or run this script with --apt)" >&2
command -v redis-server >/dev/null ||
    echo "note: no redis-server; compare_local.py needs it for RQ: apt-get install -y" \
        "redis-server (or run this script with --apt)" >&2

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade "pip==23.2.1"
# The peers and the emulator, pinned; every other package pinned by constraints.txt.
"$VENV/bin/pip" install -q -c "$HERE/constraints.txt" -e "$REPO" \
    "celery[sqs]==5.7.0" "kombu==5.7.0" "pycurl==7.49.0" \
    "sqs-workers==0.7.3" \
    "dramatiq==2.2.1" "dramatiq-sqs==0.4.4" \
    "huey==3.5.4" \
    "rq==2.12.0" "redis==8.1.0" \
    "ministack==1.5.33" "psutil==7.2.2"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
names = ["shardq", "celery", "kombu", "pycurl", "sqs-workers", "dramatiq", "dramatiq-sqs",
         "huey", "rq", "redis", "ministack", "boto3", "botocore", "structlog", "psutil"]
print("peers venv ready: " + ", ".join(f"{n} {md.version(n)}" for n in names))
EOF
