#!/usr/bin/env bash
# Build the real control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) from the versions pinned in tools/kube/go.mod, and Kueue's manager from
# tools/kube/kueue/go.mod (its own module: its own dependency versions), into
# .cache/kube/<version>/, <version> being the pinned k8s.io/kubernetes version.
#
# Why this shape (issue 24): the binaries are too slow to rebuild on every run (minutes
# each on two cores), so a binary already built for the pinned version is skipped, and a
# second cache outside the repo ($GPUPOOL_KUBE_BIN_CACHE, default ~/.cache/gpupool/kube)
# lets a fresh clone on the same machine (CI) take them without building.
#
# Each binary has a stamp file "<name>.version" holding the module@version it was built
# from, so a bump in go.mod rebuilds only what changed. Builds run at low priority with
# one package at a time (GOFLAGS=-p=1): the machines are shared.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOFLAGS="${GOFLAGS:--p=1} -buildvcs=false"
export CGO_ENABLED=0

cd "$here"
modver() { "$GO" list -m -f '{{.Version}}' "$1"; }
k8s_version="$(modver k8s.io/kubernetes)"
etcd_version="$(modver go.etcd.io/etcd/server/v3)"

out="$repo/.cache/kube/$k8s_version"
ext_root="${GPUPOOL_KUBE_BIN_CACHE:-${HOME:-/nonexistent}/.cache/gpupool/kube}"
ext="$ext_root/$k8s_version"
mkdir -p "$out"

# The version strings the components report (kubectl version, /version), as the
# upstream release build sets them; without them they say v0.0.0-master.
minor="${k8s_version#v1.}"
minor="${minor%%.*}"
k8s_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

fresh() { # fresh DIR NAME STAMP: the binary in DIR was built from STAMP
    [[ -x "$1/$2" && -f "$1/$2.version" && "$(cat "$1/$2.version")" == "$3" ]]
}

place() { # place SRC_DIR DST_DIR NAME: hard-link (or copy) a built binary and its stamp
    local tmp="$2/.$3.tmp.$$"
    ln -f "$1/$3" "$tmp" 2>/dev/null || cp -f "$1/$3" "$tmp"
    mv -f "$tmp" "$2/$3"
    cp -f "$1/$3.version" "$2/$3.version"
}

build() { # build NAME PACKAGE STAMP LDFLAGS [MODULE_DIR]
    local name="$1" pkg="$2" stamp="$3" ldflags="$4" moddir="${5:-$here}"
    if fresh "$out" "$name" "$stamp"; then
        echo "kube-bin: $name ($stamp) already in $out"
        return
    fi
    if fresh "$ext" "$name" "$stamp"; then
        echo "kube-bin: $name ($stamp) from $ext"
        place "$ext" "$out" "$name"
        return
    fi
    echo "kube-bin: building $name ($stamp); several minutes on a loaded machine"
    local tmp="$out/.$name.build.$$"
    /usr/bin/time -v -o "$out/$name.build-time" \
        nice -n 19 "$GO" -C "$moddir" build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg"
    mv -f "$tmp" "$out/$name"
    echo "$stamp" >"$out/$name.version"
    grep -E 'Elapsed|User time|System time|Maximum resident' "$out/$name.build-time" |
        sed "s/^/kube-bin:   $name /"
    if mkdir -p "$ext" 2>/dev/null; then
        place "$out" "$ext" "$name" || echo "kube-bin: could not share $name in $ext" >&2
    fi
}

# Arguments name the binaries wanted (CI asks only for what the test tier starts: etcd,
# kube-apiserver, kube-controller-manager); none means all five.
wanted=("$@")
[[ ${#wanted[@]} -gt 0 ]] || wanted=(etcd kube-apiserver kube-controller-manager kube-scheduler kueue)
for name in "${wanted[@]}"; do
    case "$name" in
    etcd) build etcd go.etcd.io/etcd/server/v3 "go.etcd.io/etcd/server/v3@$etcd_version" "-s -w" ;;
    kube-apiserver | kube-controller-manager | kube-scheduler)
        build "$name" "k8s.io/kubernetes/cmd/$name" "k8s.io/kubernetes/cmd/$name@$k8s_version" "$k8s_ldflags" ;;
    kueue)
        kueue_version="$("$GO" -C "$here/kueue" list -m -f '{{.Version}}' sigs.k8s.io/kueue)"
        build kueue sigs.k8s.io/kueue/cmd/kueue "sigs.k8s.io/kueue/cmd/kueue@$kueue_version" \
            "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version" "$here/kueue" ;;
    *) echo "kube-bin: unknown binary $name (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kueue)" >&2
       exit 2 ;;
    esac
done
echo "kube-bin: binaries in $out"
