#!/usr/bin/env bash
# Check for the build dependencies; install the Debian packages when missing
# and running as root, else print the exact command to run.
set -euo pipefail

missing=()
have_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/local/include/$1" ] ||
    [ -f "/usr/include/x86_64-linux-gnu/$1" ] || [ -f "/usr/include/aarch64-linux-gnu/$1" ]; }

have_header uv.h || missing+=(libuv1-dev)
have_header protobuf-c/protobuf-c.h || missing+=(libprotobuf-c-dev)
command -v protoc-c >/dev/null 2>&1 || missing+=(protobuf-c-compiler)
have_header lmdb.h || missing+=(liblmdb-dev)
have_header criterion/criterion.h || missing+=(libcriterion-dev)
have_header jansson.h || missing+=(libjansson-dev)        # the CLI's --json (not libidalloc)
have_header microhttpd.h || missing+=(libmicrohttpd-dev)  # idallocd's /metrics and /healthz
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)  # the install test
have_header openssl/ssl.h || missing+=(libssl-dev)
# clang and libFuzzer: the harnesses of tests/fuzz (make fuzz, and the short
# fuzz run of make test, mk/fuzz.mk).
command -v clang >/dev/null 2>&1 || missing+=(clang)
fuzzer_lib() { [ -f "$(clang -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-$(uname -m).a" ]; }
fuzzer_lib || missing+=(libclang-rt-dev)

[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get update && apt-get install -y ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing build dependencies: ${missing[*]}" >&2
    echo "error: install them as root with: sudo sh -c '$cmd'" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q "${missing[@]}" >&2
