#!/usr/bin/env bash
# make check-layers: the layering rules of docs/DESIGN.md ("Layers"), checked
# on the sources (what each folder includes) and on the objects (which
# folder's symbols each core links). Exit 1 with every violation listed.
#
#   base/         libc only; no other folder of ours.
#   raft/         base/ (not base/log.h), itself. Pure: no I/O, clock,
#                 threads, libuv, LMDB, protobuf.
#   fsm/          base/ (not base/log.h), itself, and the generated protobuf-c
#                 types of proto/ (it decodes log commands and writes
#                 snapshots in those formats). Pure like raft/.
#   storage/      base/, itself, LMDB. No protobuf, no libuv.
#   src/pool/     base/, itself. A reusable runtime: nothing of the node.
#   src/common/   base/, itself, proto/ (the programs' shared code).
#   src/client/   base/, src/common/, proto/, itself.
#   src/node/     anything above.
# Symbols: no object of raft/, fsm/ or storage/ may use a symbol defined in
# src/ or in another core (found with nm on BUILD's objects).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bad=0

# forbid FOLDER REGEX WHY: no file of FOLDER may include a header matching
# REGEX (quoted or angle-bracket include).
forbid() {
    local dir=$1 re=$2 why=$3 hits
    hits=$(grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($re)[>\"]" \
        "$dir"/*.[ch] 2>/dev/null)
    if [ -n "$hits" ]; then
        echo "$hits" >&2
        echo "check-layers: $dir/ $why" >&2
        bad=1
    fi
}

IMPURE='uv\.h|lmdb\.h|pthread\.h|threads\.h|unistd\.h|time\.h|sys/[^>"]*|fcntl\.h|stdatomic\.h|signal\.h|dirent\.h|poll\.h'
forbid base "src/[^\"]*|raft/[^\"]*|fsm/[^\"]*|storage/[^\"]*|proto/[^\"]*|uv\.h|lmdb\.h|protobuf-c/[^>]*" \
    "is the bottom layer: it includes only libc and itself"
forbid raft "$IMPURE|src/[^\"]*|fsm/[^\"]*|storage/[^\"]*|proto/[^\"]*|protobuf-c/[^>]*|base/log\.h" \
    "must stay pure and know nothing of the wire format (base/ and itself only)"
forbid fsm "$IMPURE|src/[^\"]*|raft/[^\"]*|storage/[^\"]*|base/log\.h" \
    "must stay pure (base/, itself and proto/'s generated types only)"
forbid storage "src/[^\"]*|raft/[^\"]*|fsm/[^\"]*|proto/[^\"]*|protobuf-c/[^>]*|uv\.h" \
    "may use only base/, itself and LMDB"
forbid src/pool "src/node/[^\"]*|src/client/[^\"]*|src/common/[^\"]*|raft/[^\"]*|fsm/[^\"]*|storage/[^\"]*|proto/[^\"]*" \
    "is a reusable runtime: base/ and itself only"
forbid src/common "src/node/[^\"]*|src/client/[^\"]*|src/pool/[^\"]*|raft/[^\"]*|fsm/[^\"]*|storage/[^\"]*" \
    "is the programs' shared code: base/, proto/ and itself only"
forbid src/client "src/node/[^\"]*|src/pool/[^\"]*|raft/[^\"]*|fsm/[^\"]*|storage/[^\"]*" \
    "is the client: base/, src/common/, proto/ and itself only"

# Symbols: what each core's objects leave undefined must not be defined by
# objects of src/ or of another core.
defined_in() { # folder -> "symbol folder" lines
    local f
    for f in "$BUILD"/obj/$1/*.o; do
        src=${f#"$BUILD"/obj/}
        [ -e "${src%.o}.c" ] || continue
        nm --defined-only -g "$f" | awk -v d="$1" 'NF == 3 { print $3, d }'
    done
}
if [ -d "$BUILD/obj" ]; then
    defs=$(for d in src/common src/pool src/node src/client raft fsm storage; do defined_in "$d"; done)
    for core in raft fsm storage; do
        for f in "$BUILD"/obj/$core/*.o; do
            src=${f#"$BUILD"/obj/}
            [ -e "${src%.o}.c" ] || continue # a stale object of a moved file
            while read -r sym; do
                owner=$(awk -v s="$sym" '$1 == s { print $2; exit }' <<<"$defs")
                if [ -n "$owner" ] && [ "$owner" != "$core" ]; then
                    echo "$f uses $sym from $owner/" >&2
                    bad=1
                fi
            done < <(nm -u "$f" | awk '{ print $2 }')
        done
    done
else
    echo "check-layers: $BUILD/obj missing, symbols not checked (run make first)" >&2
    bad=1
fi

if [ "$bad" -ne 0 ]; then
    echo "check-layers: FAILED (rules at the top of scripts/check-layers.sh and in docs/DESIGN.md)" >&2
    exit 1
fi
echo "check-layers: ok"
