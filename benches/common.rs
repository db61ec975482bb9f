//! Shared by the benchmarks: compiling a model, and the peak resident memory
//! of this process.

/// Peak resident set size (VmHWM) of this process in bytes, from /proc.
#[allow(dead_code)]
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[allow(dead_code)]
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Loads `model` and compiles it for `world` ranks (`per_node` per node) on
/// the cluster `preset` with `cfg`.
#[allow(dead_code)]
pub fn compile(
    model: &str,
    preset: &str,
    world: u32,
    per_node: u32,
    cfg: &fsdpc_planner::FsdpConfig,
) -> Result<fsdpc_plan::Plan, String> {
    let cluster = fsdpc_planner::preset(preset, world, per_node).map_err(|e| e.to_string())?;
    compile_for(model, &cluster, cfg)
}

/// Loads `model` and compiles it on `cluster` with `cfg`.
#[allow(dead_code)]
pub fn compile_for(
    model: &str,
    cluster: &fsdpc_plan::Cluster,
    cfg: &fsdpc_planner::FsdpConfig,
) -> Result<fsdpc_plan::Plan, String> {
    let m = fsdpc_frontends::load(model, &fsdpc_frontends::LoadOptions::default())
        .map_err(|e| e.to_string())?;
    let info = fsdpc_plan::ModelInfo {
        name: m.name.clone(),
        params: m.program.graph.param_numel(),
        tokens_per_rank_step: m.tokens_per_rank_step(),
    };
    fsdpc_planner::compile(m.program, info, cluster, cfg).map_err(|e| e.to_string())
}
