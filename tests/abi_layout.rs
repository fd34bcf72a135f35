//! `nccl-headers/` and `src/abi/types.rs` describe the same ABI, every version from 8 to 12: a C program compiled against the
//! headers prints every size, field offset and constant, and each must equal the Rust value.
#![allow(clippy::unwrap_used)] // test helpers panic with context

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::process::Command;

use nccl_net::abi::types::*;

/// `(C expression, Rust value)` for every size, every field offset and every constant.
fn rust_side() -> Vec<(String, i64)> {
    let mut facts: Vec<(String, i64)> = Vec::new();
    macro_rules! layout {
        ($t:ident { $($field:ident),* $(,)? }) => {
            facts.push((format!("sizeof({})", stringify!($t)), size_of::<$t>() as i64));
            $(facts.push((
                format!("offsetof({}, {})", stringify!($t), stringify!($field)),
                offset_of!($t, $field) as i64,
            ));)*
        };
    }
    macro_rules! constants {
        ($($name:ident => $value:expr),* $(,)?) => {
            $(facts.push((format!("(long long){}", stringify!($name)), $value as i64));)*
        };
    }
    layout!(ncclNetDeviceHandle_v8_t {
        netDeviceType,
        netDeviceVersion,
        handle,
        size,
        needsProxyProgress
    });
    layout!(ncclNetProperties_v8_t {
        name,
        pciPath,
        guid,
        ptrSupport,
        regIsGlobal,
        speed,
        port,
        latency,
        maxComms,
        maxRecvs,
        netDeviceType,
        netDeviceVersion,
    });
    layout!(ncclNet_v8_t {
        name,
        init,
        devices,
        getProperties,
        listen,
        connect,
        accept,
        regMr,
        regMrDmaBuf,
        deregMr,
        isend,
        irecv,
        iflush,
        test,
        closeSend,
        closeRecv,
        closeListen,
        getDeviceMr,
        irecvConsumed
    });
    layout!(ncclNetVDeviceProps_v9_t { ndevs, devs });
    layout!(ncclNetVDeviceProps_v12_t { ndevs, devs });
    layout!(ncclNetCommConfig_v10_t { trafficClass });
    layout!(ncclProfilerNetIbQp_v1_t {
        device,
        wr_id,
        opcode,
        qpNum,
        length
    });
    // `type` is at 0 in both (a Rust keyword, so not named here).
    layout!(ncclProfilerNetIbDescr_v1_t { qp });
    layout!(ncclNetCommAttr_v11_t {
        maxConcurrentPeers,
        minConcurrentPeers,
        maxFlowsPerPeer,
        minFlowsPerPeer
    });
    layout!(ncclNetAttr_v11_t {
        sendCommAttr,
        recvCommAttr,
        op,
        algo,
        proto
    });
    macro_rules! properties {
        ($t:ident { $($extra:ident),* }) => {
            layout!($t {
                name, pciPath, guid, ptrSupport, regIsGlobal, forceFlush, speed, port, latency,
                maxComms, maxRecvs, netDeviceType, netDeviceVersion, vProps, maxP2pBytes,
                maxCollBytes $(, $extra)*
            });
        };
    }
    properties!(ncclNetProperties_v9_t {});
    properties!(ncclNetProperties_v11_t {
        maxMultiRequestSize
    });
    properties!(ncclNetProperties_v12_t {
        maxMultiRequestSize,
        railId,
        planeId
    });
    layout!(ncclNet_v9_t {
        name,
        init,
        devices,
        getProperties,
        listen,
        connect,
        accept,
        regMr,
        regMrDmaBuf,
        deregMr,
        isend,
        irecv,
        iflush,
        test,
        closeSend,
        closeRecv,
        closeListen,
        getDeviceMr,
        irecvConsumed,
        makeVDevice
    });
    layout!(ncclNet_v10_t {
        name,
        init,
        devices,
        getProperties,
        listen,
        connect,
        accept,
        regMr,
        regMrDmaBuf,
        deregMr,
        isend,
        irecv,
        iflush,
        test,
        closeSend,
        closeRecv,
        closeListen,
        getDeviceMr,
        irecvConsumed,
        makeVDevice
    });
    layout!(ncclNet_v11_t {
        name,
        init,
        devices,
        getProperties,
        listen,
        connect,
        accept,
        regMr,
        regMrDmaBuf,
        deregMr,
        isend,
        irecv,
        iflush,
        test,
        closeSend,
        closeRecv,
        closeListen,
        getDeviceMr,
        irecvConsumed,
        makeVDevice,
        finalize,
        setNetAttr
    });
    layout!(ncclNet_v12_t {
        name,
        init,
        devices,
        getProperties,
        listen,
        connect,
        accept,
        regMr,
        regMrDmaBuf,
        deregMr,
        isend,
        irecv,
        iflush,
        test,
        closeSend,
        closeRecv,
        closeListen,
        getDeviceMr,
        irecvConsumed,
        makeVDevice,
        finalize,
        setNetAttr
    });
    // The aliases NCCL's headers declare per version must name the same layouts.
    for (alias, of) in [
        ("ncclNetProperties_v10_t", "ncclNetProperties_v9_t"),
        ("ncclNetVDeviceProps_v10_t", "ncclNetVDeviceProps_v9_t"),
        ("ncclNetVDeviceProps_v11_t", "ncclNetVDeviceProps_v9_t"),
        ("ncclNetCommConfig_v11_t", "ncclNetCommConfig_v10_t"),
        ("ncclNetCommConfig_v12_t", "ncclNetCommConfig_v10_t"),
        ("ncclNetAttr_v12_t", "ncclNetAttr_v11_t"),
        ("ncclNetDeviceHandle_v12_t", "ncclNetDeviceHandle_v8_t"),
    ] {
        let size = facts
            .iter()
            .find(|(k, _)| k == &format!("sizeof({of})"))
            .unwrap()
            .1;
        facts.push((format!("sizeof({alias})"), size));
    }
    facts.push((
        "sizeof(ncclResult_t)".into(),
        size_of::<ncclResult_t>() as i64,
    ));
    facts.push((
        "sizeof(ncclDebugLogger_t)".into(),
        size_of::<ncclDebugLogger_t>() as i64,
    ));
    constants!(
        ncclSuccess => ncclSuccess.0, ncclUnhandledCudaError => ncclUnhandledCudaError.0,
        ncclSystemError => ncclSystemError.0, ncclInternalError => ncclInternalError.0,
        ncclInvalidArgument => ncclInvalidArgument.0, ncclInvalidUsage => ncclInvalidUsage.0,
        ncclRemoteError => ncclRemoteError.0,
        NCCL_LOG_WARN => NCCL_LOG_WARN, NCCL_LOG_INFO => NCCL_LOG_INFO, NCCL_LOG_TRACE => NCCL_LOG_TRACE,
        NCCL_INIT => NCCL_INIT, NCCL_NET => NCCL_NET,
        NCCL_NET_HANDLE_MAXSIZE => NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_MAX_REQUESTS => NCCL_NET_MAX_REQUESTS,
        NCCL_NET_OPTIONAL_RECV_COMPLETION => NCCL_NET_OPTIONAL_RECV_COMPLETION,
        NCCL_PTR_HOST => NCCL_PTR_HOST, NCCL_PTR_CUDA => NCCL_PTR_CUDA, NCCL_PTR_DMABUF => NCCL_PTR_DMABUF,
        NCCL_NET_DEVICE_HOST => NCCL_NET_DEVICE_HOST,
        NCCL_NET_DEVICE_INVALID_VERSION => NCCL_NET_DEVICE_INVALID_VERSION,
        NCCL_NET_MAX_DEVS_PER_NIC_V11 => NCCL_NET_MAX_DEVS_PER_NIC_V11,
        NCCL_NET_MAX_DEVS_PER_NIC_V12 => NCCL_NET_MAX_DEVS_PER_NIC_V12,
        NCCL_NET_TRAFFIC_CLASS_UNDEF => NCCL_NET_TRAFFIC_CLASS_UNDEF,
        NCCL_PROFILER_NET_EVENT_START => NCCL_PROFILER_NET_EVENT_START,
        NCCL_PROFILER_NET_EVENT_STOP => NCCL_PROFILER_NET_EVENT_STOP,
        NCCL_PROFILER_NET_TYPE_IB => NCCL_PROFILER_NET_TYPE_IB,
        NCCL_PROFILER_NET_IB_VER => NCCL_PROFILER_NET_IB_VER,
        NCCL_PROFILE_QP => NCCL_PROFILE_QP,
        NCCL_NET_ID_UNDEF => NCCL_NET_ID_UNDEF,
        NCCL_MAX_NET_SIZE_BYTES => NCCL_MAX_NET_SIZE_BYTES,
    );
    facts
}

fn c_side(facts: &[(String, i64)]) -> BTreeMap<String, i64> {
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"nccl_net_v8.h\"\n#include \"nccl_net_v12.h\"\nint main(void) {\n",
    );
    for (expr, _) in facts {
        writeln!(
            src,
            "  printf(\"%s=%lld\\n\", \"{expr}\", (long long)({expr}));"
        )
        .unwrap();
    }
    src.push_str("  return 0;\n}\n");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let source = dir.join("abi_layout.c");
    std::fs::write(&source, src).unwrap();
    let exe = support::compile_c(&source, "abi_layout", &[]);
    let out = Command::new(exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once('=').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn headers_and_rust_mirrors_agree_on_every_size_offset_and_constant() {
    let rust = rust_side();
    let c = c_side(&rust);
    let mismatches: Vec<String> = rust
        .iter()
        .filter(|(expr, value)| c.get(expr) != Some(value))
        .map(|(expr, value)| format!("{expr}: C says {:?}, Rust says {value}", c.get(expr)))
        .collect();
    assert!(
        mismatches.is_empty(),
        "nccl-headers/nccl_net_v*.h and src/abi/types.rs disagree (re-check nccl-net-abi.md §1.5 \
         and rust-stack.md §4, then fix the side that is wrong):\n{}",
        mismatches.join("\n")
    );
    assert!(rust.len() > 200, "every field of every struct is listed");
    for (table, size) in [
        ("ncclNet_v8_t", 152),
        ("ncclNet_v9_t", 160),
        ("ncclNet_v10_t", 160),
        ("ncclNet_v11_t", 176),
        ("ncclNet_v12_t", 176),
        ("ncclNetProperties_v8_t", 64),
        ("ncclNetProperties_v9_t", 104),
        ("ncclNetProperties_v10_t", 104),
        ("ncclNetProperties_v11_t", 112),
        ("ncclNetProperties_v12_t", 128),
        ("ncclNetAttr_v12_t", 44),
        ("ncclNetVDeviceProps_v11_t", 20),
        ("ncclNetVDeviceProps_v12_t", 36),
        ("ncclNetDeviceHandle_v12_t", 32),
    ] {
        assert_eq!(
            c[&format!("sizeof({table})")],
            size,
            "{table} (nccl-net-abi.md §1.5)"
        );
    }
}
