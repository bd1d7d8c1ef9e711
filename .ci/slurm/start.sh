#!/bin/bash
# Install (once) and start a Slurm with three node names on this host, for the `slurm`-marked tests.
#   bash .ci/slurm/start.sh          # idempotent; needs root (CI runs as root on Debian 12, no systemd)
# Daemons: munged, slurmctld, three slurmd (-N n1, -N n2, -N n3). No slurmdbd: nothing here needs accounting.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# running = the pid file names a live, non-zombie process (PID 1 here may reap orphans late)
running() { local p; p=$(cat "$1" 2>/dev/null) && [ -n "$p" ] && [ -d "/proc/$p" ] && ! grep -q '^State:\s*Z' "/proc/$p/status"; }
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurmctld slurmd slurm-client munge >/dev/null
fi
mkdir -p /etc/slurm /var/spool/slurmd/n1 /var/spool/slurmd/n2 /var/spool/slurmd/n3 /var/lib/slurm/slurmctld /var/log/slurm /run/munge
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 3 ))  # each "node" claims a third of the host
[ "$mem_mb" -gt 10000 ] && mem_mb=10000
sed -e "s/@CPUS@/$cpus/g" -e "s/@MEM_MB@/$mem_mb/g" "$HERE/slurm.conf" > /etc/slurm/slurm.conf.new
mv /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf
# munge: the Debian package's postinst makes the key; make one if it did not
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 2>/dev/null
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
fi
chown munge:munge /run/munge
running /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
running /run/slurmctld.pid || /usr/sbin/slurmctld -i
for n in n1 n2 n3; do running "/run/slurmd-$n.pid" || /usr/sbin/slurmd -N "$n"; done
for _ in $(seq 200); do
  [ "$(timeout 2 sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] && break; sleep 0.1
done
state=$(timeout 2 sinfo -h -o %T 2>/dev/null | sort -u | tr '\n' ' ')
[ "$state" = "idle " ] || { echo "slurm did not come up idle (nodes: $state); see /var/log/slurm/" >&2; exit 1; }
sinfo -N
