#!/usr/bin/env bash
# Metadata through the FUSE mount: stampfs next to MooseFS, on this machine, in one run.
#
# Starts, all on 127.0.0.1 and in a temp dir on the current disk:
#   - a stampfs cluster (`stampfs dev`: master + 1 chunkserver) and `stampfs mount`;
#   - a MooseFS master, one chunkserver and mfsmount (Debian: moosefs-master,
#     moosefs-chunkserver, moosefs-client), unless --no-moosefs;
# runs `stampfs bench mount-metadata` on both mounts (same loop, same minute), then
# unmounts and stops everything it started (by pid / its own config).
#
# Usage (as root, for FUSE): scripts/mount-metadata-bench.sh [STAMPFS_BINARY] [--no-moosefs] [-- BENCH ARGS]
#   e.g. scripts/mount-metadata-bench.sh target/release/stampfs -- --files 5000 --rounds 3
set -euo pipefail

BIN=target/release/stampfs
MOOSEFS=1
BENCH_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-moosefs) MOOSEFS=0 ;;
        --) shift; BENCH_ARGS=("$@"); break ;;
        *) BIN="$1" ;;
    esac
    shift
done
BIN=$(readlink -f "$BIN")
[ -x "$BIN" ] || { echo "no stampfs binary at $BIN (cargo build --release)" >&2; exit 2; }

WORK=$(mktemp -d "$PWD/.mount-metadata-bench.XXXXXX")
PIDS=()
MOUNTS=()
MFS_CFG=""
cleanup() {
    set +e
    for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    if [ -n "$MFS_CFG" ]; then
        mfschunkserver -c "$WORK/mfs/mfschunkserver.cfg" stop >/dev/null 2>&1
        mfsmaster -c "$MFS_CFG" stop >/dev/null 2>&1
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_for() { # FILE-or-CMD, what
    for _ in $(seq 1 200); do
        if eval "$1"; then return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for $2" >&2
    exit 1
}

# --- stampfs: master + one chunkserver on 127.0.0.1, and its mount.
PORT=$((20000 + RANDOM % 20000))
"$BIN" dev --dir "$WORK/stampfs" --chunkservers 1 --listen "127.0.0.1:$PORT" \
    >"$WORK/stampfs-dev.log" 2>&1 &
PIDS+=($!)
wait_for "grep -q 'cluster is up' '$WORK/stampfs-dev.log'" "the stampfs cluster"
mkdir -p "$WORK/mnt-stampfs"
"$BIN" mount --foreground --master "127.0.0.1:$PORT" "$WORK/mnt-stampfs" \
    >"$WORK/stampfs-mount.out" 2>"$WORK/stampfs-mount.log" &
PIDS+=($!)
wait_for "grep -q 'stampfs: mounted' '$WORK/stampfs-mount.out'" "the stampfs mount"
MOUNTS+=("$WORK/mnt-stampfs")
TARGETS=(--target "stampfs=$WORK/mnt-stampfs")

# --- MooseFS: master, chunkserver and mfsmount, all bound to 127.0.0.1.
if [ "$MOOSEFS" = 1 ]; then
    command -v mfsmaster >/dev/null || { echo "MooseFS is not installed (apt-get install moosefs-master moosefs-chunkserver moosefs-client)" >&2; exit 2; }
    M="$WORK/mfs"
    mkdir -p "$M/master" "$M/cs" "$M/hdd" "$WORK/mnt-moosefs"
    cp /var/lib/mfs/metadata.mfs.empty "$M/master/metadata.mfs"
    MP=$((PORT + 1)); CP=$((PORT + 2)); CLP=$((PORT + 3)); CSP=$((PORT + 4))
    cat >"$M/mfsmaster.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $M/master
EXPORTS_FILENAME = $M/mfsexports.cfg
TOPOLOGY_FILENAME = $M/mfstopology.cfg
MATOML_LISTEN_HOST = 127.0.0.1
MATOML_LISTEN_PORT = $MP
MATOCS_LISTEN_HOST = 127.0.0.1
MATOCS_LISTEN_PORT = $CP
MATOCL_LISTEN_HOST = 127.0.0.1
MATOCL_LISTEN_PORT = $CLP
CFG
    echo "127.0.0.1 / rw,alldirs,maproot=0" >"$M/mfsexports.cfg"
    : >"$M/mfstopology.cfg"
    cat >"$M/mfschunkserver.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $M/cs
HDD_CONF_FILENAME = $M/mfshdd.cfg
HDD_LEAVE_SPACE_DEFAULT = 64MiB
BIND_HOST = 127.0.0.1
MASTER_HOST = 127.0.0.1
MASTER_PORT = $CP
CSSERV_LISTEN_HOST = 127.0.0.1
CSSERV_LISTEN_PORT = $CSP
CFG
    echo "$M/hdd" >"$M/mfshdd.cfg"
    MFS_CFG="$M/mfsmaster.cfg"
    mfsmaster -c "$MFS_CFG" start >"$WORK/mfsmaster.log" 2>&1
    mfschunkserver -c "$M/mfschunkserver.cfg" start >"$WORK/mfschunkserver.log" 2>&1
    mfsmount -H 127.0.0.1 -P "$CLP" "$WORK/mnt-moosefs" >"$WORK/mfsmount.log" 2>&1
    MOUNTS+=("$WORK/mnt-moosefs")
    wait_for "grep -q ' $WORK/mnt-moosefs ' /proc/mounts" "the MooseFS mount"
    TARGETS+=(--target "moosefs=$WORK/mnt-moosefs")
fi

"$BIN" bench mount-metadata "${TARGETS[@]}" --dir "$WORK" "${BENCH_ARGS[@]}"
