#!/usr/bin/env bash
# Metadata through the FUSE mount: stampfs next to MooseFS, on this machine, in one run.
#
# Starts, all on 127.0.0.1 and in a temp dir on the current disk:
#   - a stampfs cluster (`stampfs dev`: master + 1 chunkserver) and `stampfs mount`;
#   - a MooseFS master and mfsmount (Debian: moosefs-master, moosefs-client), unless
#     --no-moosefs. No MooseFS chunkserver: mfschunkserver refuses a master on
#     127.0.0.0/8 ("localhost can't be used for connecting with master"), and the
#     metadata of empty files (create, stat, unlink, mkdir, rmdir) never reaches one;
# runs `stampfs bench mount-metadata` on both mounts (same loop, same minute), then
# unmounts and stops everything it started (by pid / its own config).
#
# Usage (as root, for FUSE):
#   scripts/mount-metadata-bench.sh [STAMPFS_BINARY] [--baseline OTHER_BINARY] [--no-moosefs]
#       [--negative SECONDS] [-- BENCH ARGS]
#   e.g. scripts/mount-metadata-bench.sh target/release/stampfs -- --files 5000 --rounds 3
# --baseline also runs a second stampfs cluster and mount from another build (e.g. the
# code before a change), measured as `stampfs-base` in the same run.
# --negative S also measures a second mount of each system with negative lookups cached
# for S seconds (`stampfs mount --negative-timeout`, mfsmount `-o mfsnegentrycacheto`),
# as `stampfs-neg` and `moosefs-neg`.
set -euo pipefail

BIN=target/release/stampfs
MOOSEFS=1
BASELINE=""
NEGATIVE=""
BENCH_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-moosefs) MOOSEFS=0 ;;
        --baseline) shift; BASELINE=$(readlink -f "$1") ;;
        --negative) shift; NEGATIVE="$1" ;;
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
start_stampfs() { # BINARY NAME PORT
    local bin=$1 name=$2 port=$3
    "$bin" dev --dir "$WORK/$name" --chunkservers 1 --replication 1 --listen "127.0.0.1:$port" \
        >"$WORK/$name-dev.log" 2>&1 &
    PIDS+=($!)
    wait_for "grep -q 'cluster is up' '$WORK/$name-dev.log'" "the $name cluster"
    mkdir -p "$WORK/mnt-$name"
    # The cluster's superuser credentials (builds from before authentication ignore them).
    export STAMPFS_CREDENTIALS="$WORK/$name/master/admin.credentials"
    "$bin" mount --foreground --master "127.0.0.1:$port" "$WORK/mnt-$name" \
        >"$WORK/$name-mount.out" 2>"$WORK/$name-mount.log" &
    PIDS+=($!)
    wait_for "grep -q 'stampfs: mounted' '$WORK/$name-mount.out'" "the $name mount"
    MOUNTS+=("$WORK/mnt-$name")
    TARGETS+=(--target "$name=$WORK/mnt-$name")
    if [ -n "$NEGATIVE" ] && [ "$name" = stampfs ]; then
        mkdir -p "$WORK/mnt-$name-neg"
        "$bin" mount --foreground --negative-timeout "${NEGATIVE}s" --master "127.0.0.1:$port" \
            "$WORK/mnt-$name-neg" >"$WORK/$name-neg-mount.out" 2>"$WORK/$name-neg-mount.log" &
        PIDS+=($!)
        wait_for "grep -q 'stampfs: mounted' '$WORK/$name-neg-mount.out'" "the $name-neg mount"
        MOUNTS+=("$WORK/mnt-$name-neg")
        TARGETS+=(--target "$name-neg=$WORK/mnt-$name-neg")
    fi
}
PORT=$((20000 + RANDOM % 20000))
TARGETS=()
start_stampfs "$BIN" stampfs "$PORT"
if [ -n "$BASELINE" ]; then
    start_stampfs "$BASELINE" stampfs-base "$((PORT + 10))"
fi

# --- MooseFS: master and mfsmount, bound to 127.0.0.1.
if [ "$MOOSEFS" = 1 ]; then
    command -v mfsmaster >/dev/null || { echo "MooseFS is not installed (apt-get install moosefs-master moosefs-chunkserver moosefs-client)" >&2; exit 2; }
    M="$WORK/mfs"
    mkdir -p "$M/master" "$WORK/mnt-moosefs"
    cp /var/lib/mfs/metadata.mfs.empty "$M/master/metadata.mfs"
    MP=$((PORT + 1)); CP=$((PORT + 2)); CLP=$((PORT + 3))
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
    MFS_CFG="$M/mfsmaster.cfg"
    mfsmaster -c "$MFS_CFG" start >"$WORK/mfsmaster.log" 2>&1 || { cat "$WORK/mfsmaster.log" >&2; exit 1; }
    mfsmount -H 127.0.0.1 -P "$CLP" "$WORK/mnt-moosefs" >"$WORK/mfsmount.log" 2>&1 || { cat "$WORK/mfsmount.log" >&2; exit 1; }
    MOUNTS+=("$WORK/mnt-moosefs")
    wait_for "grep -q ' $WORK/mnt-moosefs ' /proc/mounts" "the MooseFS mount"
    TARGETS+=(--target "moosefs=$WORK/mnt-moosefs")
    if [ -n "$NEGATIVE" ]; then
        mkdir -p "$WORK/mnt-moosefs-neg"
        mfsmount -H 127.0.0.1 -P "$CLP" -o "mfsnegentrycacheto=$NEGATIVE" "$WORK/mnt-moosefs-neg" \
            >"$WORK/mfsmount-neg.log" 2>&1 || { cat "$WORK/mfsmount-neg.log" >&2; exit 1; }
        MOUNTS+=("$WORK/mnt-moosefs-neg")
        wait_for "grep -q ' $WORK/mnt-moosefs-neg ' /proc/mounts" "the second MooseFS mount"
        TARGETS+=(--target "moosefs-neg=$WORK/mnt-moosefs-neg")
    fi
fi

"$BIN" bench mount-metadata "${TARGETS[@]}" --dir "$WORK" "${BENCH_ARGS[@]}"
