#!/usr/bin/env bash
# Make sure a CPU-only llama.cpp `llama-server` binary (with router mode) exists, and print its path.
#
# The binary is built from the llama.cpp tree vendored in the llama-cpp-python sdist on PyPI
# (llama-cpp-python 0.3.36 vendors llama.cpp commit 0c1e57098), so nothing but PyPI and Debian's
# package archive is needed. It is cached outside the repository, keyed by version:
#
#   ${LLAMA_CROSSBAR_CACHE:-$HOME/.cache/llama-crossbar}/llama-server-0.3.36/llama-server
#
# and reused when present. The build runs in a temporary folder next to the cache entry and is
# moved into place with a single rename at the very end, so an interrupted build never leaves
# something that looks finished. Concurrent runs wait on a lock instead of building twice.
#
# The path of the binary is the LAST line of stdout; everything else goes to stderr:
#
#   LLAMA_SERVER=$(scripts/llama-server.sh | tail -n 1)
#
# Environment:
#   LLAMA_CROSSBAR_CACHE  cache root (default: $HOME/.cache/llama-crossbar)
#   LLAMA_SERVER_JOBS     parallel compile jobs (default: number of cores)
#   PYTHON                Python interpreter whose pip fetches the sdist (default: python3)
#
# A first build takes about ten minutes on two cores. Missing build tools (gcc, g++, make, cmake)
# are installed with apt-get when running as root on a Debian-like system.

set -euo pipefail

VERSION="0.3.36"
CACHE_ROOT="${LLAMA_CROSSBAR_CACHE:-${HOME:?HOME is not set}/.cache/llama-crossbar}"
DEST="${CACHE_ROOT}/llama-server-${VERSION}"
BIN="${DEST}/llama-server"
PYTHON="${PYTHON:-python3}"

log() { printf 'llama-server.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A cache entry is finished when its binary exists and runs.
usable() { [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; }

if usable; then
    printf '%s\n' "$BIN"
    exit 0
fi

mkdir -p "$CACHE_ROOT"

# One build at a time per cache entry; whoever waited re-checks before building.
if command -v flock >/dev/null 2>&1; then
    exec 9>"${CACHE_ROOT}/.llama-server-${VERSION}.lock"
    if ! flock -n 9; then
        log "another build of llama-server ${VERSION} is running; waiting for it"
        flock 9
    fi
    if usable; then
        printf '%s\n' "$BIN"
        exit 0
    fi
    # Holding the lock, any build folder left here is from a build that was killed.
    for stale in "${CACHE_ROOT}/.build-llama-server-${VERSION}."*; do
        [[ -d "$stale" ]] || continue
        log "removing the leftovers of an interrupted build: ${stale}"
        rm -rf "$stale"
    done
fi

# --- build tools ---------------------------------------------------------------------------
need_apt=()
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
# OpenMP runtime (the multi-threaded CPU backend uses it; the build falls back without it).
if command -v ldconfig >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q 'libgomp\.so'; then
    need_apt+=(libgomp1)
fi
if ((${#need_apt[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "installing build tools: ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
    else
        die "missing build tools: ${need_apt[*]} (install them, or run as root with apt-get)"
    fi
fi
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "'$PYTHON -m pip' is needed to fetch the sources"

# --- build ---------------------------------------------------------------------------------
# Work next to the destination so the final rename stays on one file system.
WORK="$(mktemp -d "${CACHE_ROOT}/.build-llama-server-${VERSION}.XXXXXX")"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$SECONDS
log "building llama-server ${VERSION} in ${WORK} (about ten minutes on two cores)"

log "fetching the llama-cpp-python ${VERSION} sdist"
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==${VERSION}" -d "${WORK}/sdist" >&2
sdist=("${WORK}"/sdist/llama_cpp_python-"${VERSION}".tar.gz)
[[ -f "${sdist[0]}" ]] || die "sdist not found after download"

mkdir -p "${WORK}/src"
tar -xzf "${sdist[0]}" -C "${WORK}/src" --strip-components=1
SRC="${WORK}/src/vendor/llama.cpp"
[[ -f "${SRC}/tools/server/server-models.cpp" ]] || die "vendored llama.cpp has no router (server-models.cpp)"

jobs="${LLAMA_SERVER_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log "configuring"
cmake -S "$SRC" -B "${WORK}/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF \
    -DGGML_CCACHE=OFF \
    -DLLAMA_BUILD_COMMON=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_SUBPROCESS=ON \
    >&2

log "compiling llama-server with ${jobs} jobs"
cmake --build "${WORK}/build" --config Release --target llama-server -j "$jobs" >&2

built="${WORK}/build/bin/llama-server"
[[ -x "$built" ]] || die "build finished but ${built} is missing"
"$built" --version >&2 || die "the built llama-server does not run"

# Stage the finished entry, then publish it with one rename.
stage="${WORK}/out"
mkdir -p "$stage"
cp "$built" "${stage}/llama-server"
{
    echo "llama-cpp-python sdist: ${VERSION}"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((SECONDS - started)) s"
    "$built" --version 2>&1 || true
} >"${stage}/BUILD-INFO"

if [[ -e "$DEST" ]]; then
    # A leftover that is not usable (checked above): move it aside before publishing.
    mv "$DEST" "${WORK}/stale"
fi
mv "$stage" "$DEST"

usable || die "${BIN} does not run after install"
log "built llama-server ${VERSION} in $((SECONDS - started)) s"
printf '%s\n' "$BIN"
