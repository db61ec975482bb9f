//! Collectives as the cost model reads them: the kinds, the bytes a rank
//! sends in the ring algorithm, and the fits of times `fsdpc calibrate`
//! measures, which replace the ring formula inside a node.

use serde::{Deserialize, Serialize};

/// A collective kind, as the cost model and calibration name it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    AllGather,
    ReduceScatter,
    AllReduce,
}

impl CollectiveKind {
    /// All kinds, in a fixed order.
    pub const ALL: [CollectiveKind; 3] = [
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllReduce,
    ];

    /// The snake_case name (`all_gather`).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllReduce => "all_reduce",
        }
    }
}

/// An alpha-beta fit of one collective kind over groups of `ranks` ranks
/// inside a node: `time = latency_s + wire_bytes / bw`, or, where the
/// times were measured over sizes that span the caches (`points`), those
/// times interpolated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveFit {
    pub op: CollectiveKind,
    /// Ranks in the group.
    pub ranks: u32,
    /// Fixed cost of one collective, seconds (alpha).
    pub latency_s: f64,
    /// Bytes per second of the ring's per-rank traffic (1 / beta).
    pub bw: f64,
    /// Measured `(wire bytes, seconds)`, wire bytes increasing: when
    /// given, a collective's time is these interpolated linearly in wire
    /// bytes (the first point's time below it, the last segment's slope
    /// beyond the last). On CPUs one line cannot hold both a collective
    /// that stays in the caches and one that streams through memory: the
    /// 2-rank shared-memory all-gather of a 64 MiB unit ran 3-5x slower
    /// than the fit to 4 KiB-4 MiB said (empty in presets and older
    /// files: the fit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<(f64, f64)>,
}

impl CollectiveFit {
    /// The fit of `op` over `ranks` ranks to measured `(wire bytes,
    /// seconds)` points: the points by wire bytes and their least-squares
    /// line (`fit_alpha_beta`).
    pub fn of_points(op: CollectiveKind, ranks: u32, mut points: Vec<(f64, f64)>) -> Self {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (latency_s, bw) = fit_alpha_beta(&points);
        CollectiveFit {
            op,
            ranks,
            latency_s,
            bw,
            points,
        }
    }

    /// Seconds of one collective whose ring traffic is `wire` bytes per
    /// rank.
    pub fn time(&self, wire: f64) -> f64 {
        let p = &self.points;
        if p.len() < 2 {
            return self.latency_s + if self.bw > 0.0 { wire / self.bw } else { 0.0 };
        }
        if wire <= p[0].0 {
            return p[0].1;
        }
        // The segment that holds `wire`, else the last one, extended.
        let w = p
            .windows(2)
            .find(|w| wire <= w[1].0)
            .unwrap_or(&p[p.len() - 2..]);
        let ((x0, t0), (x1, t1)) = (w[0], w[1]);
        let slope = ((t1 - t0) / (x1 - x0).max(f64::MIN_POSITIVE)).max(0.0);
        t0 + (wire - x0) * slope
    }
}

/// Bytes one rank sends in the ring algorithm of `op` over `n` ranks on a
/// buffer of `bytes`: `(n-1)/n bytes`, twice for an all-reduce (what
/// `CollectiveFit` points are keyed by).
pub fn ring_wire_bytes(op: CollectiveKind, n: u32, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let once = f64::from(n - 1) / f64::from(n) * bytes;
    match op {
        CollectiveKind::AllReduce => 2.0 * once,
        _ => once,
    }
}

/// Least-squares fit of `t = a + x / bw` (a >= 0) to `(x, t)` points.
fn fit_alpha_beta(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, st) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, t)| (a + x, b + t));
    let (mx, mt) = (sx / n, st / n);
    let (mut sxx, mut sxt) = (0.0, 0.0);
    for (x, t) in points {
        sxx += (x - mx) * (x - mx);
        sxt += (x - mx) * (t - mt);
    }
    let slope = if sxx > 0.0 { sxt / sxx } else { 0.0 };
    if slope <= 0.0 {
        // Flat or noisy: all latency, bandwidth from the largest point.
        let (x, t) = points.last().copied().unwrap_or((1.0, 1.0));
        return (0.0, x / t.max(1e-12));
    }
    let a = mt - slope * mx;
    if a < 0.0 {
        // Through the origin.
        let sxx0: f64 = points.iter().map(|(x, _)| x * x).sum();
        let sxt0: f64 = points.iter().map(|(x, t)| x * t).sum();
        return (0.0, sxx0 / sxt0.max(1e-300));
    }
    (a, 1.0 / slope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_collective_points_are_interpolated() {
        let mut f = CollectiveFit {
            op: CollectiveKind::AllGather,
            ranks: 2,
            latency_s: 1.0,
            bw: 10.0,
            points: Vec::new(),
        };
        assert_eq!(f.time(100.0), 11.0, "no points: the fit");
        f.points = vec![(10.0, 2.0), (110.0, 4.0), (210.0, 10.0)];
        assert_eq!(f.time(1.0), 2.0, "below the first point: its time");
        assert!((f.time(60.0) - 3.0).abs() < 1e-12);
        assert!((f.time(160.0) - 7.0).abs() < 1e-12);
        // Beyond the last: the last segment's slope (6 s per 100 bytes).
        assert!((f.time(310.0) - 16.0).abs() < 1e-12);
    }

    #[test]
    fn the_fit_recovers_a_line_and_never_gives_a_negative_latency() {
        // t = 10 us + x / 2 GB/s.
        let pts: Vec<(f64, f64)> = [1e3, 1e5, 1e6, 1e7]
            .iter()
            .map(|&x| (x, 1e-5 + x / 2e9))
            .collect();
        let (a, bw) = fit_alpha_beta(&pts);
        assert!(
            (a - 1e-5).abs() < 1e-12 && (bw - 2e9).abs() < 1.0,
            "{a} {bw}"
        );
        // Points a positive-latency line fits only with a < 0 go through
        // the origin instead.
        let (a, bw) = fit_alpha_beta(&[(1e6, 1e-4), (2e6, 3e-4), (3e6, 5e-4)]);
        assert_eq!(a, 0.0);
        assert!(bw > 0.0, "{bw}");
        // Flat: all latency, the bandwidth of the largest point.
        let (a, bw) = fit_alpha_beta(&[(1e3, 1e-4), (1e6, 1e-4)]);
        assert_eq!((a, bw), (0.0, 1e6 / 1e-4));
    }
}
