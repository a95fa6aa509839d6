#!/usr/bin/env bash
# Data through the FUSE mount: stampfs next to MooseFS and the local disk, on this
# machine, in one run.
#
# mfschunkserver refuses a master on 127.0.0.0/8, so both file systems' servers run in a
# network namespace this script creates, reached over a veth pair (10.203.N.1 on the
# host side, 10.203.N.2 in the namespace); both mounts run on the host and cross the
# same veth (MTU 65535, as loopback's). Nothing else is addressed. In the namespace, with data in a temp dir on
# the current disk:
#   - stampfs: `stampfs master --replication R` and R chunkservers;
#   - MooseFS (Debian: moosefs-master, moosefs-chunkserver, moosefs-client): mfsmaster
#     and R mfschunkservers, goal R set on the mount's root;
# then `stampfs mount` and `mfsmount` on the host and `stampfs bench mount-io` on
# moosefs, stampfs (and stampfs-base with --baseline) and the local disk, each phase on
# each target in turn. Afterwards it unmounts, stops what it started (by pid) and
# deletes the namespace.
#
# Usage (as root: FUSE, namespaces, dropping the page cache):
#   scripts/mount-io-bench.sh [STAMPFS_BINARY] [--replicas R] [--baseline OTHER_BINARY]
#                             [--no-moosefs] [-- BENCH ARGS]
#   e.g. scripts/mount-io-bench.sh target/release/stampfs -- --size 2GiB --sync-ops 1000
set -euo pipefail

BIN=target/release/stampfs
MOOSEFS=1
BASELINE=""
REPLICAS=1
BENCH_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-moosefs) MOOSEFS=0 ;;
        --baseline) shift; BASELINE=$(readlink -f "$1") ;;
        --replicas) shift; REPLICAS="$1" ;;
        --) shift; BENCH_ARGS=("$@"); break ;;
        *) BIN="$1" ;;
    esac
    shift
done
BIN=$(readlink -f "$BIN")
[ -x "$BIN" ] || { echo "no stampfs binary at $BIN (cargo build --release)" >&2; exit 2; }
command -v ip >/dev/null || { echo "ip is missing (apt-get install iproute2)" >&2; exit 2; }
if [ "$MOOSEFS" = 1 ]; then
    for c in mfsmaster mfschunkserver mfsmount mfssetgoal; do
        command -v "$c" >/dev/null || { echo "MooseFS is not installed (apt-get install moosefs-master moosefs-chunkserver moosefs-client)" >&2; exit 2; }
    done
fi

WORK=$(mktemp -d "$PWD/.mount-io-bench.XXXXXX")
NET=$((RANDOM % 250 + 1))
NS="stampfs-io-$$"
HOST_IP=10.203.$NET.1
NS_IP=10.203.$NET.2
PIDS=()
MOUNTS=()
cleanup() {
    set +e
    for m in ${MOUNTS[@]+"${MOUNTS[@]}"}; do
        grep -q " $m " /proc/mounts && { umount "$m" 2>/dev/null || umount -l "$m"; }
    done
    for p in ${PIDS[@]+"${PIDS[@]}"}; do kill "$p" 2>/dev/null; done
    for p in ${PIDS[@]+"${PIDS[@]}"}; do wait "$p" 2>/dev/null; done
    ip netns del "$NS" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_for() { # CMD, what
    for _ in $(seq 1 300); do
        if eval "$1"; then return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for $2" >&2
    for f in "$WORK"/*.log; do echo "== $f" >&2; tail -5 "$f" >&2; done
    exit 1
}
in_ns() { ip netns exec "$NS" "$@"; }

# --- the namespace and its veth pair.
ip netns add "$NS"
ip link add "sfio$$h" type veth peer name "sfio$$n"
ip link set "sfio$$n" netns "$NS"
# loopback's MTU (veth defaults to 1500: 40 times the packets for the same bytes).
ip link set "sfio$$h" mtu 65535
in_ns ip link set "sfio$$n" mtu 65535
ip addr add "$HOST_IP/30" dev "sfio$$h"
ip link set "sfio$$h" up
in_ns ip addr add "$NS_IP/30" dev "sfio$$n"
in_ns ip link set "sfio$$n" up
in_ns ip link set lo up

# --- stampfs: a master and R chunkservers in the namespace, the mount on the host.
start_stampfs() { # BINARY NAME PORT
    local bin=$1 name=$2 port=$3
    local d="$WORK/$name"
    mkdir -p "$d" "$WORK/mnt-$name"
    in_ns "$bin" master --dir "$d/master" --listen "$NS_IP:$port" --replication "$REPLICAS" \
        >"$WORK/$name-master.log" 2>&1 &
    PIDS+=($!)
    wait_for "[ -s '$d/master/addr' ] && [ -s '$d/master/cluster.key' ]" "the $name master"
    for i in $(seq 1 "$REPLICAS"); do
        in_ns "$bin" chunkserver --dir "$d/cs$i" --listen "$NS_IP:0" --master "$NS_IP:$port" \
            --cluster-key-file "$d/master/cluster.key" >"$WORK/$name-cs$i.log" 2>&1 &
        PIDS+=($!)
    done
    # The cluster's superuser credentials (builds from before authentication ignore them).
    export STAMPFS_CREDENTIALS="$d/master/admin.credentials"
    "$bin" mount --foreground --master "$NS_IP:$port" "$WORK/mnt-$name" \
        >"$WORK/$name-mount.out" 2>"$WORK/$name-mount.log" &
    PIDS+=($!)
    MOUNTS+=("$WORK/mnt-$name")
    wait_for "grep -q 'stampfs: mounted' '$WORK/$name-mount.out'" "the $name mount"
    wait_for "[ \$(\"$bin\" admin report --master '$NS_IP:$port' 2>/dev/null | grep -c ' live ') -ge $REPLICAS ]" "the $name chunkservers"
    TARGETS+=(--target "$name=$WORK/mnt-$name")
}

# --- MooseFS: mfsmaster and R mfschunkservers in the namespace, mfsmount on the host.
start_moosefs() { # PORT
    local M="$WORK/mfs" port=$1
    mkdir -p "$M/master" "$WORK/mnt-moosefs"
    cp /var/lib/mfs/metadata.mfs.empty "$M/master/metadata.mfs"
    local MP=$port CP=$((port + 1)) CLP=$((port + 2))
    cat >"$M/mfsmaster.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $M/master
EXPORTS_FILENAME = $M/mfsexports.cfg
TOPOLOGY_FILENAME = $M/mfstopology.cfg
MATOML_LISTEN_HOST = $NS_IP
MATOML_LISTEN_PORT = $MP
MATOCS_LISTEN_HOST = $NS_IP
MATOCS_LISTEN_PORT = $CP
MATOCL_LISTEN_HOST = $NS_IP
MATOCL_LISTEN_PORT = $CLP
CFG
    echo "$HOST_IP / rw,alldirs,maproot=0" >"$M/mfsexports.cfg"
    : >"$M/mfstopology.cfg"
    in_ns mfsmaster -c "$M/mfsmaster.cfg" -f start >"$WORK/mfsmaster.log" 2>&1 &
    PIDS+=($!)
    for i in $(seq 1 "$REPLICAS"); do
        local C="$M/cs$i"
        mkdir -p "$C/data" "$C/hdd"
        echo "$C/hdd" >"$C/mfshdd.cfg"
        cat >"$C/mfschunkserver.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $C/data
HDD_CONF_FILENAME = $C/mfshdd.cfg
MASTER_HOST = $NS_IP
MASTER_PORT = $CP
CSSERV_LISTEN_HOST = $NS_IP
CSSERV_LISTEN_PORT = $((port + 10 + i))
CFG
        in_ns mfschunkserver -c "$C/mfschunkserver.cfg" -f start >"$WORK/mfschunkserver$i.log" 2>&1 &
        PIDS+=($!)
    done
    wait_for "in_ns bash -c 'exec 3<>/dev/tcp/$NS_IP/$CLP' 2>/dev/null" "the MooseFS master"
    # The master may accept connections a moment before it serves clients.
    local tries=0
    until mfsmount -H "$NS_IP" -P "$CLP" "$WORK/mnt-moosefs" >"$WORK/mfsmount.log" 2>&1; do
        tries=$((tries + 1))
        [ "$tries" -lt 10 ] || { cat "$WORK/mfsmount.log" >&2; exit 1; }
        sleep 0.5
    done
    MOUNTS+=("$WORK/mnt-moosefs")
    wait_for "grep -q ' $WORK/mnt-moosefs ' /proc/mounts" "the MooseFS mount"
    mfssetgoal -r "$REPLICAS" "$WORK/mnt-moosefs" >/dev/null
    # Writes wait for the chunkservers: mfsmount has no chunk to write to before one
    # registered with free space.
    wait_for "[ \$(cat $WORK/mfschunkserver*.log | grep -c 'connected to Master') -ge $REPLICAS ]" "the MooseFS chunkservers"
    TARGETS+=(--target "moosefs=$WORK/mnt-moosefs")
}

PORT=$((20000 + RANDOM % 20000))
TARGETS=()
if [ "$MOOSEFS" = 1 ]; then start_moosefs "$((PORT + 100))"; fi
start_stampfs "$BIN" stampfs "$PORT"
if [ -n "$BASELINE" ]; then start_stampfs "$BASELINE" stampfs-base "$((PORT + 10))"; fi
mkdir -p "$WORK/disk"
TARGETS+=(--target "disk=$WORK/disk")

echo "replicas: $REPLICAS; servers in netns $NS ($NS_IP), mounts on the host ($HOST_IP)"
"$BIN" bench mount-io "${TARGETS[@]}" "${BENCH_ARGS[@]}"
