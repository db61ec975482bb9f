//! Hopper collectives inside an 8-GPU NVLink node, as XLA measured them:
//! the `sm_90` entries of `kDefaultCollectivePTable`
//! (`third_party/xla/xla/service/gpu/model/collective_interpolator_data.h`
//! in tensorflow/tensorflow at 18c005b3ace1fbd8f5e31695126464c628e50bb3, written by
//! XLA's `collective_perf_table_gen`). Each entry is one f32 collective
//! over the groups of an 8-GPU host (one group of 8, two of 4 or four of
//! 2, all running at once), timed as the median of 5 runs, with
//! `network_throughput_bytes_per_sec` the full tensor's bytes (an
//! all-gather's output, a reduce-scatter's input, an all-reduce's buffer)
//! over that time (`GetNetworkThroughputBytesPerSec`); the tensors double
//! from 1 KiB to 2 GiB. XLA names the GPU only by its compute capability;
//! the rates (an all-gather over 8 moving 352 GB/s of bus bandwidth at
//! 2 GiB) are an NVLink4 SXM part's, an H100 or an H200.
//!
//! Below a few hundred kilobytes the times are about 30 us whatever the
//! size: XLA's launch of one executable, more than NCCL's own latency.
//! An FSDP unit's collectives are megabytes and more.

use fsdpc_plan::cluster::{ring_wire_bytes, CollectiveFit, CollectiveKind};

/// Where `fits` comes from, for the preset's `sources`.
pub(super) const SOURCE: &str = "published: XLA's measured collective table for sm_90 (f32, an 8-GPU NVLink host, groups of 8, 4 and 2 running at once, 1 KiB to 2 GiB, the median of 5 runs; tensorflow/tensorflow 18c005b3ace1fbd8f5e31695126464c628e50bb3, third_party/xla/xla/service/gpu/model/collective_interpolator_data.h), as (ring wire bytes, seconds) points";

/// An entry as the source lists it: the instruction's one dimension (f32
/// elements; a reduce-scatter's output) and
/// `network_throughput_bytes_per_sec`.
type Entry = (u64, u64);

/// The source's entries by kind and ranks per group, sizes increasing.
const TABLE: [(CollectiveKind, u32, [Entry; 22]); 9] = [
    (
        CollectiveKind::AllGather,
        8,
        [
            (256, 32064128),
            (512, 58447488),
            (1024, 140814081),
            (2048, 162539682),
            (4096, 532224532),
            (8192, 1777777777),
            (16384, 3524956970),
            (32768, 4437703141),
            (65536, 7953398058),
            (131072, 27443886097),
            (262144, 33677286742),
            (524288, 66264914054),
            (1048576, 88983027834),
            (2097152, 128944417117),
            (4194304, 204003112840),
            (8388608, 259355923818),
            (16777216, 314227150134),
            (33554432, 343936367363),
            (67108864, 368082843352),
            (134217728, 385603346434),
            (268435456, 393268230936),
            (536870912, 401897616481),
        ],
    ),
    (
        CollectiveKind::AllGather,
        4,
        [
            (256, 15873015),
            (512, 104746317),
            (1024, 225749559),
            (2048, 275565123),
            (4096, 1160997732),
            (8192, 2343249427),
            (16384, 4729792147),
            (32768, 7262411347),
            (65536, 12720496894),
            (131072, 32125490196),
            (262144, 51200000000),
            (524288, 73388577827),
            (1048576, 99447647951),
            (2097152, 147936794582),
            (4194304, 239729309556),
            (8388608, 296124258683),
            (16777216, 342671895424),
            (33554432, 383321513434),
            (67108864, 402872346556),
            (134217728, 423399772870),
            (268435456, 434192960662),
            (536870912, 443094410881),
        ],
    ),
    (
        CollectiveKind::AllGather,
        2,
        [
            (256, 18593840),
            (512, 134736842),
            (1024, 209492635),
            (2048, 709141274),
            (4096, 1406593406),
            (8192, 2813186813),
            (16384, 5535135135),
            (32768, 7876923076),
            (65536, 20739240506),
            (131072, 35158798283),
            (262144, 59795620437),
            (524288, 82022528160),
            (1048576, 136818371607),
            (2097152, 208547334924),
            (4194304, 277989395546),
            (8388608, 347901791639),
            (16777216, 416680309954),
            (33554432, 454420801733),
            (67108864, 488704223711),
            (134217728, 511594072086),
            (268435456, 537782991954),
            (536870912, 549964466006),
        ],
    ),
    (
        CollectiveKind::ReduceScatter,
        8,
        [
            (32, 47904191),
            (64, 55220017),
            (128, 136606189),
            (256, 277657266),
            (512, 497570456),
            (1024, 822489959),
            (2048, 1740016992),
            (4096, 5859799713),
            (8192, 9173572228),
            (16384, 12681114551),
            (32768, 51280125195),
            (65536, 60963720930),
            (131072, 117658886894),
            (262144, 141470048569),
            (524288, 193750184774),
            (1048576, 251276300023),
            (2097152, 306960187353),
            (4194304, 326151166407),
            (8388608, 348118354981),
            (16777216, 358832552668),
            (33554432, 367611030160),
            (67108864, 376090719201),
        ],
    ),
    (
        CollectiveKind::ReduceScatter,
        4,
        [
            (64, 28243601),
            (128, 51990251),
            (256, 160200250),
            (512, 343163538),
            (1024, 537250786),
            (2048, 722143864),
            (4096, 4511013215),
            (8192, 3602462620),
            (16384, 17031185031),
            (32768, 18265328874),
            (65536, 36008791208),
            (131072, 93090909090),
            (262144, 98847662141),
            (524288, 153210987726),
            (1048576, 240388812471),
            (2097152, 271581455581),
            (4194304, 299037786967),
            (8388608, 331854102381),
            (16777216, 346765656649),
            (33554432, 360350874178),
            (67108864, 371222516014),
            (134217728, 383183624061),
        ],
    ),
    (
        CollectiveKind::ReduceScatter,
        2,
        [
            (128, 11838697),
            (256, 154216867),
            (512, 342245989),
            (1024, 725212464),
            (2048, 1142857142),
            (4096, 867796610),
            (8192, 3605633802),
            (16384, 6942372881),
            (32768, 8933478735),
            (65536, 26047694753),
            (131072, 66737270875),
            (262144, 68266666666),
            (524288, 132262361251),
            (1048576, 196509745127),
            (2097152, 246607714016),
            (4194304, 266001014713),
            (8388608, 303847000869),
            (16777216, 330312175145),
            (33554432, 347397523501),
            (67108864, 365819545593),
            (134217728, 389556301155),
            (268435456, 410431685299),
        ],
    ),
    (
        CollectiveKind::AllReduce,
        8,
        [
            (256, 20765736),
            (512, 56939501),
            (1024, 125984251),
            (2048, 253968253),
            (4096, 471889400),
            (8192, 870008496),
            (16384, 1650282030),
            (32768, 3289959839),
            (65536, 10014669926),
            (131072, 12593389700),
            (262144, 20189772027),
            (524288, 36612290502),
            (1048576, 61077353215),
            (2097152, 80117359413),
            (4194304, 115481938325),
            (8388608, 148544553052),
            (16777216, 176691549414),
            (33554432, 200281921497),
            (67108864, 212665939916),
            (134217728, 220787703321),
            (268435456, 227444546849),
            (536870912, 229968237690),
        ],
    ),
    (
        CollectiveKind::AllReduce,
        4,
        [
            (256, 13787160),
            (512, 90523338),
            (1024, 127617148),
            (2048, 228980322),
            (4096, 519796954),
            (8192, 1400820793),
            (16384, 3631205673),
            (32768, 5031941031),
            (65536, 13107200000),
            (131072, 12328066215),
            (262144, 24129602356),
            (524288, 35463203463),
            (1048576, 70888047593),
            (2097152, 98698795180),
            (4194304, 109821533305),
            (8388608, 153772693943),
            (16777216, 170016376165),
            (33554432, 181823478411),
            (67108864, 189098712833),
            (134217728, 193319306331),
            (268435456, 198288807469),
            (536870912, 201566254276),
        ],
    ),
    (
        CollectiveKind::AllReduce,
        2,
        [
            (256, 8344198),
            (512, 122137404),
            (1024, 221837088),
            (2048, 254726368),
            (4096, 676354029),
            (8192, 2285714285),
            (16384, 4302521008),
            (32768, 7816793893),
            (65536, 16031311154),
            (131072, 27125827814),
            (262144, 50027480916),
            (524288, 47524292965),
            (1048576, 97234421364),
            (2097152, 115076382791),
            (4194304, 165913924050),
            (8388608, 178663486113),
            (16777216, 203192713884),
            (33554432, 216201237113),
            (67108864, 227204246905),
            (134217728, 232468006096),
            (268435456, 242242337131),
            (536870912, 250289469463),
        ],
    ),
];

/// The full tensor of an entry, bytes: the dimension's f32 elements, times
/// the group for a reduce-scatter (whose dimension is its output's).
fn tensor_bytes(op: CollectiveKind, ranks: u32, dim: u64) -> f64 {
    let elements = match op {
        CollectiveKind::ReduceScatter => dim * u64::from(ranks),
        _ => dim,
    };
    (elements * 4) as f64
}

/// The table as the cost model reads it: per kind and group size, the
/// measured time at each entry's ring wire bytes.
pub(super) fn fits() -> Vec<CollectiveFit> {
    TABLE
        .iter()
        .map(|(op, ranks, entries)| {
            let points = entries
                .iter()
                .map(|&(dim, throughput)| {
                    let bytes = tensor_bytes(*op, *ranks, dim);
                    (
                        ring_wire_bytes(*op, *ranks, bytes),
                        bytes / throughput as f64,
                    )
                })
                .collect();
            CollectiveFit::of_points(*op, *ranks, points)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_doubles_from_1_kib_to_2_gib_in_every_group() {
        for (op, ranks, entries) in &TABLE {
            let sizes: Vec<f64> = entries
                .iter()
                .map(|&(dim, _)| tensor_bytes(*op, *ranks, dim))
                .collect();
            let expected: Vec<f64> = (0..22).map(|i| f64::from(1024u32) * 2f64.powi(i)).collect();
            assert_eq!(sizes, expected, "{op:?} over {ranks}");
        }
    }

    #[test]
    fn a_2_gib_all_gather_over_8_takes_what_xla_measured() {
        // 2^31 B at 401,897,616,481 B/s: 5.343 ms, a bus bandwidth of
        // 7/8 of 2^31 B over that, 352 GB/s; priced as the cost model
        // prices a collective inside one node of either Hopper preset.
        for name in ["h100-80g-ib", "h200-141g-ib"] {
            let cluster = crate::presets::preset(name, 8, None).unwrap();
            let time = |bytes: f64| {
                crate::cost::ring_collective_time(CollectiveKind::AllGather, 8, 1, bytes, &cluster)
            };
            let bytes = 2f64.powi(31);
            let t = time(bytes);
            assert!((t - 5.3434e-3).abs() < 1e-6, "{name}: {t}");
            let bus = 7.0 / 8.0 * bytes / t;
            assert!((bus / 1e9 - 351.7).abs() < 0.1, "{name}: {bus}");
            // Between entries: between their times.
            let (t1, mid, t2) = (
                time(2f64.powi(26)),
                time(1.5 * 2f64.powi(26)),
                time(2f64.powi(27)),
            );
            assert!(t1 < mid && mid < t2, "{name}: {t1} {mid} {t2}");
        }
    }

    #[test]
    fn the_table_survives_the_cluster_file() {
        // `fsdpc cluster h100-80g-ib -o FILE` writes the points, and the
        // file reads back as the preset, its source named.
        let cluster = crate::presets::described("h100-80g-ib", 8, 8).unwrap();
        let text = cluster.to_file(false);
        let back = fsdpc_plan::cluster::Cluster::from_file(&text, Some(8), None).unwrap();
        assert_eq!(back.hardware.collective_fits, fits());
        assert_eq!(
            back.sources.get("collective_fits").map(String::as_str),
            Some(SOURCE)
        );
    }

    #[test]
    fn every_kind_and_group_has_its_fit() {
        let fits = fits();
        for op in CollectiveKind::ALL {
            for ranks in [2, 4, 8] {
                let n = fits
                    .iter()
                    .filter(|f| f.op == op && f.ranks == ranks)
                    .count();
                assert_eq!(n, 1, "{op:?} over {ranks}");
            }
        }
        assert!(fits.iter().all(|f| f.points.len() == 22 && f.bw > 0.0));
    }
}
