//! `cluster_file` on made-up measurements.

use super::*;

fn base() -> Cluster {
    let mut c = Cluster {
        name: "h200-141g-ib".into(),
        world: 8,
        ranks_per_node: 8,
        memory_bytes: 141 << 30,
        hardware: Default::default(),
        description: "8x H200-SXM-141GB per node, NVLink4 inside".into(),
        sources: Default::default(),
        kernels: Default::default(),
    };
    let h = &mut c.hardware;
    h.peak_flops_f32 = 67e12;
    h.peak_flops_bf16 = 1000e12;
    h.mem_bw = 4.8e12;
    h.intra_bw = 450e9;
    h.intra_latency_s = 6e-6;
    h.inter_bw = 50e9;
    h.inter_latency_s = 10e-6;
    h.host_bw = 50e9;
    h.host_mem_bw = 20e9;
    c
}

/// Measurements of a made-up GPU: products at 500 TFLOP/s (400 when
/// transposed), skinny ones at 50, attention at 300/200, kernels at
/// 4 TB/s, a 5 us overhead, collectives on a 10 us + wire / 400 GB/s line.
fn measured(gpus: usize) -> GpuMeasurements {
    let mut m = GpuMeasurements {
        device: "NVIDIA H200".into(),
        gpus,
        total_bytes: 141 << 30,
        context_bytes: 530 << 20,
        cublas_handle_bytes: 8 << 20,
        nccl_comm_bytes: (gpus > 1).then_some(200 << 20),
        overhead_s: 5e-6,
        ..Default::default()
    };
    for &s in &PRODUCTS {
        for &t in &LAYOUTS {
            let r = if t == (false, false) { 500e12 } else { 400e12 };
            let flops = 2.0 * (s.0 * s.1 * s.2) as f64;
            m.products.push(ProductTime {
                shape: s,
                trans: t,
                seconds: flops / r,
            });
        }
    }
    for w in [16, 64] {
        for (_, s) in skinny_shapes(w) {
            let flops = 2.0 * (s.0 * s.1 * s.2) as f64;
            m.skinny.push(ProductTime {
                shape: s,
                trans: (false, false),
                seconds: flops / if w == 16 { 50e12 } else { 150e12 },
            });
        }
    }
    for &case in &ATTENTION {
        m.attention.push(AttentionTime {
            case,
            forward_flops: 3e12,
            backward_flops: 7.5e12,
            forward_s: 3e12 / 300e12,
            backward_s: 7.5e12 / 200e12,
        });
    }
    for f in FAMILIES {
        for fam in [f.to_string(), format!("{f}:bf16")] {
            let bytes = 256.0 * (1 << 20) as f64;
            m.kernels.push(KernelTime {
                family: fam,
                bytes,
                seconds: bytes / 4e12,
            });
        }
    }
    if gpus > 1 {
        for op in CollectiveKind::ALL {
            for &b in &COLLECTIVE_BYTES {
                let wire = ring_wire_bytes(op, gpus as u32, b as f64);
                m.collectives.push(CollectiveTime {
                    op,
                    ranks: gpus as u32,
                    bytes: b,
                    seconds: 10e-6 + wire / 400e9,
                });
            }
        }
    }
    m
}

#[test]
fn measured_rates_become_the_files_figures_over_its_peak() {
    let (f, table) = cluster_file(base(), &measured(8), "2026-12-04");
    let h = &f.hardware;
    assert_eq!(f.name, "calibrated");
    assert!(
        f.description
            .ends_with("what was not measured is the h200-141g-ib preset's"),
        "{}",
        f.description
    );
    assert_eq!(h.peak_flops_bf16, 1000e12, "the datasheet peak stays");
    // Rate = peak x efficiency = what was measured, per layout.
    let big =
        |c: &[(f64, f64)]| -> Vec<f64> { c.iter().filter(|p| p.0 >= 1e10).map(|p| p.1).collect() };
    let nn = big(&h.matmul_curves["square:nn"]);
    assert!(
        nn.len() >= 6 && nn.iter().all(|e| (e - 0.5).abs() < 1e-9),
        "{nn:?}"
    );
    assert!(big(&h.matmul_curves["square:tt"])
        .iter()
        .all(|e| (e - 0.4).abs() < 1e-9));
    assert!(big(&h.matmul_efficiency)
        .iter()
        .all(|e| (e - 0.425).abs() < 1e-9));
    assert!(h.matmul_curves["square:nn"][0].1 <= 1.0);
    assert!(h.matmul_efficiency.windows(2).all(|w| w[0].0 < w[1].0));
    let at =
        |c: &[(f64, f64)]| -> Vec<f64> { c.iter().filter(|p| p.0 >= 2e9).map(|p| p.1).collect() };
    let skinny = at(&h.skinny_matmul_efficiency);
    assert!(!skinny.is_empty() && skinny.iter().all(|e| (e - 0.05).abs() < 1e-9));
    assert!(at(&h.matmul_curves["rows:nn@64"])
        .iter()
        .all(|e| (e - 0.15).abs() < 1e-9));
    assert!((h.kernel_flops["attention:bf16"] / 300e12 - 1.0).abs() < 1e-9);
    assert!((h.kernel_flops["attention_grad:bf16"] / 200e12 - 1.0).abs() < 1e-9);
    // Kernels: bytes over the time.
    assert!((h.kernel_bw["layer_norm:bf16"] / 4e12 - 1.0).abs() < 1e-9);
    assert!((h.mem_bw / 4e12 - 1.0).abs() < 1e-9);
    assert_eq!(h.kernel_overhead_s, 5e-6);
    assert_eq!(h.context_bytes, 530 << 20);
    // Collectives: the line comes back, all-gather sets intra.
    let ag = h
        .collective_fits
        .iter()
        .find(|c| c.op == CollectiveKind::AllGather)
        .unwrap();
    assert_eq!(ag.ranks, 8);
    assert!((ag.bw / 400e9 - 1.0).abs() < 1e-6, "{}", ag.bw);
    assert!((ag.latency_s - 10e-6).abs() < 1e-9);
    assert_eq!(h.intra_bw, ag.bw);
    assert_eq!(h.collective_fits.len(), 3);
    for k in [
        "matmul_efficiency",
        "kernel_flops",
        "kernel_bw",
        "collective_fits",
        "context_bytes",
    ] {
        assert!(
            f.sources[k].starts_with("fsdpc calibrate --target cuda on NVIDIA H200 (2026-12-04)"),
            "{k}: {}",
            f.sources[k]
        );
    }
    assert!(table.contains("attention"), "{table}");
    // The file reads back as it was written.
    let back = Cluster::from_file(&f.to_file(false), Some(8), None).unwrap();
    assert_eq!(back.hardware.kernel_flops, f.hardware.kernel_flops);
    assert_eq!(back.hardware.context_bytes, f.hardware.context_bytes);
    assert_eq!(back.hardware.collective_fits.len(), 3);
}

#[test]
fn one_gpu_keeps_the_presets_collectives_and_says_so() {
    let b = base();
    let (f, table) = cluster_file(b.clone(), &measured(1), "2026-12-04");
    assert!(f.hardware.collective_fits.is_empty());
    assert_eq!(f.hardware.intra_bw, b.hardware.intra_bw);
    assert!(table.contains("1 GPU here, none measured"), "{table}");
    assert!(!f.sources.contains_key("collective_fits"));
}

#[test]
fn nothing_measured_changes_nothing_but_the_name() {
    let b = base();
    let (f, _) = cluster_file(b.clone(), &GpuMeasurements::default(), "d");
    assert_eq!(f.hardware, b.hardware);
}
