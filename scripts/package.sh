#!/usr/bin/env bash
# Build a Debian package of the plugin and its doctor, with dpkg-deb over a staged tree, and
# print the package's path. The package installs
#   /usr/lib/<multiarch>/nccl-net-rsib/libnccl-net-rsib.so  (NCCL_NET_PLUGIN=rsib)
#   /usr/lib/<multiarch>/nccl-net-rsib/libnccl-net.so       (what NCCL opens without NCCL_NET_PLUGIN)
#   /etc/ld.so.conf.d/nccl-net-rsib.conf                     (that directory, for the dynamic loader)
#   /usr/bin/nccl-net-doctor
#   /usr/share/doc/nccl-net-rsib/                            (README, CHANGELOG, docs/, copyright)
# and runs ldconfig through dpkg's ldconfig trigger when it is installed or removed.
#
# usage: scripts/package.sh [OUTDIR]   (default target/debian; cargo's output on stderr)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/target/debian}"
command -v cargo >/dev/null || . "$HOME/.cargo/env"

name=nccl-net-rsib
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)"
arch="$(dpkg --print-architecture)"
multiarch="$(gcc -print-multiarch)"
libdir="usr/lib/$multiarch/$name"

stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$out"
# install.sh builds the shipped library and the doctor; the package takes its files.
"$repo/scripts/install.sh" "$stage/usr" >&2
install -d "$stage/$libdir"
mv "$stage/usr/lib/libnccl-net-rsib.so" "$stage/usr/lib/libnccl-net.so" "$stage/$libdir/"
strip --strip-unneeded "$stage/$libdir"/*.so "$stage/usr/bin/nccl-net-doctor"
install -D -m 0644 /dev/null "$stage/etc/ld.so.conf.d/$name.conf"
echo "/$libdir" >"$stage/etc/ld.so.conf.d/$name.conf"
install -D -m 0644 "$repo/README.md" "$stage/usr/share/doc/$name/README.md"
install -m 0644 "$repo/CHANGELOG.md" "$stage/usr/share/doc/$name/CHANGELOG.md"
install -m 0644 "$repo/LICENSE" "$stage/usr/share/doc/$name/copyright"
(cd "$repo" && find docs -name '*.md' -exec install -D -m 0644 {} "$stage/usr/share/doc/$name/{}" \;)

installed_kib="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
# libibverbs >= 34 (rdma-core): the plugin links ibv_reg_dmabuf_mr (IBVERBS_1.12); glibc 2.34 for
# the symbols Rust's standard library binds; the providers package holds the NIC drivers.
cat >"$stage/DEBIAN/control" <<EOF
Package: $name
Version: $version-1
Architecture: $arch
Maintainer: nccl-net-rsib developers <nccl-net-rsib@users.noreply.github.com>
Installed-Size: $installed_kib
Depends: libc6 (>= 2.34), libgcc-s1, libibverbs1 (>= 34), ibverbs-providers
Section: libs
Priority: optional
Description: NCCL network plugin over InfiniBand/RoCE verbs (RsIB)
 An NCCL net plugin (ncclNet v8 to v12) written in Rust: NCCL loads it with
 NCCL_NET_PLUGIN=rsib (or by default, as libnccl-net.so) and carries its
 point-to-point traffic over RC queue pairs. It fuses the ports of a NIC into
 one device, explains its GPUDirect RDMA decisions, and ships nccl-net-doctor,
 which says what is wrong with a node or a pair of nodes.
EOF
# libc-bin's trigger runs ldconfig once dpkg has unpacked or removed the files.
echo "activate-noawait ldconfig" >"$stage/DEBIAN/triggers"

deb="$out/${name}_${version}-1_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >&2
echo "$deb"
