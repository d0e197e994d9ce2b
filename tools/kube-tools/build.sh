#!/usr/bin/env bash
# Build the command-line tools a user of `make cluster` needs, once, from the Go module proxy, cache
# them outside the repository, and print the directory that holds them as the LAST line of stdout
# (progress goes to stderr), so that a shell can do
#     export PATH="$(make -s tools | tail -n 1):$PATH"
#
# What it builds, into one directory ($cache/bin):
#   kubectl  k8s.io/kubernetes/cmd/kubectl (tools/kube-tools/kubectl/go.mod), the release the cluster
#            runs: the pin must be tools/kube-bin's (checked), so client and server are the same release
#            and kubectl never warns of a version skew. (A module of its own: kube-bin's node module's
#            go.sum lacks kubectl's own dependencies, kustomize and cli-runtime among them.)
#   helm     helm.sh/helm/v3/cmd/helm        (tools/kube-tools/helm/go.mod pins the release)
#   crictl   sigs.k8s.io/cri-tools/cmd/crictl (tools/kube-tools/crictl/go.mod pins the release; the
#            cri-tools minor matches the Kubernetes minor, cri-tools' own compatibility rule)
# The versions live in those go.mod files (their go.sum files are committed); a binary in the cache
# that does not report its pinned version is built again.
#
# Environment:
#   DAM_TOOLS_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/tools)
#
# Usage:
#   build.sh             build what is missing, print the directory
#   build.sh --no-build  print the directory when all three are there, or exit 3 (never compiles)
set -euo pipefail

no_build=0
for arg in "$@"; do
    case "$arg" in
        --no-build) no_build=1 ;;
        *)
            echo "usage: $0 [--no-build]" >&2
            exit 2
            ;;
    esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kube_module="$here/kubectl"
kube_bin_module="$here/../kube-bin/node"
say() { printf 'tools: %s\n' "$*" >&2; }
die() {
    printf 'tools: ERROR: %s\n' "$*" >&2
    exit 1
}

module_version() { # go.mod module -> version (same reading as tools/kube-bin/build.sh)
    awk -v m="$2" '($1 == m && $2 ~ /^v/) || ($1 == "require" && $2 == m) {print ($1 == "require") ? $3 : $2; exit}' "$1"
}
k8s_version="$(module_version "$kube_module/go.mod" k8s.io/kubernetes)"
helm_version="$(module_version "$here/helm/go.mod" helm.sh/helm/v3)"
crictl_version="$(module_version "$here/crictl/go.mod" sigs.k8s.io/cri-tools)"
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || die "cannot read the k8s.io/kubernetes version from $kube_module/go.mod"
cluster_version="$(module_version "$kube_bin_module/go.mod" k8s.io/kubernetes)"
[[ "$k8s_version" == "$cluster_version" ]] || die "$kube_module/go.mod pins k8s.io/kubernetes $k8s_version but the cluster (tools/kube-bin/node/go.mod) runs $cluster_version: pin the same release"
k8s_minor="${BASH_REMATCH[1]}"
[[ "$helm_version" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "cannot read the helm.sh/helm/v3 version from $here/helm/go.mod"
[[ "$crictl_version" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "cannot read the sigs.k8s.io/cri-tools version from $here/crictl/go.mod"
# Helm reports the Kubernetes version of its client-go as the default capabilities (its Makefile).
helm_k8s="$(module_version "$here/helm/go.mod" k8s.io/client-go)"
[[ "$helm_k8s" =~ ^v0\.([0-9]+)\. ]] || die "cannot read k8s.io/client-go's version from $here/helm/go.mod"
helm_k8s_minor="${BASH_REMATCH[1]}"

cache_root="${DAM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/tools}"
bin="$cache_root/bin"
TOOLS=(kubectl helm crictl)

reported() { # dir name -> the version the binary reports (empty when it does not run)
    case "$2" in
        kubectl) "$1/kubectl" version --client -o json 2>/dev/null | sed -n 's/^ *"gitVersion": "\(.*\)",*$/\1/p' | head -n 1 ;;
        helm) "$1/helm" version --template '{{.Version}}' 2>/dev/null ;;
        crictl) "$1/crictl" --version 2>/dev/null | sed -n 's/^crictl version //p' ;;
    esac
}
pinned() { # name -> its pinned version
    case "$1" in
        kubectl) echo "$k8s_version" ;;
        helm) echo "$helm_version" ;;
        crictl) echo "$crictl_version" ;;
    esac
}
binary_ok() { # dir name -> 0 when the binary is there and reports the pinned version
    [[ -x "$1/$2" ]] || return 1
    [[ "$(reported "$1" "$2" || true)" == "$(pinned "$2")" ]]
}
missing() { # -> the names not (correctly) in $bin, one a line
    local name
    for name in "${TOOLS[@]}"; do binary_ok "$bin" "$name" || echo "$name"; done
}
# crictl reads crictl.yaml beside its binary when /etc/crictl.yaml is not there (else it warns on every
# call): point it at `make cluster`'s containerd, so that `crictl ps` looks into the node's containers.
crictl_config() {
    local sock="${DAM_CLUSTER_DIR:-/var/lib/dam-node}/containerd/containerd.sock"
    [[ -e "$bin/crictl.yaml" ]] || printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\n' "$sock" "$sock" >"$bin/crictl.yaml"
}
summary="kubectl $k8s_version, helm $helm_version, crictl $crictl_version"

mapfile -t todo < <(missing)
if ((${#todo[@]} == 0)); then
    crictl_config
    say "cached: $summary"
    echo "$bin"
    exit 0
fi
if ((no_build)); then
    say "${todo[*]} not built yet (looked in $bin); run 'make tools'"
    exit 3
fi
command -v go >/dev/null 2>&1 || die "no 'go' on PATH: install Go ($kube_module/go.mod names the version needed)"
mkdir -p "$cache_root" || die "cannot create the cache directory $cache_root (set DAM_TOOLS_CACHE)"
# One builder at a time; a second one waits and then finds the first one's result.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$cache_root/.lock"
    flock 9
    mapfile -t todo < <(missing)
    if ((${#todo[@]} == 0)); then
        say "cached (built by a concurrent run): $summary"
        echo "$bin"
        exit 0
    fi
fi

tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# As tools/kube-bin/build.sh: the committed go.sum as it is, static binaries.
export GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

wait_for_exit() { # pid seconds -> 0 once pid has exited, 1 if still running after seconds
    local i
    for ((i = 0; i < $2; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 1
    done
    ! kill -0 "$1" 2>/dev/null
}
run_with_heartbeat() { # label command... : run, and say every 30 s that it still runs
    local label="$1" start=$SECONDS pid
    shift
    "$@" >&2 &
    pid=$!
    while ! wait_for_exit "$pid" 30; do
        say "  $label: still running ($((SECONDS - start)) s)"
    done
    wait "$pid" || die "$label failed (see the Go output above)"
    say "  $label: done in $((SECONDS - start)) s"
}

say "building ${todo[*]} ($summary) with $(go env GOVERSION) into $bin"
say "(first build: about 1-2 min a tool on 2 cores, less when the Go build cache has kube-bin's packages)"
started=$SECONDS
for name in "${todo[@]}"; do
    case "$name" in
        kubectl)
            ver=k8s.io/component-base/version # what `kubectl version` reports
            flags="-s -w -X $ver.gitVersion=$k8s_version -X $ver.gitMajor=1 -X $ver.gitMinor=$k8s_minor -X $ver.gitTreeState=clean"
            module="$kube_module" package=k8s.io/kubernetes/cmd/kubectl
            ;;
        helm)
            ver=helm.sh/helm/v3/internal/version
            flags="-s -w -X $ver.version=$helm_version -X $ver.gitTreeState=clean"
            for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
                flags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$helm_k8s_minor"
            done
            module="$here/helm" package=helm.sh/helm/v3/cmd/helm
            ;;
        crictl)
            flags="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version"
            module="$here/crictl" package=sigs.k8s.io/cri-tools/cmd/crictl
            ;;
    esac
    run_with_heartbeat "go mod download ($name)" bash -c "cd '$module' && go mod download"
    run_with_heartbeat "go build $name" bash -c "cd '$module' && go build -trimpath -ldflags '$flags' -o '$tmp/$name' '$package'"
    binary_ok "$tmp" "$name" || die "the built $name reports '$(reported "$tmp" "$name" || true)', not $(pinned "$name")"
done
mkdir -p "$bin" && chmod 755 "$bin"
# Each binary moves into place in one rename (a reader sees the old file or the new one, never half).
for name in "${todo[@]}"; do
    mv -f "$tmp/$name" "$bin/$name" || die "cannot move $name into $bin"
done
printf '%s built with %s on %s (%d s)\n' "${todo[*]}" "$(go env GOVERSION)" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((SECONDS - started))" >>"$cache_root/BUILD-INFO"
say "built ${todo[*]} in $((SECONDS - started)) s"
[[ -z "$(missing)" ]] || die "built, yet $bin lacks some of ${TOOLS[*]}"
crictl_config
echo "$bin"
