//! `--interleave PATH`: two plugins in the same two processes, measured in blocks that
//! alternate between them (A B, B A, A B, ...). On a shared host whose speed drifts by a factor
//! of two within seconds (an emulated CPU beside other tenants), separate runs of the two
//! plugins meet different moments and their ratio is noise; the two blocks of a pair run
//! milliseconds apart, so the ratio within each pair compares the plugins, and the median over
//! the pairs is robust to the bursts that still hit one block of a pair.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use super::{
    CallClock, Control, Options, bw_iters, lat_iters, progress, setup, sizes, verified_cell, warmup,
};

/// One size: per plugin (A, B), each block's bandwidth (MB/s) and one-way latency (µs), in the
/// order the blocks ran.
#[derive(Debug)]
pub(super) struct Row {
    size: usize,
    bw: [Vec<f64>; 2],
    lat: [Vec<f64>; 2],
    pub(super) verified: Option<bool>,
}

/// A plugin as rank 0 ran it.
#[derive(Debug)]
struct Side {
    path: String,
    name: String,
    abi: u8,
    device: String,
}

/// What rank 0 prints.
#[derive(Debug)]
pub(super) struct Report {
    sides: [Side; 2],
    pub(super) rows: Vec<Row>,
}

/// The 25th, 50th and 75th percentiles of `values` (linear between neighbours).
fn quartiles(values: &[f64]) -> [f64; 3] {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |p: f64| {
        let Some(last) = sorted.len().checked_sub(1) else {
            return f64::NAN;
        };
        let x = p * last as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo as f64)
    };
    [at(0.25), at(0.5), at(0.75)]
}

/// The ratio A/B of each block pair.
fn ratios(pairs: &[Vec<f64>; 2]) -> Vec<f64> {
    pairs[0].iter().zip(&pairs[1]).map(|(a, b)| a / b).collect()
}

/// Which plugin runs first in block pair `block`: A in even pairs, B in odd ones, so that
/// neither always follows the other.
fn order(block: usize) -> [usize; 2] {
    if block.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Both plugins connected (A first, then B, each over the same rendezvous), every size's
/// blocks, then both closed.
pub(super) fn run_rank(
    o: &Options,
    other: &Path,
    rank0: bool,
    mut ctl: Control,
) -> Result<Report, String> {
    let mut eps = [setup(o, &o.plugin, &mut ctl)?, setup(o, other, &mut ctl)?];
    let blocks = o.blocks as usize;
    let untimed = CallClock::default();
    let all = sizes(o);
    let mut rows = Vec::with_capacity(all.len());
    for (k, &size) in all.iter().enumerate() {
        progress(o, rank0, Some((k, all.len(), size)));
        let seed = (k as u64) << 32;
        let (per_block, rounds) = (
            (bw_iters(o, size) / blocks).max(o.window()),
            (lat_iters(o, size) / blocks).max(1),
        );
        let ping_warmup = warmup(o, rounds * blocks);
        for ep in &mut eps {
            ctl.barrier()?;
            ep.warm_up(o, rank0, size, per_block * blocks, seed)?;
            if ping_warmup > 0 {
                ctl.barrier()?;
                ep.ping_pong(rank0, size, ping_warmup, o.ping(), &untimed, &mut ctl)?;
            }
        }
        let mut row = Row {
            size,
            bw: [Vec::new(), Vec::new()],
            lat: [Vec::new(), Vec::new()],
            verified: None,
        };
        let mut verified = true;
        for block in 0..blocks {
            for p in order(block) {
                ctl.barrier()?;
                let t0 = Instant::now();
                // Each block's payloads differ from every earlier block's.
                let first = seed + (block * per_block) as u64;
                verified &= eps[p].stream(o, rank0, size, per_block, first)?;
                let seconds = t0.elapsed().as_secs_f64();
                row.bw[p].push((size * per_block) as f64 / seconds / 1e6);
            }
        }
        for block in 0..blocks {
            for p in order(block) {
                ctl.barrier()?;
                let one_way =
                    eps[p].ping_pong(rank0, size, rounds, o.ping(), &untimed, &mut ctl)?;
                row.lat[p].push(one_way);
            }
        }
        if rank0 {
            let recv_ok = ctl.recv::<1>()?[0] == 1;
            row.verified = o.verify.then_some(verified && recv_ok);
            rows.push(row);
        } else {
            ctl.send(&[u8::from(verified)])?;
        }
    }
    progress(o, rank0, None);
    let [a, b] = eps;
    let side = |path: &Path, (name, abi, device): (String, u8, String)| Side {
        path: path.display().to_string(),
        name,
        abi,
        device,
    };
    Ok(Report {
        sides: [side(&o.plugin, a.close()), side(other, b.close())],
        rows,
    })
}

impl Report {
    pub(super) fn print_table(&self, o: &Options) {
        for (letter, s) in ["A", "B"].iter().zip(&self.sides) {
            println!(
                "# nccl-net-bench: {letter} = plugin {} ({}, ncclNet v{}), device {}",
                s.path, s.name, s.abi, s.device
            );
        }
        println!(
            "# interleaved: {} blocks per size and phase, A B then B A in turn; {} in flight, \
             ping-pong receives {}, verify {}; per plugin the median block, and the ratio A/B \
             of each block pair: median [quartiles]",
            o.blocks,
            o.inflight,
            o.ping().name(),
            if o.verify { "on" } else { "off" },
        );
        println!(
            "{:>10} {:>10} {:>10} {:>22} {:>9} {:>9} {:>22} {:>8}",
            "size(B)", "A MB/s", "B MB/s", "bw A/B", "A lat", "B lat", "lat A/B", "verified"
        );
        let ratio = |r: [f64; 3]| format!("{:.3} [{:.3}, {:.3}]", r[1], r[0], r[2]);
        for r in &self.rows {
            println!(
                "{:>10} {:>10.2} {:>10.2} {:>22} {:>9.2} {:>9.2} {:>22} {:>8}",
                r.size,
                quartiles(&r.bw[0])[1],
                quartiles(&r.bw[1])[1],
                ratio(quartiles(&ratios(&r.bw))),
                quartiles(&r.lat[0])[1],
                quartiles(&r.lat[1])[1],
                ratio(quartiles(&ratios(&r.lat))),
                verified_cell(r.verified)
            );
        }
    }

    pub(super) fn print_json(&self, o: &Options) {
        let side =
            |s: &Side| json!({"plugin": s.path, "name": s.name, "abi": s.abi, "device": s.device});
        let spread = |r: [f64; 3]| json!({"q1": r[0], "median": r[1], "q3": r[2]});
        let results: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                let medians = |b: &[Vec<f64>; 2]| [quartiles(&b[0])[1], quartiles(&b[1])[1]];
                json!({
                    "size": r.size,
                    "bw_mb_per_s": medians(&r.bw),
                    "lat_us": medians(&r.lat),
                    "bw_ratio": spread(quartiles(&ratios(&r.bw))),
                    "lat_ratio": spread(quartiles(&ratios(&r.lat))),
                    "blocks": {"bw_mb_per_s": r.bw, "lat_us": r.lat},
                    "verified": r.verified,
                })
            })
            .collect();
        let doc = json!({
            "a": side(&self.sides[0]),
            "b": side(&self.sides[1]),
            "blocks": o.blocks,
            "inflight": o.inflight,
            "ping": o.ping().name(),
            "warmup": o.warmup,
            "results": results,
        });
        println!("{doc}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_interpolate_between_neighbours() {
        assert_eq!(quartiles(&[3.0, 1.0, 2.0]), [1.5, 2.0, 2.5]);
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]), [2.0, 3.0, 4.0]);
        assert_eq!(quartiles(&[7.0]), [7.0; 3]);
        assert!(quartiles(&[]).iter().all(|q| q.is_nan()));
    }

    #[test]
    fn block_pairs_alternate_which_plugin_goes_first() {
        assert_eq!(
            (0..4).map(order).collect::<Vec<_>>(),
            [[0, 1], [1, 0], [0, 1], [1, 0]]
        );
    }

    #[test]
    fn ratios_pair_blocks_of_the_same_index() {
        assert_eq!(ratios(&[vec![2.0, 3.0], vec![4.0, 1.5]]), [0.5, 2.0]);
    }
}
