#!/usr/bin/env bash
# Build the Kubernetes binaries from source once, cache them outside the repository, and print the
# directory that holds them as the last line of stdout (progress goes to stderr), so any script can do
#     dir=$(tools/kube-bin/build.sh | tail -n 1)
#
# What it builds, into one directory:
#   control plane   kube-apiserver, etcd                              (tools/kube-bin/kube-apiserver, etcd)
#   node            kubelet, kube-controller-manager, kube-scheduler  (tools/kube-bin/node)
# The versions are the ones pinned in the go.mod files beside this script (their go.sum files are
# committed); the node module must pin the same k8s.io/kubernetes release as the control plane.
#
# If KUBEBUILDER_ASSETS (the envtest convention) names a directory, the binaries it holds are used and
# only the others are built. When it holds all that is asked for, it is printed as it is; when it holds
# only kube-apiserver and etcd, the node binaries are built into the cache and a directory of links
# ($cache/assets-<hash>/, to both) is printed.
#
# Environment:
#   DAM_KUBE_BIN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/kube-bin)
#   KUBEBUILDER_ASSETS  use these binaries instead of building them
#
# Usage:
#   build.sh                    build what is missing of all five, print the directory
#   build.sh --control-plane    only kube-apiserver and etcd (what envtest-style tests need)
#   build.sh --no-build         print a directory holding kube-apiserver and etcd, or exit 3
#   build.sh --no-build --node  print a directory holding all five, or exit 3
# --no-build never compiles, so a test run can skip instead of compiling for a quarter of an hour.
set -euo pipefail

no_build=0
want_node=1
node_flag=0
for arg in "$@"; do
    case "$arg" in
        --no-build) no_build=1 ;;
        --node) node_flag=1 ;;
        --control-plane) want_node=0 ;;
        *)
            echo "usage: $0 [--control-plane] | --no-build [--node]" >&2
            exit 2
            ;;
    esac
done
# --no-build alone keeps its old meaning: the control plane only.
if ((no_build)); then want_node=$node_flag; fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { printf 'kube-bin: %s\n' "$*" >&2; }
die() {
    printf 'kube-bin: ERROR: %s\n' "$*" >&2
    exit 1
}

CONTROL_PLANE=(kube-apiserver etcd)
NODE=(kubelet kube-controller-manager kube-scheduler)
wanted=("${CONTROL_PLANE[@]}")
((want_node)) && wanted+=("${NODE[@]}")

# The one place the versions live is each wrapper module's go.mod.
module_version() { # go.mod module -> version
    awk -v m="$2" '($1 == m && $2 ~ /^v/) || ($1 == "require" && $2 == m) {print ($1 == "require") ? $3 : $2; exit}' "$1"
}
k8s_version="$(module_version "$here/kube-apiserver/go.mod" k8s.io/kubernetes)"
etcd_version="$(module_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)"
node_version="$(module_version "$here/node/go.mod" k8s.io/kubernetes)"
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || die "cannot read the k8s.io/kubernetes version from $here/kube-apiserver/go.mod"
k8s_minor="${BASH_REMATCH[1]}"
[[ "$etcd_version" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "cannot read the etcd version from $here/etcd/go.mod"
[[ "$node_version" == "$k8s_version" ]] || die "$here/node/go.mod pins k8s.io/kubernetes $node_version but kube-apiserver/go.mod pins $k8s_version: pin the same release in both"

goos="$(uname -s | tr '[:upper:]' '[:lower:]')"
case "$(uname -m)" in
    x86_64) goarch=amd64 ;;
    aarch64 | arm64) goarch=arm64 ;;
    *) goarch="$(uname -m)" ;;
esac
cache_root="${DAM_KUBE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/kube-bin}"
final="$cache_root/k8s-$k8s_version-etcd-$etcd_version-$goos-$goarch"

binary_ok() { # dir name -> 0 when the binary is there and reports the pinned version
    [[ -x "$1/$2" ]] || return 1
    local out want # (no `| grep -q` under pipefail: an early exit of grep fails the pipe with SIGPIPE)
    out="$("$1/$2" --version 2>/dev/null)" || return 1
    case "$2" in
        etcd) want="etcd Version: ${etcd_version#v}" ;;
        *) want="Kubernetes $k8s_version" ;;
    esac
    [[ $'\n'"$out"$'\n' == *$'\n'"$want"$'\n'* ]]
}
all_ok() { # dir names... -> 0 when every binary named is there with the pinned version
    local dir="$1" name
    shift
    for name in "$@"; do binary_ok "$dir" "$name" || return 1; done
}
missing_in() { # dir names... -> the names not (correctly) there, one a line
    local dir="$1" name
    shift
    for name in "$@"; do binary_ok "$dir" "$name" || echo "$name"; done
}

# A directory that holds every wanted binary: KUBEBUILDER_ASSETS, the cache, or links to both.
assets="" # KUBEBUILDER_ASSETS, when it holds the control plane
if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
    if [[ -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]]; then
        assets="$(cd "$KUBEBUILDER_ASSETS" && pwd)"
    else
        say "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS holds no executable kube-apiserver and etcd; building them"
    fi
fi
assets_has() { # name -> 0 when KUBEBUILDER_ASSETS holds it (any version: it wins for what it holds)
    [[ -n "$assets" && -x "$assets/$1" ]]
}
ready_dir() { # -> prints the directory to use and returns 0, or returns 1 when something is missing
    local name need_links=0
    if [[ -n "$assets" ]]; then
        for name in "${wanted[@]}"; do
            assets_has "$name" && continue
            binary_ok "$final" "$name" || return 1
            need_links=1
        done
        if ((!need_links)); then
            echo "$assets"
            return 0
        fi
        # KUBEBUILDER_ASSETS for what it holds, the cache for the rest: one directory of links.
        local links
        links="$cache_root/assets-$(printf '%s' "$assets" | sha256sum | cut -c1-12)"
        mkdir -p "$links"
        for name in "${CONTROL_PLANE[@]}" "${NODE[@]}" kubectl; do
            if assets_has "$name"; then
                ln -sfn "$assets/$name" "$links/$name"
            elif [[ -x "$final/$name" ]]; then
                ln -sfn "$final/$name" "$links/$name"
            fi
        done
        echo "$links"
        return 0
    fi
    all_ok "$final" "${wanted[@]}" || return 1
    echo "$final"
}

if dir="$(ready_dir)"; then
    if [[ -n "$assets" ]]; then say "using KUBEBUILDER_ASSETS=$assets (its binaries win; nothing built)"; fi
    say "cached: ${wanted[*]} ($k8s_version, etcd $etcd_version)"
    echo "$dir"
    exit 0
fi
if ((no_build)); then
    if [[ -n "$assets" ]]; then
        todo="$(for n in "${wanted[@]}"; do assets_has "$n" || binary_ok "$final" "$n" || echo "$n"; done | tr '\n' ' ')"
    else
        todo="$(missing_in "$final" "${wanted[@]}" | tr '\n' ' ')"
    fi
    say "${todo% } ($k8s_version, etcd $etcd_version) not built yet (looked in $final${assets:+ and KUBEBUILDER_ASSETS=$assets}); run 'make kube-bin' or set KUBEBUILDER_ASSETS"
    exit 3
fi

command -v go >/dev/null 2>&1 || die "no 'go' on PATH: install Go (etcd/go.mod names the version needed) or set KUBEBUILDER_ASSETS to a directory with the binaries"
mkdir -p "$cache_root" || die "cannot create the cache directory $cache_root (set DAM_KUBE_BIN_CACHE)"
# One builder at a time; a second one waits and then finds the first one's result.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$cache_root/.lock"
    flock 9
    if dir="$(ready_dir)"; then
        say "cached (built by a concurrent run): ${wanted[*]}"
        echo "$dir"
        exit 0
    fi
fi

todo=()
for name in "${wanted[@]}"; do
    assets_has "$name" || binary_ok "$final" "$name" || todo+=("$name")
done

tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# Use the committed go.sum as it is: never let the build rewrite go.mod/go.sum.
# CGO_ENABLED=0 for all five: static binaries that run on any glibc. Upstream's hack/lib/golang.sh
# builds kubelet with cgo where it can (kubelet is not in its KUBE_STATIC_BINARIES), but nothing kubelet
# does on Linux needs cgo: k0s, for one, ships a CGO_ENABLED=0 kubelet by default
# (k0sproject/k0s embedded-bins/kubernetes/Dockerfile, BUILD_GO_CGO_ENABLED defaults to 0).
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
wants() { # name -> 0 when it is to be built
    local n
    for n in "${todo[@]}"; do [[ "$n" == "$1" ]] && return 0; done
    return 1
}

ver=k8s.io/component-base/version
k8s_ldflags="-s -w -X $ver.gitVersion=$k8s_version -X $ver.gitMajor=1 -X $ver.gitMinor=$k8s_minor -X $ver.gitTreeState=clean"

say "building ${todo[*]} ($k8s_version, etcd $etcd_version) with $(go env GOVERSION) into $final"
say "(first build: about 200 MB of Go modules and 5-10 min of compiling on 2 cores for the control plane, as long again for the node; later runs reuse the Go build cache)"
started=$SECONDS

say "[1/2] downloading Go modules"
if wants kube-apiserver; then
    run_with_heartbeat "go mod download (kube-apiserver)" bash -c "cd '$here/kube-apiserver' && go mod download"
fi
if wants etcd; then
    run_with_heartbeat "go mod download (etcd)" bash -c "cd '$here/etcd' && go mod download"
fi
if wants kubelet || wants kube-controller-manager || wants kube-scheduler; then
    run_with_heartbeat "go mod download (node)" bash -c "cd '$here/node' && go mod download"
fi

say "[2/2] compiling"
if wants kube-apiserver; then
    run_with_heartbeat "go build kube-apiserver" bash -c "cd '$here/kube-apiserver' && go build -trimpath \
        -ldflags '$k8s_ldflags' -o '$tmp/kube-apiserver' k8s.io/kubernetes/cmd/kube-apiserver"
fi
if wants etcd; then
    run_with_heartbeat "go build etcd" bash -c "cd '$here/etcd' && go build -trimpath \
        -ldflags '-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd_version' \
        -o '$tmp/etcd' go.etcd.io/etcd/server/v3"
fi
for name in "${NODE[@]}"; do
    wants "$name" || continue
    run_with_heartbeat "go build $name" bash -c "cd '$here/node' && go build -trimpath \
        -ldflags '$k8s_ldflags' -o '$tmp/$name' k8s.io/kubernetes/cmd/$name"
done

for name in "${todo[@]}"; do
    binary_ok "$tmp" "$name" || die "the built $name does not report the pinned version: $("$tmp/$name" --version 2>&1 | head -1)"
done
mkdir -p "$final" && chmod 755 "$final"
# Each binary moves into place in one rename (a reader sees the old file or the new one, never half).
for name in "${todo[@]}"; do
    mv -f "$tmp/$name" "$final/$name" || die "cannot move $name into $final"
done
printf '%s %s built with %s on %s (%d s for %s)\n' "${todo[*]}" "$k8s_version" "$(go env GOVERSION)" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((SECONDS - started))" "${todo[*]}" >>"$final/BUILD-INFO"
say "built ${todo[*]} in $((SECONDS - started)) s"
ready_dir || die "built, yet $final lacks some of ${wanted[*]}"
