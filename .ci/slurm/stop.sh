#!/bin/bash
# Stop the daemons .ci/slurm/start.sh started (by pid file) and wait until each has exited.
set -uo pipefail
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:\s*Z' "/proc/$1/status" 2>/dev/null; }
stop() {  # $1: pid file
  local p; p=$(cat "$1" 2>/dev/null) || return 0
  if [ -n "$p" ] && alive "$p"; then
    kill "$p" 2>/dev/null
    for _ in $(seq 150); do alive "$p" || break; sleep 0.1; done
    alive "$p" && kill -9 "$p" 2>/dev/null  # seen: a slurmd that never registered ignores SIGTERM
  fi
  rm -f "$1"
}
for f in /run/slurmd-n1.pid /run/slurmd-n2.pid /run/slurmd-n3.pid /run/slurmctld.pid /run/munge/munged.pid; do stop "$f"; done
