#!/usr/bin/env bash
# The benchmarks: what peermem's design buys (registration cost against host
# memory, GPU pins per registration, RDMA with coalesced scatter entries
# against one entry per GPU page), as ratios measured within one run in the
# rig. Sets up and builds like scripts/demo.sh, then boots the rig and runs
# tests/bench/bench_peermem there. ROUNDS per side (default 20).
#
#   scripts/bench.sh [--skip-setup] [--kdir DIR] [ROUNDS]
set -euo pipefail
{
args=()
rounds=20
while [ $# -gt 0 ]; do
	case "$1" in
	--skip-setup) args+=("$1"); shift ;;
	--kdir) args+=("$1" "${2:-}"); shift 2 || { echo "peermem: --kdir needs a directory" >&2; exit 1; } ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*[!0-9]*|'') echo "peermem: unknown argument '$1'; usage: scripts/bench.sh [--skip-setup] [--kdir DIR] [ROUNDS]" >&2; exit 1 ;;
	*) rounds=$1; shift ;;
	esac
done
exec "$(dirname "$0")/demo.sh" "${args[@]}" --bench "$rounds"
}
