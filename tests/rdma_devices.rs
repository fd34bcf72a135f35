//! Device discovery on real Soft-RoCE devices, through the built plugin loaded by a C host the
//! way NCCL loads it. Runs inside the VM (`scripts/rdma-vm.sh`), where rxe0 sits on `lo` and rxe1
//! and rxe2 on the two ends of a veth pair; it fails, never skips, when those devices are missing.
#![allow(clippy::unwrap_used)] // test helpers panic with context

mod support;

use std::fs;
use std::path::Path;

use nccl_net::verbs::{
    Access, CompletionQueue, Device, HostRegion, Op, PathParams, PostRefused, ProtectionDomain,
    QpCaps, QueuePair, RemoteEndpoint, Sge, WorkRequest,
};
use support::run_host;

const NCCL_LOG_WARN: i64 = 2;
const NCCL_LOG_INFO: i64 = 3;

fn require_rxe_devices() {
    for dev in ["rxe0", "rxe1", "rxe2"] {
        assert!(
            Path::new("/sys/class/infiniband").join(dev).exists(),
            "RDMA device {dev} is missing: run this suite through scripts/rdma-vm.sh, which loads \
             rdma_rxe and creates rxe0 on lo, rxe1 and rxe2 on veth0 and veth1"
        );
    }
}

fn sysfs(dev: &str, file: &str) -> String {
    let path = Path::new("/sys/class/infiniband").join(dev).join(file);
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// `ports/1/rate` reads like "2.5 Gb/sec (1X SDR)".
fn sysfs_rate_mbps(dev: &str) -> i64 {
    let rate = sysfs(dev, "ports/1/rate");
    let gbps: f64 = rate
        .split_whitespace()
        .next()
        .and_then(|g| g.parse().ok())
        .unwrap();
    (gbps * 1000.0).round() as i64
}

/// `sys_image_guid` reads like "0200:00ff:fe00:0000".
fn sysfs_guid(dev: &str) -> i64 {
    u64::from_str_radix(&sysfs(dev, "sys_image_guid").replace(':', ""), 16).unwrap() as i64
}

fn names(env: &[(&str, &str)]) -> Vec<String> {
    require_rxe_devices();
    let run = run_host(env, &[]);
    assert_eq!(run.rc("devices"), 0);
    run.device_names()
}

fn zero_device_warning(env: &[(&str, &str)]) -> String {
    require_rxe_devices();
    let run = run_host(env, &[]);
    assert_eq!(run.calls("devices")[0].int("ndev"), 0, "{}", run.stdout);
    let warnings = run.zero_device_reasons();
    assert_eq!(
        warnings.len(),
        1,
        "expected one line saying why:\n{}",
        run.stdout
    );
    assert_eq!(warnings[0].int("level"), NCCL_LOG_WARN);
    warnings[0].get("msg").to_owned()
}

#[test]
fn devices_finds_every_rxe_device_with_plausible_properties() {
    require_rxe_devices();
    let run = run_host(&[("NCCL_DEBUG", "INFO")], &["--misuse"]);
    assert_eq!(run.rc("init"), 0);
    assert_eq!(
        run.rc("getProperties(out-of-range)"),
        3,
        "index 3 of 3 devices: ncclInternalError"
    );
    let devices = run.devices();
    assert_eq!(run.device_names(), ["rxe0", "rxe1", "rxe2"]);
    for d in &devices {
        let name = d.get("name");
        assert_eq!(d.int("rc"), 0);
        assert_eq!(d.get("pciPath"), "(null)", "Soft-RoCE has no PCI parent");
        assert_eq!(d.int("port"), 1);
        assert_eq!(
            d.int("speed"),
            sysfs_rate_mbps(name),
            "{name}: speed must match ports/1/rate"
        );
        assert_eq!(
            d.int("guid"),
            sysfs_guid(name),
            "{name}: guid must be sys_image_guid"
        );
        assert!(d.int("maxComms") > 0, "{name}: maxComms");
        assert_eq!(d.int("maxRecvs"), 8);
        assert_eq!(d.int("ptrSupport"), 1, "host memory only on rxe");
        assert_eq!((d.int("netDeviceType"), d.int("netDeviceVersion")), (0, 0));
        assert_eq!(d.int("latency"), 0);
    }
    let messages: Vec<String> = run.logs().iter().map(|l| l.get("msg").to_owned()).collect();
    let count = |needle: &str| messages.iter().filter(|m| m.contains(needle)).count();
    assert_eq!(
        count("no CUDA driver (libcuda.so not found"),
        4,
        "one line for the process and one per device: {messages:#?}"
    );
    assert_eq!(count("every device registers host memory only"), 1);
    for dev in ["rxe0", "rxe1", "rxe2"] {
        let gdr = messages
            .iter()
            .find(|m| m.contains(&format!("{dev}: GPUDirect RDMA off: ")))
            .unwrap_or_else(|| panic!("no GPUDirect line for {dev}: {messages:#?}"));
        assert!(
            gdr.contains("no peer-memory module")
                && gdr.contains(&format!(
                    "DMA-BUF unsupported ({dev}: ibv_reg_dmabuf_mr: Operation not supported"
                )),
            "{gdr}"
        );
        assert_eq!(
            count(&format!(
                "{dev}: relaxed ordering on: under a hypervisor DMA goes through"
            )),
            1,
            "the VM is a hypervisor guest: {messages:#?}"
        );
    }
    let banner = run
        .logs()
        .into_iter()
        .find(|l| l.get("msg").contains("using [0]rxe0:1/RoCE"))
        .unwrap_or_else(|| panic!("no banner naming the devices:\n{}", run.stdout));
    assert_eq!(banner.int("level"), NCCL_LOG_INFO);
    assert_eq!(banner.int("flags"), 1 | 16, "banner carries INIT|NET");
    assert!(
        banner.get("msg").contains("[1]rxe1:1/RoCE"),
        "{}",
        banner.rest
    );
}

#[test]
fn hca_exact_entry_keeps_only_rxe1() {
    assert_eq!(names(&[("NCCL_IB_HCA", "rxe1")]), ["rxe1"]);
    assert_eq!(names(&[("NCCL_IB_HCA", "=rxe1")]), ["rxe1"]);
}

#[test]
fn hca_exclusion_drops_rxe0() {
    assert_eq!(names(&[("NCCL_IB_HCA", "^rxe0")]), ["rxe1", "rxe2"]);
    assert_eq!(names(&[("NCCL_IB_HCA", "^=rxe0")]), ["rxe1", "rxe2"]);
}

#[test]
fn hca_prefix_matches_all_and_exact_prefix_matches_none() {
    assert_eq!(names(&[("NCCL_IB_HCA", "rxe")]), ["rxe0", "rxe1", "rxe2"]);
    assert_eq!(names(&[("NCCL_IB_HCA", "rxe1,rxe0")]), ["rxe0", "rxe1"]);
    let msg = zero_device_warning(&[("NCCL_IB_HCA", "=rxe")]);
    assert!(msg.contains("NCCL_IB_HCA='=rxe'"), "{msg}");
}

#[test]
fn hca_port_field_selects_ports() {
    assert_eq!(names(&[("NCCL_IB_HCA", "rxe0:1")]), ["rxe0"]);
    assert_eq!(names(&[("NCCL_IB_HCA", "rxe0:1,rxe1:1")]), ["rxe0", "rxe1"]);
    let msg = zero_device_warning(&[("NCCL_IB_HCA", "rxe0:2")]);
    assert!(
        msg.contains("NCCL_IB_HCA='rxe0:2' matches no active port"),
        "{msg}"
    );
}

#[test]
fn hca_unknown_name_gives_zero_devices_and_names_the_filter() {
    let msg = zero_device_warning(&[("NCCL_IB_HCA", "mlx5_9")]);
    assert!(
        msg.contains("NCCL_IB_HCA='mlx5_9' matches no active port"),
        "{msg}"
    );
    assert!(
        msg.contains("rxe0:1") && msg.contains("rxe1:1"),
        "should list what exists: {msg}"
    );
}

#[test]
fn hca_malformed_value_gives_zero_devices_and_says_what_is_wrong() {
    let msg = zero_device_warning(&[("NCCL_IB_HCA", "rxe0:x")]);
    assert!(
        msg.contains("NCCL_IB_HCA='rxe0:x' is not valid: port 'x'"),
        "{msg}"
    );
}

#[test]
fn fuse_list_makes_one_device_with_summed_speed_and_a_reason_line() {
    require_rxe_devices();
    let run = run_host(
        &[("NCCL_DEBUG", "INFO"), ("NCCL_NET_RS_FUSE", "rxe0+rxe1")],
        &[],
    );
    assert_eq!(run.device_names(), ["rxe0+rxe1", "rxe2"]);
    let fused = &run.devices()[0];
    assert_eq!(
        fused.int("speed"),
        sysfs_rate_mbps("rxe0") + sysfs_rate_mbps("rxe1"),
        "a fused device's speed is the sum of its members'"
    );
    assert_eq!(fused.int("guid"), sysfs_guid("rxe0"), "first member's GUID");
    assert_eq!(fused.get("pciPath"), "(null)");
    let lines: Vec<String> = run
        .logs()
        .into_iter()
        .map(|l| l.get("msg").to_owned())
        .filter(|m| m.contains("fusion: "))
        .collect();
    assert!(
        lines.iter().any(|m| m.contains("fusion: fused rxe0+rxe1 (")
            && m.ends_with("listed in NCCL_NET_RS_FUSE")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|m| m.contains("fusion: rxe2 not fused: no PCI parent")),
        "{lines:?}"
    );
}

#[test]
fn fusion_off_gives_separate_devices_and_says_why() {
    require_rxe_devices();
    let run = run_host(
        &[
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_NET_RS_FUSE", "rxe0+rxe1"),
            ("NCCL_IB_MERGE_NICS", "0"),
        ],
        &[],
    );
    assert_eq!(run.device_names(), ["rxe0", "rxe1", "rxe2"]);
    assert!(
        run.logs().iter().any(|l| l
            .get("msg")
            .contains("fusion rxe0+rxe1 refused: NCCL_IB_MERGE_NICS=0 turns fusion off")),
        "{}",
        run.stdout
    );
    let typo = run_host(
        &[("NCCL_DEBUG", "INFO"), ("NCCL_NET_RS_FUSE", "rxe0+rxe9")],
        &[],
    );
    assert_eq!(typo.device_names(), ["rxe0", "rxe1", "rxe2"]);
    assert!(
        typo.logs().iter().any(|l| l.get("msg").contains(
            "fusion rxe0+rxe9 refused: rxe9 is not an active port selected by NCCL_IB_HCA"
        )),
        "{}",
        typo.stdout
    );
}

#[test]
fn gid_index_missing_on_a_device_is_refused_at_init_naming_the_variable() {
    require_rxe_devices();
    let why = init_refusal(&[("NCCL_IB_GID_INDEX", "99")]);
    assert!(
        why.contains("NCCL_IB_GID_INDEX=99 is not a populated GID") && why.contains(" on rxe0:1"),
        "{why}"
    );
}

/// `init` with `env` fails with ncclInvalidUsage (not the first `listen`); the one line that
/// says why.
fn init_refusal(env: &[(&str, &str)]) -> String {
    let run = run_host(env, &[]);
    assert_eq!(run.rc("init"), 5, "ncclInvalidUsage at init");
    run.logs()
        .into_iter()
        .map(|l| l.get("msg").to_owned())
        .find(|msg| msg.starts_with("init failed: "))
        .expect("one line saying why init failed")
}

/// NCCL's transport passes `NCCL_IB_PKEY` to every QP unchecked (`net_ib/connect.cc`). rxe does
/// not enforce partitions (`ib_write_bw --pkey_index=1` runs on it), but on a fabric that does,
/// a QP at an empty or missing entry reaches no peer: `init` refuses the index, naming the table.
#[test]
fn pkey_index_missing_on_a_port_is_refused_at_init_naming_the_table() {
    require_rxe_devices();
    let why = init_refusal(&[("NCCL_IB_PKEY", "1")]);
    assert!(
        why.contains(
            "NCCL_IB_PKEY=1 on rxe0:1: P_Key index 1 is past the end of the port's table of 1 \
             (its partitions: index 0 = 0xffff (full member))"
        ),
        "{why}"
    );
    let ok = run_host(&[("NCCL_IB_PKEY", "0")], &[]);
    assert_eq!(ok.rc("init"), 0, "index 0 holds rxe's default key");
}

/// rxe0's GID index and GID that carry 127.0.0.1.
fn loopback_gid() -> (u8, [u8; 16]) {
    let dir = Path::new("/sys/class/infiniband/rxe0/ports/1/gids");
    for index in 0..16u8 {
        let text = fs::read_to_string(dir.join(index.to_string())).unwrap_or_default();
        if text.trim() == "0000:0000:0000:0000:0000:ffff:7f00:0001" {
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(&[127, 0, 0, 1]);
            return (index, gid);
        }
    }
    panic!("rxe0 has no GID for 127.0.0.1 in its first 16 entries");
}

/// The flow control under the plugin's right-sized send queues (`transport::held`): a full send
/// queue refuses the rest of a chain with `PostRefused::Full` and the chain keeps the requests
/// the provider did not take, and a single post is refused whole. rxe grants exactly the depth
/// asked (127: depth + 1 rounded to a power of two, less the slot that tells full from empty).
/// The QP's peer does not exist, so nothing completes while the test posts.
#[test]
#[allow(unsafe_code)] // posts on a raw QP, whose memory the test keeps alive
fn a_full_send_queue_refuses_the_rest_of_a_chain_and_the_chain_keeps_it() {
    require_rxe_devices();
    let device = Device::open("rxe0").unwrap();
    let pd = ProtectionDomain::new(&device).unwrap();
    let cq = CompletionQueue::new(&device, 256).unwrap();
    let caps = QpCaps {
        max_send_wr: 127,
        max_recv_wr: 1,
        max_inline: 32,
    };
    let qp = QueuePair::new(&pd, &cq, caps).unwrap();
    qp.to_init(1, 0, Access::REMOTE_WRITE).unwrap();
    let (sgid_index, gid) = loopback_gid();
    let path = PathParams {
        port: 1,
        mtu: 3,
        global: true,
        dlid: 0,
        sgid_index,
        traffic_class: 0,
        service_level: 0,
        // About 4 s per try: nothing fails while the test posts.
        timeout: 20,
        retry_cnt: 7,
    };
    let nobody = RemoteEndpoint {
        qpn: 0x00ff_fff0,
        gid,
    };
    qp.to_rtr(&nobody, &path).unwrap();
    qp.to_rts(&path).unwrap();
    let region = HostRegion::new(std::slice::from_ref(&pd), 4096, Access::LOCAL_WRITE).unwrap();
    let write = |wr_id: u64| WorkRequest {
        wr_id,
        op: Op::Write,
        local: Sge {
            addr: region.addr(0),
            len: 64,
            lkey: region.mr(0).lkey(),
        },
        tail: Sge::default(),
        remote_addr: 0x1000,
        rkey: 1,
        signaled: false,
        cpu_readable: true,
    };
    let mut taken = 0u64;
    let mut chain = qp.chain();
    loop {
        for i in 0..16 {
            assert!(chain.push(&write(taken + i)));
        }
        // SAFETY: the region outlives the QP's use of it (the QP is destroyed first).
        match unsafe { qp.post(&mut chain) } {
            Ok(()) => {
                taken += 16;
                assert!(chain.is_empty());
            }
            Err(PostRefused::Full) => break,
            Err(PostRefused::Failed(e)) => panic!("a post failed other than for room: {e}"),
        }
        assert!(taken < 1024, "the send queue never filled");
    }
    assert_eq!(taken, 7 * 16, "seven whole chains, then 15 of the eighth");
    assert_eq!(
        chain.len(),
        1,
        "the chain keeps the one request the queue had no room for"
    );
    // SAFETY: as above.
    let again = unsafe { qp.post(&mut chain) };
    assert!(matches!(again, Err(PostRefused::Full)), "{again:?}");
    assert_eq!(chain.len(), 1);
    // SAFETY: as above.
    let one = unsafe { qp.post_one(&write(999)) };
    assert!(matches!(one, Err(PostRefused::Full)), "{one:?}");
    drop(qp);
}

/// The GID table as one verbs query (`Device::gid_table`, what a port's context reads when it
/// opens) says what sysfs says, entry by entry: index, GID, RoCE version, interface.
#[test]
fn the_gid_table_query_matches_sysfs() {
    require_rxe_devices();
    let sysfs = nccl_net::topology::SysfsRoot::new("/sys");
    for dev in ["rxe0", "rxe1", "rxe2"] {
        let device = Device::open(dev).unwrap();
        let queried = device.gid_table(1).unwrap();
        assert!(!queried.is_empty(), "{dev}: no GIDs");
        assert_eq!(queried, sysfs.port_gids(dev, 1), "{dev}");
    }
}
