#!/usr/bin/env bash
# Build the plugin as it ships and print the library's path: the library crate alone as a
# cdylib, in the `plugin` profile (Cargo.toml: release settings), target/plugin/libnccl_net.so.
# `cargo build` makes the crate a cdylib and an rlib at once (the tests and tools link the rlib);
# rustc then does no LTO and calls between the library's own functions go through the GOT. Built
# alone it gets fat LTO and direct calls: fewer instructions per isend/irecv
# (docs/history/measurements-2026-11.md).
#
# usage: scripts/build-plugin.sh   (cargo's output on stderr, the path on stdout)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v cargo >/dev/null || . "$HOME/.cargo/env"
cargo rustc --profile plugin --lib --locked --crate-type cdylib \
  --manifest-path "$repo/Cargo.toml" >&2
echo "${CARGO_TARGET_DIR:-$repo/target}/plugin/libnccl_net.so"
