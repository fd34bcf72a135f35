#!/usr/bin/env bash
# Build the Debian packages of the plugin and its doctor, with dpkg-deb over staged trees, and
# print their paths (the plugin's package first). Installing nccl-net-rsib changes nothing for a
# job that does not ask for it:
#   /usr/lib/<multiarch>/nccl-net-rsib/libnccl-net-rsib.so  (NCCL_NET_PLUGIN=rsib)
#   /etc/ld.so.conf.d/nccl-net-rsib.conf                     (that directory, for the dynamic loader)
#   /usr/bin/nccl-net-doctor
#   /usr/share/doc/nccl-net-rsib/                            (README, CHANGELOG, docs/, copyright)
# nccl-net-rsib-default, installed only on purpose, makes it every job's plugin:
#   /usr/lib/<multiarch>/nccl-net-rsib/default/libnccl-net.so (what NCCL opens without NCCL_NET_PLUGIN)
#   /etc/ld.so.conf.d/nccl-net-rsib-default.conf
# Both run ldconfig through dpkg's ldconfig trigger when installed or removed. Their library
# dependencies come from dpkg-shlibdeps, i.e. from the symbols the built files use.
#
# usage: scripts/package.sh [OUTDIR]   (default target/debian; cargo's output on stderr)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/target/debian}"
command -v cargo >/dev/null || . "$HOME/.cargo/env"

name=nccl-net-rsib
default_name=$name-default
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)"
arch="$(dpkg --print-architecture)"
multiarch="$(gcc -print-multiarch)"
libdir="usr/lib/$multiarch/$name"

# dpkg-shlibdeps reads debian/control and expects the files under debian/<package>/.
build="$out/build"
stage="$build/debian/$name"
default_stage="$build/debian/$default_name"
rm -rf "$build"
mkdir -p "$stage/DEBIAN" "$default_stage/DEBIAN"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n\nPackage: %s\nArchitecture: any\n' \
  "$name" "$name" "$default_name" >"$build/debian/control"

# install.sh builds the shipped library and the doctor; the packages take its files.
"$repo/scripts/install.sh" "$stage/usr" >&2
install -d "$stage/$libdir" "$default_stage/$libdir/default"
mv "$stage/usr/lib/libnccl-net-rsib.so" "$stage/$libdir/"
mv "$stage/usr/lib/libnccl-net.so" "$default_stage/$libdir/default/"
strip --strip-unneeded "$stage/$libdir"/*.so "$default_stage/$libdir/default/libnccl-net.so" \
  "$stage/usr/bin/nccl-net-doctor"
install -D -m 0644 /dev/null "$stage/etc/ld.so.conf.d/$name.conf"
echo "/$libdir" >"$stage/etc/ld.so.conf.d/$name.conf"
install -D -m 0644 /dev/null "$default_stage/etc/ld.so.conf.d/$default_name.conf"
echo "/$libdir/default" >"$default_stage/etc/ld.so.conf.d/$default_name.conf"
install -D -m 0644 "$repo/README.md" "$stage/usr/share/doc/$name/README.md"
install -m 0644 "$repo/CHANGELOG.md" "$stage/usr/share/doc/$name/CHANGELOG.md"
install -m 0644 "$repo/LICENSE" "$stage/usr/share/doc/$name/copyright"
(cd "$repo" && find docs -name '*.md' -exec install -D -m 0644 {} "$stage/usr/share/doc/$name/{}" \;)
install -D -m 0644 "$repo/LICENSE" "$default_stage/usr/share/doc/$default_name/copyright"

# shlibs:Depends=libc6 (>= 2.34), ... for the files of each package.
shlibs() { # shlibs FILE...
  (cd "$build" && dpkg-shlibdeps -O "$@" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}
depends="$(shlibs -e"debian/$name/$libdir/libnccl-net-rsib.so" -e"debian/$name/usr/bin/nccl-net-doctor")"
default_depends="$(shlibs -e"debian/$default_name/$libdir/default/libnccl-net.so")"
[ -n "$depends" ] && [ -n "$default_depends" ] ||
  { echo "package.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

control() { # control PACKAGE STAGE DEPENDS SUMMARY DESCRIPTION
  cat >"$2/DEBIAN/control" <<CONTROL
Package: $1
Version: $version-1
Architecture: $arch
Maintainer: nccl-net-rsib developers <nccl-net-rsib@users.noreply.github.com>
Installed-Size: $(du -sk --exclude=DEBIAN "$2" | cut -f1)
Depends: $3
Section: libs
Priority: optional
Description: $4
$5
CONTROL
  # libc-bin's trigger runs ldconfig once dpkg has unpacked or removed the files.
  echo "activate-noawait ldconfig" >"$2/DEBIAN/triggers"
}
# The providers package holds the NIC drivers libibverbs loads at run time (no symbol names it).
control "$name" "$stage" "$depends, ibverbs-providers" \
  "NCCL network plugin over InfiniBand/RoCE verbs (RsIB)" \
  " An NCCL net plugin (ncclNet v8 to v12) written in Rust: NCCL loads it with
 NCCL_NET_PLUGIN=rsib and carries its point-to-point traffic over RC queue
 pairs. It fuses the ports of a NIC into one device, explains its GPUDirect
 RDMA decisions, and ships nccl-net-doctor, which says what is wrong with a
 node or a pair of nodes. Jobs that do not set NCCL_NET_PLUGIN=rsib are not
 affected; nccl-net-rsib-default makes it the plugin of every job."
control "$default_name" "$default_stage" "$name (= $version-1), $default_depends" \
  "RsIB as the default NCCL net plugin (libnccl-net.so)" \
  " Installs the RsIB plugin as libnccl-net.so, the library NCCL opens when
 NCCL_NET_PLUGIN is unset: every NCCL job on the host then uses it. Another
 plugin's libnccl-net.so (HPC-X, aws-ofi-nccl) found earlier on the loader's
 path still wins; remove this package to go back."

deb="$out/${name}_${version}-1_${arch}.deb"
default_deb="$out/${default_name}_${version}-1_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >&2
dpkg-deb --root-owner-group --build "$default_stage" "$default_deb" >&2
echo "$deb"
echo "$default_deb"
