//! nccl-net-doctor: what is wrong with this node, or with a pair of nodes, for NCCL over this
//! plugin; one line per finding, worst first, from the plugin's own decisions.
//!
//! Exit codes: 0 no FAIL (WARN allowed), 1 at least one FAIL (or, with `--strict`, an UNKNOWN:
//! a check that could not be measured), 2 the doctor could not run (bad arguments, the peer
//! never came). `nccl-net-doctor --help` lists the options.

mod card;
mod pair;
mod report;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use nccl_net::doctor::{
    CHECKS, DeviceRow, Expected, Finding, NodeFacts, Roots, device_rows, node_checks, worst_first,
};
use nccl_net::driver::Library;
use nccl_net::plugin::{GpuFacts, probe_dmabuf_live};
use nccl_net::topology::GidEntry;
use nccl_net::transport::{choose_oob_address, oob_settings};
use nccl_net::verbs;

use crate::card::node_card;
use crate::pair::PairOptions;
use crate::report::Colour;

/// Check this node (default), or a pair of nodes, for NCCL over the RsIB plugin.
#[derive(Debug, Parser)]
#[command(
    name = "nccl-net-doctor",
    version,
    after_help = "Exit codes: 0 no FAIL, 1 a FAIL (with --strict: or an UNKNOWN), 2 could not run."
)]
struct Args {
    /// Print one JSON object (see --schema) instead of the table and lines.
    #[arg(long)]
    json: bool,
    /// Print the JSON schema of --json and exit.
    #[arg(long)]
    schema: bool,
    /// List the check ids and exit.
    #[arg(long)]
    list_checks: bool,
    /// Exit code 1 on UNKNOWN too (a check that could not be measured, e.g. ACS or the kernel's
    /// log without root): a gate that admits only nodes every check could judge.
    #[arg(long)]
    strict: bool,
    /// Peer connections (a send and a receive comm each) one process is expected to hold: the
    /// memlock budget.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    connections: u64,
    /// Peers one process talks to point to point (an all-to-all over N ranks: N - 1): the
    /// memlock budget for N x NCCL_NCHANNELS_PER_NET_PEER (default 2) connections, instead of
    /// --connections.
    #[arg(long, value_name = "N", conflicts_with = "connections",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    peers: Option<u64>,
    /// Serve a pair check on ADDR:PORT and wait for `--peer`; without ADDR, on the address the
    /// plugin's own listeners use (its out-of-band address for the first member of `--dev`,
    /// default device 0), port 18515 unless given.
    #[arg(long, value_name = "[ADDR:]PORT", num_args = 0..=1, default_missing_value = "",
          conflicts_with_all = ["peer", "loopback"])]
    serve: Option<String>,
    /// Run a pair check against a node running `--serve`.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "loopback")]
    peer: Option<String>,
    /// Run the pair check on this node alone: each device to itself (does not exercise the
    /// cable or the switch).
    #[arg(long)]
    loopback: bool,
    /// Pair check: only this NCCL device index (default: every device, i to i).
    #[arg(long, value_name = "INDEX")]
    dev: Option<usize>,
    /// Pair check: seconds of bandwidth measurement per direction.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Pair check: seconds to wait for the peer and for each step.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Pair check: drive this plugin library instead of the plugin built into the doctor.
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Colour the severities.
    #[arg(long, value_enum, default_value_t = Colour::Auto)]
    color: Colour,
}

/// Write the report to stdout. A reader that went away (`| head`, `| grep -q`) is not an
/// error of the doctor: the verdict is the exit code, which stays what the checks decided.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The doctor could not reach a verdict: say why, in JSON too when asked, and exit 2.
fn could_not_run(args: &Args, why: &str) -> ExitCode {
    if args.json {
        let doc = serde_json::json!({
            "schema_version": report::SCHEMA_VERSION,
            "tool": {"name": "nccl-net-doctor", "version": env!("CARGO_PKG_VERSION")},
            "overall": "UNKNOWN",
            "exit_code": 2,
            "error": why,
            "findings": [],
        });
        emit(&format!("{doc}\n"));
    }
    eprintln!("nccl-net-doctor: could not run: {why}");
    ExitCode::from(2)
}

/// The port `--serve` listens on when none is given.
const SERVE_PORT: u16 = 18515;

/// Where `--serve` listens: `ADDR:PORT` as given; a bare `PORT`, or nothing, on the
/// out-of-band address the plugin would use for device `dev`'s first member (never every
/// interface: the pair check carries no authentication).
fn serve_address(
    given: &str,
    facts: &NodeFacts,
    rows: &[DeviceRow],
    dev: Option<usize>,
) -> Result<String, String> {
    let port = if given.is_empty() {
        SERVE_PORT
    } else if let Ok(port) = given.parse::<u16>() {
        port
    } else {
        return Ok(given.to_owned());
    };
    // The first member's RoCE GID; an InfiniBand port (or none) goes by NCCL's rule.
    let gid = rows
        .get(dev.unwrap_or(0))
        .and_then(|row| row.members.first())
        .and_then(|m| m.gid.clone())
        .and_then(Result::ok)
        .unwrap_or(GidEntry {
            index: 0,
            gid: [0; 16],
            roce_version: None,
            netdev: None,
        });
    let interfaces = verbs::interface_addrs().map_err(|e| e.to_string())?;
    let oob = choose_oob_address(&interfaces, &oob_settings(&facts.config), &gid)
        .map_err(|why| format!("no address to serve on: {why}; give --serve ADDR:PORT"))?;
    eprintln!("nccl-net-doctor: serving on the out-of-band address {oob}");
    Ok(std::net::SocketAddr::new(oob.addr, port).to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.schema {
        emit(report::SCHEMA);
        return ExitCode::SUCCESS;
    }
    if args.list_checks {
        let list: String = CHECKS
            .iter()
            .map(|(id, what)| format!("{id:<18} {what}\n"))
            .collect();
        emit(&list);
        return ExitCode::SUCCESS;
    }
    if !(args.seconds > 0.0 && args.seconds <= 600.0) {
        return could_not_run(&args, "--seconds must be in (0, 600]");
    }
    let roots = Roots::default();
    let env = |name: &str| -> Option<OsString> { std::env::var_os(name) };
    let facts = NodeFacts::gather(
        roots.clone(),
        &env,
        verbs::discover_ports(),
        GpuFacts::probe(&roots.sysfs(), &roots.at("/proc")),
        &probe_dmabuf_live,
        &|name: &str| Library::open(name.as_bytes()).map(|lib| lib.exports()),
        args.peers
            .map_or(Expected::Connections(args.connections), Expected::Peers),
    );
    let rows = device_rows(&facts);
    let host = host_name();
    let card = node_card(&facts, &rows, &host);
    let options = PairOptions {
        seconds: args.seconds,
        timeout: Duration::from_secs(args.timeout),
        dev: args.dev,
        plugin: args.plugin.clone(),
    };
    let (mode, outcome) = if let Some(given) = &args.serve {
        let addr = match serve_address(given, &facts, &rows, args.dev) {
            Ok(addr) => addr,
            Err(why) => return could_not_run(&args, &why),
        };
        ("serve", Some(pair::serve(&addr, &card, &roots, &options)))
    } else if let Some(addr) = &args.peer {
        ("peer", Some(pair::peer(addr, &card, &roots, &options)))
    } else if args.loopback {
        ("loopback", Some(pair::loopback(&card, &roots, &options)))
    } else {
        ("node", None)
    };
    let (mut findings, peer): (Vec<Finding>, _) = match outcome {
        None => (node_checks(&facts), None),
        Some(Ok(o)) => (o.findings, o.peer),
        Some(Err(why)) => return could_not_run(&args, &why),
    };
    worst_first(&mut findings);
    if args.json {
        emit(&format!(
            "{}\n",
            report::json(mode, &facts, &card, peer.as_ref(), &findings, args.strict)
        ));
    } else {
        let header = format!(
            "nccl-net-doctor {} ({} plugin) on {host} ({}): {} check",
            env!("CARGO_PKG_VERSION"),
            nccl_net::plugin::PLUGIN_NAME,
            facts.context.kind(),
            if mode == "node" { "node" } else { "pair" }
        );
        emit(&report::human(
            &header,
            &card,
            peer.as_ref(),
            &findings,
            args.color,
        ));
    }
    ExitCode::from(u8::try_from(report::exit_code(&findings, args.strict)).unwrap_or(1))
}
