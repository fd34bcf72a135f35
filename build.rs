//! Link arguments for the cdylib NCCL loads.
fn main() {
    // The installed file is named libnccl-net.so (and libnccl-net-rsib.so); Cargo cannot emit a
    // hyphenated name, so the soname says what the file will be called.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net.so");
    // NCCL dlcloses the plugin when its last communicator goes away and may dlopen it again:
    // NODELETE keeps Rust statics, TLS destructors and the tracing dispatcher valid across that.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
