//! The pair check: two doctors (or one, in loopback) exchange node cards over TCP, apply the
//! agreement rules, then connect through the plugin's own `listen`/`connect`/`accept`, move
//! byte-verified data both ways (host memory, then GPU memory with `iflush` where both ends
//! have CUDA), measure bandwidth per direction and compare the ports' error counters.
//!
//! Both sides run the same sequence per rail (NCCL device i to the peer's device i); direction
//! 0 is the serving side sending, direction 1 the other way. Control messages are JSON lines.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_net::cuda::DeviceBuffer;
use nccl_net::doctor::{Finding, Roots, Severity};
use nccl_net::driver::{
    self, Driver, LoadOptions, NCCL_PTR_CUDA, Ptr, fill_pattern, pattern_at, rendezvous,
};

use crate::card::{CardDevice, NodeCard, agreement};

mod bandwidth;
mod control;
mod counters;
mod traffic;

use control::{Control, Msg, expect, hex, unhex};
use counters::read_counters;

/// Message sizes of the correctness phase: odd sizes around page and chunk boundaries.
const CHECK_SIZES: [usize; 5] = [1, 4097, 65_536 + 3, (1 << 20) + 3, 4 << 20];
/// Message size and requests in flight of the bandwidth phase.
const BW_SIZE: usize = 4 << 20;
const BW_WINDOW: usize = 8;

/// How to run.
#[derive(Clone, Debug)]
pub(crate) struct PairOptions {
    /// Seconds of bandwidth measurement per direction.
    pub(crate) seconds: f64,
    /// Deadline for the rendezvous, each plugin call sequence and each control message.
    pub(crate) timeout: Duration,
    /// Only this NCCL device index (rail); `None`: every rail both ends have.
    pub(crate) dev: Option<usize>,
    /// A plugin library to load instead of the plugin built into the doctor.
    pub(crate) plugin: Option<PathBuf>,
}

/// Which end this is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// `--serve` (and the first thread of `--loopback`): sends first.
    Serve,
    /// `--peer`.
    Peer,
}

/// What one end concluded.
#[derive(Debug, Default)]
pub(crate) struct PairOutcome {
    /// Findings, in check order.
    pub(crate) findings: Vec<Finding>,
    /// The other end's card, once exchanged.
    pub(crate) peer: Option<NodeCard>,
}

/// `--serve`: wait for one peer on `addr`. `Err` = could not run (no peer came).
pub(crate) fn serve(
    addr: &str,
    card: &NodeCard,
    roots: &Roots,
    o: &PairOptions,
) -> Result<PairOutcome, String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "nccl-net-doctor: waiting for a peer on {local} (run `nccl-net-doctor --peer THIS_HOST:{}` on it)",
        local.port()
    );
    let stream =
        rendezvous::accept(&listener, Instant::now() + o.timeout, || None).map_err(|e| {
            format!(
                "no peer connected to {local} within {}s ({e}): check that the peer runs \
             `nccl-net-doctor --peer`, firewall rules for TCP port {}, and NCCL_SOCKET_IFNAME",
                o.timeout.as_secs(),
                local.port()
            )
        })?;
    let driver = load_driver(o)?;
    Ok(run(
        Control::new(stream, o.timeout)?,
        Side::Serve,
        card,
        roots,
        o,
        &driver,
        false,
    ))
}

/// `--peer`: connect to a serving doctor at `addr`. `Err` = could not run.
pub(crate) fn peer(
    addr: &str,
    card: &NodeCard,
    roots: &Roots,
    o: &PairOptions,
) -> Result<PairOutcome, String> {
    let stream = rendezvous::connect(addr, Instant::now() + o.timeout).map_err(|e| {
        format!(
            "cannot reach the serving doctor at {addr} within {}s ({e}): check that it runs \
             `nccl-net-doctor --serve`, the address and port, and firewall rules",
            o.timeout.as_secs()
        )
    })?;
    let driver = load_driver(o)?;
    Ok(run(
        Control::new(stream, o.timeout)?,
        Side::Peer,
        card,
        roots,
        o,
        &driver,
        false,
    ))
}

/// `--loopback`: both ends in this process (two threads over a local TCP control channel),
/// each device to itself.
pub(crate) fn loopback(
    card: &NodeCard,
    roots: &Roots,
    o: &PairOptions,
) -> Result<PairOutcome, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let client = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let server = rendezvous::accept(&listener, Instant::now() + o.timeout, || None)?;
    let driver = Arc::new(load_driver(o)?);
    let (card2, roots2, o2, driver2) =
        (card.clone(), roots.clone(), o.clone(), Arc::clone(&driver));
    let other = std::thread::spawn(move || {
        Control::new(client, o2.timeout)
            .map(|ctl| run(ctl, Side::Peer, &card2, &roots2, &o2, &driver2, true))
    });
    let mut outcome = run(
        Control::new(server, o.timeout)?,
        Side::Serve,
        card,
        roots,
        o,
        &driver,
        true,
    );
    // The other thread's findings mirror these; it only has to finish.
    let _ = other.join();
    outcome.findings.insert(
        0,
        Finding::new(
            Severity::Info,
            "pair.loopback",
            "node",
            "loopback: each device talks to itself through the NIC and PCIe; the cable and the \
             switch are not exercised (use --serve/--peer between two nodes for that)",
        ),
    );
    Ok(outcome)
}

/// The plugin's device for `card`, as NCCL would get it: the device of that name (a port, a
/// fusion the plugin made itself under ncclNet v8, an `NCCL_NET_RS_FUSE` group), else, from
/// ncclNet v9 on, where NCCL fuses ports itself, `makeVDevice` of its members.
fn plugin_device(net: &Driver, card: &CardDevice) -> Result<i32, String> {
    let count = net
        .devices()
        .map_err(|rc| with_cause(format!("devices() failed (ncclResult {rc})")))?;
    let names: Vec<String> = (0..count)
        .map(|d| net.device(d).map(|info| info.name).unwrap_or_default())
        .collect();
    let index = |name: &str| names.iter().position(|n| n == name).map(|i| i as i32);
    if let Some(dev) = index(&card.name) {
        return Ok(dev);
    }
    let members: Option<Vec<i32>> = card.members.iter().map(|m| index(&m.name)).collect();
    match members {
        Some(members) if members.len() > 1 => net.make_vdevice(&members).map_err(|rc| {
            with_cause(format!(
                "makeVDevice of {} failed (ncclResult {rc})",
                card.name
            ))
        }),
        _ => Err(format!(
            "the plugin has no device {} (it lists {})",
            card.name,
            names.join(", ")
        )),
    }
}

fn load_driver(o: &PairOptions) -> Result<Driver, String> {
    // The doctor prints the plugin's warnings itself, as the cause of a failed check.
    driver::echo_warnings(false);
    match &o.plugin {
        Some(path) => Driver::load(path, LoadOptions::default()),
        None => Driver::builtin(LoadOptions::default()),
    }
}

/// The plugin's last warning appended to `what` (a failed call returns only a code).
fn with_cause(what: String) -> String {
    match driver::last_warning() {
        Some(w) => format!("{what}: {w}"),
        None => what,
    }
}

fn run(
    mut ctl: Control,
    side: Side,
    card: &NodeCard,
    roots: &Roots,
    o: &PairOptions,
    net: &Driver,
    loopback: bool,
) -> PairOutcome {
    let mut out = PairOutcome::default();
    let fail =
        |check: &'static str, what: String| Finding::new(Severity::Fail, check, "pair", what);
    let exchanged = ctl
        .send(&Msg::Card {
            card: Box::new(card.clone()),
        })
        .and_then(|()| {
            expect(&mut ctl, "its node card", |m| match m {
                Msg::Card { card } => Some(*card),
                _ => None,
            })
        });
    let remote = match exchanged {
        Ok(c) => c,
        Err(why) => {
            out.findings.push(fail(
                "pair.card",
                format!("no node card from the peer: {why}"),
            ));
            return out;
        }
    };
    if remote.card_version != card.card_version {
        out.findings.push(fail(
            "pair.card",
            format!(
                "the peer's doctor {} speaks card version {}, this one {} {}: run the same version on both",
                remote.tool_version, remote.card_version, env!("CARGO_PKG_VERSION"), card.card_version
            ),
        ));
        out.peer = Some(remote);
        return out;
    }
    let rails: Vec<usize> = match o.dev {
        Some(d) => vec![d],
        None => (0..card.devices.len().min(remote.devices.len())).collect(),
    };
    for rail in rails {
        let (Some(l), Some(r)) = (card.devices.get(rail), remote.devices.get(rail)) else {
            out.findings.push(fail(
                "pair.devices",
                format!(
                    "device {rail} missing: {} device(s) here, {} on the peer",
                    card.devices.len(),
                    remote.devices.len()
                ),
            ));
            continue;
        };
        let rules = if loopback {
            Vec::new()
        } else {
            agreement(card, &remote, l, r)
        };
        let blocking: Vec<&'static str> = rules
            .iter()
            .filter(|f| f.severity == Severity::Fail)
            .map(|f| f.check)
            .collect();
        out.findings.extend(rules.iter().cloned());
        let entity = if loopback {
            format!("{} -> itself", l.name)
        } else {
            format!("{} <-> {}:{}", l.name, remote.host, r.name)
        };
        if let Some(first) = blocking.first() {
            out.findings.push(
                Finding::new(
                    Severity::Skip,
                    "pair.data",
                    &entity,
                    format!("not attempted: {}", blocking.join(", ")),
                )
                .depends_on(first),
            );
            continue;
        }
        let dev = match plugin_device(net, l) {
            Ok(dev) => dev,
            Err(why) => {
                out.findings.push(fail("pair.devices", why.clone()));
                let _ = ctl.send(&Msg::Abort { why });
                break;
            }
        };
        let mut rail_run = Rail {
            ctl: &mut ctl,
            net,
            side,
            dev,
            entity,
            o,
            findings: Vec::new(),
            loopback,
        };
        let result = rail_run.run(roots, l, r);
        out.findings.append(&mut rail_run.findings);
        if let Err(why) = result {
            // Tell the peer (it may be waiting on a message), then stop: the channel's state is
            // unknown after a failure midway.
            let _ = ctl.send(&Msg::Abort { why: why.clone() });
            break;
        }
    }
    out.peer = Some(remote);
    out
}

/// One rail's checks.
struct Rail<'a> {
    ctl: &'a mut Control,
    net: &'a Driver,
    side: Side,
    dev: i32,
    entity: String,
    o: &'a PairOptions,
    findings: Vec<Finding>,
    loopback: bool,
}

/// The two comms of a rail and the host buffers registered on them.
struct Comms {
    sc: Ptr,
    rc: Ptr,
    lc: Ptr,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    smh: Ptr,
    rmh: Ptr,
}

impl Rail<'_> {
    fn deadline(&self) -> Instant {
        Instant::now() + self.o.timeout
    }

    fn finding(&mut self, severity: Severity, check: &'static str, what: String) -> &mut Finding {
        self.findings
            .push(Finding::new(severity, check, self.entity.clone(), what));
        let last = self.findings.len() - 1;
        &mut self.findings[last]
    }

    /// Whether this end sends in `direction`.
    fn sends(&self, direction: usize) -> bool {
        (direction == 0) == (self.side == Side::Serve)
    }

    fn direction_name(&self, direction: usize) -> &'static str {
        match (self.loopback, self.sends(direction)) {
            (true, _) if direction == 0 => "first direction",
            (true, _) => "second direction",
            (false, true) => "this node -> peer",
            (false, false) => "peer -> this node",
        }
    }

    fn run(&mut self, roots: &Roots, l: &CardDevice, r: &CardDevice) -> Result<(), String> {
        let before = read_counters(roots, l);
        let mut comms = self.connect()?;
        let outcome = self.exercise(&mut comms, l, r);
        let net = self.net;
        let _ = (
            net.dereg_mr(comms.sc, comms.smh),
            net.dereg_mr(comms.rc, comms.rmh),
        );
        let _ = (
            net.close_send(comms.sc),
            net.close_recv(comms.rc),
            net.close_listen(comms.lc),
        );
        outcome?;
        self.counters(roots, l, r, &before)
    }

    fn connect(&mut self) -> Result<Comms, String> {
        let net = self.net;
        let listened = net.listen(self.dev).map_err(|rc| {
            with_cause(format!(
                "listen on device {} failed (ncclResult {rc})",
                self.dev
            ))
        });
        let (handle, lc) = match listened {
            Ok(ok) => ok,
            Err(why) => {
                self.finding(Severity::Fail, "pair.connect", why.clone());
                return Err(why);
            }
        };
        self.ctl.send(&Msg::Handle {
            handle: hex(&handle),
        })?;
        let peer = expect(self.ctl, "its listen handle", |m| match m {
            Msg::Handle { handle } => unhex(&handle),
            _ => None,
        })?;
        let start = Instant::now();
        let connected = net
            .connect_and_accept(self.dev, &peer, lc, self.deadline())
            .map_err(with_cause);
        self.ctl.send(&Msg::Connected {
            error: connected.as_ref().err().cloned(),
        })?;
        let theirs = expect(self.ctl, "its connect result", |m| match m {
            Msg::Connected { error } => Some(error),
            _ => None,
        })?;
        let (sc, rc) = match (connected, theirs) {
            (Ok(pair), None) => pair,
            (mine, theirs) => {
                let why = match (mine.err(), theirs) {
                    (Some(m), Some(t)) => format!("here: {m}; on the peer: {t}"),
                    (Some(m), None) => format!("here: {m}"),
                    (None, Some(t)) => format!("on the peer: {t}"),
                    (None, None) => unreachable!("handled above"),
                };
                let _ = net.close_listen(lc);
                self.finding(Severity::Fail, "pair.connect", format!("connect/accept through the plugin failed: {why}"))
                    .fix = Some(
                    "a timeout or ENETUNREACH points at the GID or route (see roce.gid on both nodes), \
                     a refused handshake names the setting that differs"
                        .to_owned(),
                );
                return Err(why);
            }
        };
        self.finding(
            Severity::Pass,
            "pair.connect",
            format!(
                "listen/connect/accept through the plugin in {:.0} ms",
                start.elapsed().as_secs_f64() * 1e3
            ),
        );
        let mut sbuf = vec![0u8; BW_SIZE];
        let mut rbuf = vec![0u8; BW_SIZE];
        let smh = net.reg_mr(sc, &mut sbuf);
        let rmh = net.reg_mr(rc, &mut rbuf);
        match (smh, rmh) {
            (Ok(smh), Ok(rmh)) => Ok(Comms {
                sc,
                rc,
                lc,
                sbuf,
                rbuf,
                smh,
                rmh,
            }),
            (smh, rmh) => {
                let why = with_cause(format!(
                    "regMr of {BW_SIZE} bytes of host memory failed (ncclResult {})",
                    smh.err().or(rmh.err()).unwrap_or(0)
                ));
                if let Ok(m) = smh {
                    let _ = net.dereg_mr(sc, m);
                }
                if let Ok(m) = rmh {
                    let _ = net.dereg_mr(rc, m);
                }
                let _ = (net.close_send(sc), net.close_recv(rc), net.close_listen(lc));
                self.finding(Severity::Fail, "pair.data", why.clone()).fix = Some(
                    "see memlock: registrations fail with ENOMEM under a low locked-memory limit"
                        .to_owned(),
                );
                Err(why)
            }
        }
    }

    fn exercise(
        &mut self,
        comms: &mut Comms,
        l: &CardDevice,
        r: &CardDevice,
    ) -> Result<(), String> {
        for direction in 0..2 {
            self.verify_host(comms, direction)?;
        }
        self.gpu(comms, l)?;
        for direction in 0..2 {
            self.bandwidth(comms, direction, l, r)?;
        }
        Ok(())
    }

    /// Send each of [`CHECK_SIZES`] one way; the receiver checks size and bytes.
    fn verify_host(&mut self, c: &mut Comms, direction: usize) -> Result<(), String> {
        let net = self.net;
        let d = self.deadline();
        let seed = |k: usize| ((direction as u64) << 32) | k as u64;
        let outcome = if self.sends(direction) {
            CHECK_SIZES
                .iter()
                .enumerate()
                .try_for_each(|(k, &size)| {
                    fill_pattern(seed(k), &mut c.sbuf[..size]);
                    let (sc, smh, sptr) = (c.sc, c.smh, c.sbuf.as_mut_ptr());
                    net.until_started("isend", d, || net.isend_step(sc, sptr, size, 0, smh))
                        .and_then(|req| net.wait(req, d))
                        .map(drop)
                        .map_err(|why| format!("{size} B: {}", with_cause(why)))
                })
                .map(|()| String::new())
        } else {
            receive_checked(net, c, d, &seed)
        };
        self.settle("pair.data", "host memory", direction, outcome)
    }

    /// Agree on one direction's outcome and report it once: the sender reports its own failure
    /// or the receiver's verdict; the receiver sends its verdict and reports it.
    fn settle(
        &mut self,
        check: &'static str,
        memory: &str,
        direction: usize,
        outcome: Result<String, String>,
    ) -> Result<(), String> {
        let verdict = if self.sends(direction) {
            match outcome {
                Err(why) => Err(format!("sending failed: {why}")),
                Ok(_) => {
                    let (ok, detail) = expect(self.ctl, "its verification result", |m| match m {
                        Msg::Verified { ok, detail } => Some((ok, detail)),
                        _ => None,
                    })?;
                    if ok { Ok(detail) } else { Err(detail) }
                }
            }
        } else {
            let (ok, detail) = match &outcome {
                Ok(detail) => (true, detail.clone()),
                Err(why) => (false, why.clone()),
            };
            self.ctl.send(&Msg::Verified { ok, detail })?;
            outcome
        };
        let name = self.direction_name(direction);
        match verdict {
            Ok(detail) => {
                self.finding(Severity::Pass, check, format!("{name}: {memory}, {detail}"));
                Ok(())
            }
            Err(detail) => {
                self.finding(Severity::Fail, check, format!("{name}: {memory}: {detail}"));
                Err(detail)
            }
        }
    }

    /// GPU memory both ways, with `iflush` on the receiver, where both ends register it.
    fn gpu(&mut self, c: &mut Comms, l: &CardDevice) -> Result<(), String> {
        let local = gpu_usable(l);
        self.ctl.send(&Msg::Gpu {
            usable: local.clone().err(),
        })?;
        let remote = expect(self.ctl, "its GPU state", |m| match m {
            Msg::Gpu { usable } => Some(usable),
            _ => None,
        })?;
        if let Some(why) = local.as_ref().err().or(remote.as_ref()) {
            let whose = if local.is_err() {
                "here"
            } else {
                "on the peer"
            };
            self.finding(
                Severity::Skip,
                "pair.gpu",
                format!("GPU memory not checked: {why} ({whose})"),
            );
            return Ok(());
        }
        for direction in 0..2 {
            let outcome = self.gpu_direction(c, direction);
            if let Err(why) = self.settle("pair.gpu", "GPU memory with iflush", direction, outcome)
            {
                if let Some(f) = self.findings.last_mut() {
                    f.fix = Some(
                        "host memory works but GPU memory does not: check gdr.peermem/gdr.dmabuf \
                         on both nodes, ACS on the PCIe path and relaxed ordering in VMs"
                            .to_owned(),
                    );
                }
                return Err(why);
            }
        }
        Ok(())
    }

    fn gpu_direction(&mut self, c: &mut Comms, direction: usize) -> Result<String, String> {
        let net = self.net;
        let d = self.deadline();
        let size = (1 << 20) + 3;
        let seed = (2 + direction as u64) << 32;
        let buffer = DeviceBuffer::alloc(size).map_err(|e| e.to_string())?;
        let comm = if self.sends(direction) { c.sc } else { c.rc };
        let data = buffer.addr() as Ptr;
        let mh = net
            .reg_mr_raw(comm, data, size, NCCL_PTR_CUDA)
            .map_err(|rc| with_cause(format!("regMr of GPU memory failed (ncclResult {rc})")))?;
        let outcome = if self.sends(direction) {
            buffer
                .write(&driver::pattern(seed, size))
                .map_err(|e| e.to_string())?;
            net.until_started("isend", d, || {
                net.isend_step(c.sc, data.cast(), size, 0, mh)
            })
            .and_then(|req| net.wait(req, d))
            .map(|_| String::new())
            .map_err(with_cause)
        } else {
            let received = net
                .until_started("irecv", d, || {
                    net.irecv_step(c.rc, &[(data.cast(), size, 0, mh)])
                })
                .and_then(|req| net.wait(req, d))
                .and_then(|_| {
                    let flush = net
                        .iflush(c.rc, &[(data.cast(), size as i32, mh)])
                        .map_err(|rc| format!("iflush failed (ncclResult {rc})"))?;
                    if !flush.is_null() {
                        net.wait(flush, d)?;
                    }
                    Ok(())
                })
                .map_err(with_cause);
            received.and_then(|()| {
                let mut host = vec![0u8; size];
                buffer.read(&mut host).map_err(|e| e.to_string())?;
                if pattern_at(seed, 0, &host) {
                    Ok(format!("{size} B verified after iflush"))
                } else {
                    Err(format!(
                        "{size} B arrived but differ from what was sent (first wrong byte at {})",
                        first_difference(seed, &host)
                    ))
                }
            })
        };
        let _ = net.dereg_mr(comm, mh);
        outcome
    }
}

/// Whether a device can take part in the GPU check: CUDA works here and the plugin registers
/// GPU memory on it.
fn gpu_usable(device: &CardDevice) -> Result<(), String> {
    nccl_net::cuda::driver().map_err(|e| e.to_string())?;
    if device.memory.contains("cuda") || device.memory.contains("dmabuf") {
        Ok(())
    } else {
        Err(format!(
            "{} registers {} memory only (see gdr.peermem/gdr.dmabuf)",
            device.name, device.memory
        ))
    }
}

/// Receive each of [`CHECK_SIZES`] into the receive buffer and check it.
fn receive_checked(
    net: &Driver,
    c: &mut Comms,
    d: Instant,
    seed: &dyn Fn(usize) -> u64,
) -> Result<String, String> {
    for (k, &size) in CHECK_SIZES.iter().enumerate() {
        let (rc, mh, rptr) = (c.rc, c.rmh, c.rbuf.as_mut_ptr());
        let sizes = net
            .until_started("irecv", d, || net.irecv_step(rc, &[(rptr, BW_SIZE, 0, mh)]))
            .and_then(|req| net.wait(req, d))
            .map_err(|why| {
                format!(
                    "receiving message {k} ({size} B) failed: {}",
                    with_cause(why)
                )
            })?;
        let received = usize::try_from(sizes[0]).unwrap_or(0);
        if received != size {
            return Err(format!(
                "message {k}: {received} bytes arrived, {size} were sent"
            ));
        }
        let bytes = &c.rbuf[..size];
        if !pattern_at(seed(k), 0, bytes) {
            return Err(format!(
                "message {k} ({size} B) differs from what was sent (first wrong byte at {})",
                first_difference(seed(k), bytes)
            ));
        }
    }
    let total: usize = CHECK_SIZES.iter().sum();
    Ok(format!(
        "{} messages ({total} B, 1 B to 4 MiB) verified byte for byte",
        CHECK_SIZES.len()
    ))
}

fn first_difference(seed: u64, got: &[u8]) -> usize {
    let expected = driver::pattern(seed, got.len());
    expected
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len())
}
