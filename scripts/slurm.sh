#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm pool's tests and for trying it out:
# Debian's slurm-wlm and munge (apt), munged + slurmctld + slurmd as root, partition `debug`
# of this host's CPUs (`ProctrackType=proctrack/linuxproc`, no cgroup plugin: the worker's own
# per-job cgroups stay in charge), state under /var/spool/torchyard-slurm. Idempotent: a running
# cluster that answers `sinfo` is left as it is. Needs root (apt, the daemons).
# Usage: bash scripts/slurm.sh [start|stop]
set -euo pipefail

STATE=/var/spool/torchyard-slurm
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)

stop() {
  pkill -x slurmd || true
  pkill -x slurmctld || true
  for _ in $(seq 1 40); do
    pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || return 0
    sleep 0.25
  done
}

if [ "${1:-start}" = stop ]; then
  stop
  exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
fi

node_up() { timeout 5 sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }

if node_up && grep -q "torchyard one-node" "$CONF" 2>/dev/null; then
  exit 0  # already up
fi

mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge "$STATE/ctld" "$STATE/d" /var/log/slurm
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! pgrep -x munged >/dev/null; then
  rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock  # a dead munged's
  su -s /bin/sh munge -c munged || munged --force
fi
for _ in $(seq 1 40); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.25; done

cat >"$CONF" <<EOF
# torchyard one-node cluster (scripts/slurm.sh)
ClusterName=torchyard
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=600
KillWait=10
SlurmdTimeout=30
InactiveLimit=0
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
printf 'ConstrainCores=no\nConstrainRAMSpace=no\n' >/etc/slurm/cgroup.conf

stop
slurmctld -c  # a clean state: no jobs of an earlier cluster
slurmd
for _ in $(seq 1 60); do
  node_up && exit 0
  sleep 0.5
done
echo "slurm.sh: the node did not come up idle:" >&2
sinfo >&2 || true
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
