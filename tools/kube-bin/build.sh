#!/usr/bin/env bash
# Build kube-apiserver and etcd from source once, cache them outside the repository, and print the
# directory that holds them as the last line of stdout (progress goes to stderr), so any script can do
#     dir=$(tools/kube-bin/build.sh | tail -n 1)
#
# The versions are the ones pinned in kube-apiserver/go.mod and etcd/go.mod beside this script (their
# go.sum files are committed). If KUBEBUILDER_ASSETS (the envtest convention) names a directory that
# holds kube-apiserver and etcd, that directory is printed and nothing is built.
#
# Environment:
#   DAM_KUBE_BIN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/kube-bin)
#   KUBEBUILDER_ASSETS  use these binaries instead of building
#
# With --no-build it only prints a directory that is ready (KUBEBUILDER_ASSETS or the cache) and
# exits 3 when there is none, so a test run can skip instead of compiling for a quarter of an hour.
set -euo pipefail

no_build=0
case "${1:-}" in
    --no-build) no_build=1 ;;
    "") ;;
    *)
        echo "usage: $0 [--no-build]" >&2
        exit 2
        ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { printf 'kube-bin: %s\n' "$*" >&2; }
die() {
    printf 'kube-bin: ERROR: %s\n' "$*" >&2
    exit 1
}

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
    if [[ -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]]; then
        say "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS (nothing built)"
        cd "$KUBEBUILDER_ASSETS" && pwd
        exit 0
    fi
    say "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS holds no executable kube-apiserver and etcd; building them"
fi

# The one place the versions live is each wrapper module's go.mod.
module_version() { # go.mod module -> version
    awk -v m="$2" '($1 == m && $2 ~ /^v/) || ($1 == "require" && $2 == m) {print ($1 == "require") ? $3 : $2; exit}' "$1"
}
k8s_version="$(module_version "$here/kube-apiserver/go.mod" k8s.io/kubernetes)"
etcd_version="$(module_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)"
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || die "cannot read the k8s.io/kubernetes version from $here/kube-apiserver/go.mod"
k8s_minor="${BASH_REMATCH[1]}"
[[ "$etcd_version" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "cannot read the etcd version from $here/etcd/go.mod"

goos="$(uname -s | tr '[:upper:]' '[:lower:]')"
case "$(uname -m)" in
    x86_64) goarch=amd64 ;;
    aarch64 | arm64) goarch=arm64 ;;
    *) goarch="$(uname -m)" ;;
esac
cache_root="${DAM_KUBE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/kube-bin}"
final="$cache_root/k8s-$k8s_version-etcd-$etcd_version-$goos-$goarch"

binaries_ok() { # dir -> 0 when both binaries are there and report the pinned versions
    [[ -x "$1/kube-apiserver" && -x "$1/etcd" ]] || return 1
    local out # (no `| grep -q` under pipefail: an early exit of grep fails the pipe with SIGPIPE)
    out="$("$1/kube-apiserver" --version 2>/dev/null)" || return 1
    [[ $'\n'"$out"$'\n' == *$'\n'"Kubernetes $k8s_version"$'\n'* ]] || return 1
    out="$("$1/etcd" --version 2>/dev/null)" || return 1
    [[ $'\n'"$out"$'\n' == *$'\n'"etcd Version: ${etcd_version#v}"$'\n'* ]] || return 1
}

if binaries_ok "$final"; then
    say "cached: kube-apiserver $k8s_version, etcd $etcd_version"
    echo "$final"
    exit 0
fi
if ((no_build)); then
    say "kube-apiserver $k8s_version and etcd $etcd_version are not built yet (looked in $final); run 'make kube-bin' or set KUBEBUILDER_ASSETS"
    exit 3
fi

command -v go >/dev/null 2>&1 || die "no 'go' on PATH: install Go (etcd/go.mod names the version needed) or set KUBEBUILDER_ASSETS to a directory with kube-apiserver and etcd"
mkdir -p "$cache_root" || die "cannot create the cache directory $cache_root (set DAM_KUBE_BIN_CACHE)"
# One builder at a time; a second one waits and then finds the first one's result.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$cache_root/.lock"
    flock 9
    if binaries_ok "$final"; then
        say "cached (built by a concurrent run): kube-apiserver $k8s_version, etcd $etcd_version"
        echo "$final"
        exit 0
    fi
fi

tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# Use the committed go.sum as it is: never let the build rewrite go.mod/go.sum.
export GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

run_with_heartbeat() { # label command... : run, and say every 30 s that it still runs
    local label="$1" start=$SECONDS pid
    shift
    "$@" &
    pid=$!
    while ! wait_for_exit "$pid" 30; do
        say "  $label: still running ($((SECONDS - start)) s)"
    done
    wait "$pid" || die "$label failed (see the Go output above)"
    say "  $label: done in $((SECONDS - start)) s"
}
wait_for_exit() { # pid seconds -> 0 once pid has exited, 1 if still running after seconds
    local i
    for ((i = 0; i < $2; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 1
    done
    ! kill -0 "$1" 2>/dev/null
}

say "building kube-apiserver $k8s_version and etcd $etcd_version with $(go env GOVERSION) into $final"
say "(first build: about 200 MB of Go modules and 5-10 min of compiling on 2 cores; later runs reuse the Go build cache)"
started=$SECONDS

say "[1/3] downloading Go modules"
run_with_heartbeat "go mod download (kube-apiserver)" bash -c "cd '$here/kube-apiserver' && go mod download"
run_with_heartbeat "go mod download (etcd)" bash -c "cd '$here/etcd' && go mod download"

ver=k8s.io/component-base/version
say "[2/3] compiling kube-apiserver"
run_with_heartbeat "go build kube-apiserver" bash -c "cd '$here/kube-apiserver' && go build -trimpath \
    -ldflags '-s -w -X $ver.gitVersion=$k8s_version -X $ver.gitMajor=1 -X $ver.gitMinor=$k8s_minor -X $ver.gitTreeState=clean' \
    -o '$tmp/kube-apiserver' k8s.io/kubernetes/cmd/kube-apiserver"

say "[3/3] compiling etcd"
run_with_heartbeat "go build etcd" bash -c "cd '$here/etcd' && go build -trimpath \
    -ldflags '-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd_version' \
    -o '$tmp/etcd' go.etcd.io/etcd/server/v3"

binaries_ok "$tmp" || die "the built binaries do not report the pinned versions: $("$tmp/kube-apiserver" --version 2>&1 | head -1); $("$tmp/etcd" --version 2>&1 | head -1)"
printf 'kube-apiserver %s\netcd %s\nbuilt with %s on %s in %d s\n' \
    "$k8s_version" "$etcd_version" "$(go env GOVERSION)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((SECONDS - started))" >"$tmp/BUILD-INFO"
chmod 755 "$tmp"

# Replace a broken earlier result, then move the new one into place in one rename.
if [[ -e "$final" ]]; then
    mv -T "$final" "$tmp.old" && rm -rf "$tmp.old"
fi
mv -T "$tmp" "$final" || die "cannot move the build into $final"
trap - EXIT
say "built in $((SECONDS - started)) s"
echo "$final"
