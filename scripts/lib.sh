# shellcheck shell=bash
# Common helpers for peermem's scripts: staged logging with elapsed time,
# one-line fatal errors, and the cache layout shared by every script.

PEERMEM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERMEM_CACHE=${PEERMEM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/peermem}
# The kernel the rig uses. linux-source-7.3 lives in trixie-backports.
RIG_KVER=${RIG_KVER:-7.3}
export PEERMEM_ROOT PEERMEM_CACHE RIG_KVER

_pm_t0=${_pm_t0:-$(date +%s)}
export _pm_t0
_pm_stage_t=$(date +%s)

pm_log()   { printf '[peermem %4ds] %s\n' "$(( $(date +%s) - _pm_t0 ))" "$*" >&2; }
pm_stage() {
	local now; now=$(date +%s)
	pm_log "== $* (previous stage took $(( now - _pm_stage_t ))s)"
	_pm_stage_t=$now
}
# die WHAT HOWTOFIX: one clear line, then exit 1.
pm_die()   { printf 'peermem: error: %s\n' "$*" >&2; exit 1; }

# pm_usage_die MSG USAGE: a usage error (exit 2), the usage line after it.
pm_usage_die() { printf 'peermem: error: %s\nusage: %s\n' "$1" "$2" >&2; exit 2; }
# pm_need_value USAGE OPT [VALUE...]: OPT must have a value (not empty, not
# another option); else a usage error. Call as: pm_need_value "$usage" "$@".
pm_need_value() {
	[ $# -ge 3 ] && [ -n "$3" ] && [[ $3 != --* ]] || pm_usage_die "option $2 needs a value" "$1"
}
# pm_help FILE END: print FILE's header comment (line 2 to the line matching END).
# pm_help SCRIPT END_RE: a usage line first (the header's first
# "#   scripts/..." or "#   tests/..." line), then the header up to END_RE.
pm_help() {
	local u
	u=$(sed -n "2,/$2/{s@^#   \(\(scripts\|tests\)/[^ ].*\)\$@\1@p}" "$1" | head -n 1)
	[ -z "$u" ] || printf 'usage: %s\n\n' "$u"
	sed -n "2,/$2/p" "$1" | sed '$d; /^# SPDX/d; s/^# \{0,1\}//'
}

pm_need_cmd() { # cmd "how to get it"
	command -v "$1" >/dev/null 2>&1 || pm_die "'$1' not found; $2"
}

pm_sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
