//! Link arguments for the cdylib NCCL loads, and the C logger of the plugin driver.
fn main() {
    // No soname: the one file is installed under two names (libnccl-net.so, libnccl-net-rsib.so)
    // and ldconfig caches a library under its soname, so a shared soname would leave one name
    // out of the cache and NCCL could not dlopen it (seen with NCCL 2.28.9). Without a soname
    // ldconfig takes each file's own name.
    // NCCL dlcloses the plugin when its last communicator goes away and may dlopen it again:
    // NODELETE keeps Rust statics, TLS destructors and the tracing dispatcher valid across that.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // The driver (src/driver) passes plugins a variadic logger, as NCCL does; Rust cannot define
    // one on stable, so it is C. Its symbol stays hidden in the cdylib (rustc's version script).
    cc::Build::new()
        .file("src/driver/logger.c")
        .warnings(true)
        .compile("rsib_driver_logger");
    println!("cargo:rerun-if-changed=src/driver/logger.c");
    println!("cargo:rerun-if-changed=build.rs");
}
