#!/usr/bin/env bash
# Build the project's image from its own Dockerfile with buildah (no Docker engine, no registry),
# export it as an OCI archive that `ctr -n k8s.io images import` takes, cache it by the hash of what
# goes into it, and print the archive's path as the last line of stdout (progress goes to stderr):
#     archive=$(tools/image/build.sh | tail -n 1)
#
# Images (each an OCI archive in the cache, named inside the archive):
#   operator (default)  the Dockerfile, unmodified, built with build args only  -> ghcr.io/mlsys/dam-operator:0.1.0
#   base                the base image PYTHON_IMAGE names, made locally (below)  -> python:3.11.13-slim-bookworm
#                       (also the training image of the node tests: torch comes from the host, read-only)
#   pause               the sandbox image containerd's CRI plug-in starts first  -> registry.k8s.io/pause:3.10.1
#   all                 the three; prints the operator's archive last
#
# No registry is reachable here, so the base image is made locally, the first time, from Debian's own
# packages (mmdebstrap --variant=minbase bookworm + python3, python3-pip, python-is-python3,
# ca-certificates, netbase) and tagged with the name the Dockerfile's PYTHON_IMAGE default names. The
# official python:3.11.13-slim-bookworm keeps CPython 3.11.13 (built from source) in /usr/local; this one
# has Debian's CPython 3.11 in /usr/bin with `python`, `python3`, `pip` on PATH and pip installing into
# /usr/local (Debian's EXTERNALLY-MANAGED marker removed, as in the official image, which has none):
# the same commands the Dockerfile runs (`pip wheel`, `pip install`, `dam`) work unchanged.
#
# The Dockerfile itself stays the one users build with docker:
#   buildah bud --pull-never --network host --isolation chroot --build-arg VERSION=... --build-arg REVISION=...
# This machine's pip settings reach its RUN steps through read-only bind mounts (buildah bud -v), never
# through the Dockerfile: a pip.conf written from `pip config list` and the PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, PIP_CERT variables, and the CA bundle it names.
#
# Environment:
#   DAM_IMAGE_CACHE   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/image)
#   IMAGE_REPOSITORY  default ghcr.io/mlsys/dam-operator;  IMAGE_TAG default: the project's version
#   PYTHON_IMAGE      default: the Dockerfile's ARG PYTHON_IMAGE
# With --no-build nothing is built: the archive is printed if it is cached, else exit 3.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
say() { printf 'image: %s\n' "$*" >&2; }
die() {
    printf 'image: ERROR: %s\n' "$*" >&2
    exit 1
}

what=operator
no_build=0
for arg in "$@"; do
    case "$arg" in
        --no-build) no_build=1 ;;
        operator | base | pause | all) what="$arg" ;;
        *)
            echo "usage: $0 [--no-build] [operator|base|pause|all]" >&2
            exit 2
            ;;
    esac
done

cache="${DAM_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dam-operator/image}"
archives="$cache/archives"
version="$(awk -F'"' '/^version *=/ {print $2; exit}' "$repo/pyproject.toml")"
[[ -n "$version" ]] || die "cannot read the version from $repo/pyproject.toml"
repository="${IMAGE_REPOSITORY:-ghcr.io/mlsys/dam-operator}"
tag="${IMAGE_TAG:-$version}"
dockerfile_python="$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$repo/Dockerfile" | head -n 1)"
python_image="${PYTHON_IMAGE:-$dockerfile_python}"
[[ -n "$python_image" ]] || die "no PYTHON_IMAGE (and none in the Dockerfile's ARG PYTHON_IMAGE)"
pause_image="registry.k8s.io/pause:3.10.1" # tools/node/containerd.toml's sandbox_image names it too
suite=bookworm                             # the base's Debian release (python:*-slim-bookworm)

sha() { sha256sum | cut -c1-16; }
full_name() { # name -> the fully qualified reference containers/image uses for it
    local name="$1" first="${1%%/*}"
    if [[ "$name" != */* ]]; then
        name="docker.io/library/$name"
    elif [[ "$first" != *.* && "$first" != *:* && "$first" != localhost ]]; then
        name="docker.io/$name"
    fi
    echo "$name"
}

# --- the cache keys: everything that goes into each image ---------------------------------------------
# What makes the base: change base_recipe when build_base changes what it makes.
base_recipe="minbase python3 python3-pip python-is-python3 ca-certificates netbase; no EXTERNALLY-MANAGED; v1"
base_key() { echo "$python_image $suite $(uname -m) $base_recipe" | sha; }
pause_key() { { cat "$(pause_source)"; echo "$pause_image"; gcc --version 2>/dev/null | head -n 1; } | sha; }
operator_key() { # the Dockerfile, the files its COPYs read (the .dockerignore allow-list), args, the base
    {
        (cd "$context" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
        echo "$repository:$tag $version $base_key"
    } | sha
}
pause_source() {
    local mod
    mod="$(go env GOMODCACHE 2>/dev/null || echo "$HOME/go/pkg/mod")"
    local k8s
    k8s="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3; exit}' "$repo/tools/kube-bin/kube-apiserver/go.mod")"
    echo "$mod/k8s.io/kubernetes@$k8s/build/pause/linux/pause.c"
}

# The build context, snapshotted: what the .dockerignore allow-list lets in (pyproject.toml, README.md,
# sidecar/, operator/) and the Dockerfile, copied once, so that the hash names exactly what is built
# even while someone edits the working tree.
context="$(mktemp -d "${TMPDIR:-/tmp}/dam-image-context.XXXXXX")"
trap 'rm -rf "$context"' EXIT
(cd "$repo" && tar -c --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' \
    Dockerfile .dockerignore pyproject.toml README.md sidecar operator) | tar -x -C "$context"
base_key="$(base_key)"
pause_key="$(pause_key)"
operator_key="$(operator_key)"

archive_for() { # image -> path of its archive (named by its key)
    case "$1" in
        base) echo "$archives/base-$base_key.oci.tar" ;;
        pause) echo "$archives/pause-$pause_key.oci.tar" ;;
        operator) echo "$archives/dam-operator-$tag-$operator_key.oci.tar" ;;
    esac
}

if ((no_build)); then
    list=("$what")
    [[ "$what" == all ]] && list=(base pause operator)
    for image in "${list[@]}"; do
        a="$(archive_for "$image")"
        [[ -s "$a" ]] || {
            say "the $image image is not built for these inputs (no $a): run 'make image'"
            exit 3
        }
        echo "$a"
    done
    exit 0
fi

command -v buildah >/dev/null 2>&1 || die "no buildah: run 'make system-deps' (Debian's buildah)"
[[ "$(id -u)" == 0 ]] || die "buildah here runs as root (its storage in $cache/storage): run as root"
mkdir -p "$archives" "$cache/storage" "$cache/run"
B=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay)
exec 9>"$cache/.lock"
flock 9 # one builder at a time; a second one then finds the first one's archives

export_archive() { # image-ref archive : an OCI archive whose index names the image
    local tmp="$2.tmp.$$"
    rm -f "$tmp"
    # oci-archive:PATH:NAME puts NAME in the index's org.opencontainers.image.ref.name annotation, which
    # `ctr images import` (containerd 1.6) turns into the image's name.
    "${B[@]}" push --quiet --format oci "$1" "oci-archive:$tmp:$1" >&2
    mv -f "$tmp" "$2"
}

build_base() {
    local archive ref key rootfs ctr
    archive="$(archive_for base)"
    ref="$(full_name "$python_image")"
    key="$base_key"
    if [[ -s "$archive" ]] && "${B[@]}" inspect --type image --format '{{index .ImageAnnotations "dev.dam.key"}}' "$ref" 2>/dev/null | grep -qx "$key"; then
        say "base: cached ($ref, $archive)"
        return
    fi
    command -v mmdebstrap >/dev/null 2>&1 || die "no mmdebstrap: run 'make system-deps'"
    say "base: making $ref locally from Debian $suite packages (mmdebstrap; first time about a minute)"
    local started=$SECONDS
    rootfs="$(mktemp -d "$cache/.rootfs.XXXXXX")"
    mmdebstrap --quiet --variant=minbase --mode=root --format=tar \
        --include=python3,python3-pip,python-is-python3,ca-certificates,netbase \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc/* "$1"/usr/share/man/*' \
        "$suite" "$rootfs/rootfs.tar" >&2 || die "mmdebstrap failed (Debian's mirror must be reachable once)"
    ctr="$("${B[@]}" from --quiet scratch)"
    "${B[@]}" add --quiet "$ctr" "$rootfs/rootfs.tar" / >&2
    "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 \
        --annotation "dev.dam.key=$key" \
        --label "dev.dam.note=made locally by tools/image/build.sh from Debian $suite packages; not the official image" \
        "$ctr"
    "${B[@]}" commit --quiet --rm "$ctr" "$ref" >&2
    rm -rf "$rootfs"
    export_archive "$ref" "$archive"
    say "base: $ref made in $((SECONDS - started)) s"
}

build_pause() {
    local archive src dir ctr
    archive="$(archive_for pause)"
    if [[ -s "$archive" ]]; then
        say "pause: cached ($archive)"
        return
    fi
    src="$(pause_source)"
    [[ -r "$src" ]] || (cd "$repo/tools/kube-bin/node" && GOFLAGS=-mod=readonly go mod download k8s.io/kubernetes) >&2
    [[ -r "$src" ]] || die "no $src (the k8s.io/kubernetes module: make kube-bin fetches it)"
    dir="$(mktemp -d "$cache/.pause.XXXXXX")"
    gcc -Os -static -DVERSION=v3.10.1-dam -o "$dir/pause" "$src" >&2 || die "gcc -static failed (make system-deps installs gcc, libc6-dev)"
    strip "$dir/pause" 2>/dev/null || true
    ctr="$("${B[@]}" from --quiet scratch)"
    "${B[@]}" copy --quiet "$ctr" "$dir/pause" /pause >&2
    "${B[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
    "${B[@]}" commit --quiet --rm "$ctr" "$pause_image" >&2
    rm -rf "$dir"
    export_archive "$pause_image" "$archive"
    say "pause: built from $src"
}

pip_settings() { # dir -> writes pip.conf there; prints buildah -v options for the RUN steps
    local dir="$1" conf="$1/pip.conf" cert line
    : >"$conf"
    echo "[global]" >>"$conf"
    # What pip on this machine is set to (files and PIP_* variables), flattened to [global].
    while IFS= read -r line; do
        [[ "$line" =~ ^[a-z]+\.([a-z-]+)=\'(.*)\'$ ]] || continue
        printf '%s = %s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" >>"$conf"
    done < <(python3 -m pip config list 2>/dev/null || true)
    [[ -n "${PIP_INDEX_URL:-}" ]] && echo "index-url = $PIP_INDEX_URL" >>"$conf"
    [[ -n "${PIP_EXTRA_INDEX_URL:-}" ]] && echo "extra-index-url = $PIP_EXTRA_INDEX_URL" >>"$conf"
    [[ -n "${PIP_TRUSTED_HOST:-}" ]] && echo "trusted-host = $PIP_TRUSTED_HOST" >>"$conf"
    [[ -n "${PIP_DEFAULT_TIMEOUT:-}" ]] && echo "timeout = $PIP_DEFAULT_TIMEOUT" >>"$conf"
    cert="${PIP_CERT:-$(sed -n 's/^cert *= *//p' "$conf" | tail -n 1)}"
    if [[ -n "$cert" ]]; then
        sed -i '/^cert *=/d' "$conf"
        echo "cert = /etc/dam-build-ca.pem" >>"$conf"
        printf -- '-v\n%s:/etc/dam-build-ca.pem:ro\n' "$cert"
    fi
    # Later keys win in pip's parser, so an environment variable overrides a file's setting.
    printf -- '-v\n%s:/etc/pip.conf:ro\n' "$conf"
}

build_operator() {
    local archive ref key dir started
    archive="$(archive_for operator)"
    ref="$(full_name "$repository:$tag")"
    if [[ -s "$archive" ]]; then
        say "operator: cached ($ref, $archive)"
        return
    fi
    build_base
    key="$operator_key"
    dir="$(mktemp -d "$cache/.operator.XXXXXX")"
    local -a volumes
    mapfile -t volumes < <(pip_settings "$dir")
    say "operator: building $ref from $repo/Dockerfile (buildah bud; a few minutes: pip fetches the dependencies' wheels)"
    started=$SECONDS
    (cd "$context" && "${B[@]}" bud --pull-never --network host --isolation chroot --layers=false \
        "${volumes[@]}" \
        --build-arg "PYTHON_IMAGE=$python_image" \
        --build-arg "VERSION=$version" \
        --build-arg "REVISION=content-$key" \
        -f Dockerfile -t "$ref" .) >&2 || die "buildah bud failed (output above)"
    rm -rf "$dir"
    export_archive "$ref" "$archive"
    say "operator: $ref built in $((SECONDS - started)) s"
    # Older archives of this image are stale now.
    find "$archives" -maxdepth 1 -name "dam-operator-$tag-*.oci.tar" ! -path "$archive" -delete
}

case "$what" in
    base) build_base ;;
    pause) build_pause ;;
    operator) build_operator ;;
    all) build_base && build_pause && build_operator ;;
esac
case "$what" in
    all) archive_for base && archive_for pause && archive_for operator ;;
    *) archive_for "$what" ;;
esac
