//! Shared by the benchmarks: compiling a model, the peak resident memory
//! of this process, and writing the bench's section of `docs/figures.md`
//! (`figures`).

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

#[allow(dead_code)]
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The configuration the at-scale benches plan with: bf16 parameters and
/// reductions, every unit recomputed, no fit check (so a row that does
/// not fit is still planned and shown as such).
#[allow(dead_code)]
pub fn bf16_recomputed() -> fsdpc_planner::FsdpConfig {
    use fsdpc_ir::DType;
    fsdpc_planner::FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: DType::Bf16,
            reduce_dtype: DType::Bf16,
            activation_checkpointing: fsdpc_plan::CheckpointPolicy::Units,
            ..fsdpc_plan::Settings::default()
        },
        check_fits: false,
        ..fsdpc_planner::FsdpConfig::default()
    }
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

/// Writes this bench's section of `docs/figures.md` when `FSDPC_FIGURES`
/// names a directory (`bash scripts/figures.sh` sets it); call it first in
/// `main`. Without the variable it returns at once and the bench runs as
/// usual.
///
/// With it, the bench runs itself again as a child (the same arguments,
/// `FSDPC_FIGURES` removed), prints what the child prints as it comes, and
/// once the child has succeeded writes `FSDPC_FIGURES/<bench>.md`: a
/// heading, `about`, the command, the date (UTC), the machine and the wall
/// time, then the child's standard output as it was printed. A failing
/// child writes no section; this process exits with the child's status.
/// What the bench measures is unchanged: it runs in the child, whose
/// standard output is a pipe instead of the terminal.
pub fn figures(bench: &str, title: &str, about: &str) {
    use std::io::{BufRead, Write};
    let Some(dir) = std::env::var_os("FSDPC_FIGURES") else {
        return;
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The 1-minute load average: times measured on a busy machine are slower.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let started = std::time::SystemTime::now();
    let clock = std::time::Instant::now();
    let mut child = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args(&args)
        .env_remove("FSDPC_FIGURES")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the bench runs as a child");
    let mut printed = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("the bench's output is text");
        println!("{line}");
        printed.push_str(&line);
        printed.push('\n');
    }
    let status = child.wait().expect("the bench finishes");
    if !status.success() {
        eprintln!("{bench}: the bench failed ({status}); no section written");
        std::process::exit(status.code().unwrap_or(1));
    }
    let seconds = clock.elapsed().as_secs_f64();
    // The command as a person would type it: the FSDPC_ settings it ran
    // with, cargo's arguments left out (`--bench`), the bench's own kept.
    let mut command: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("FSDPC_") && k != "FSDPC_FIGURES")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    command.sort();
    command.push(format!("cargo bench --bench {bench}"));
    let own: Vec<&String> = args.iter().filter(|a| *a != "--bench").collect();
    if !own.is_empty() {
        command.push("--".into());
        command.extend(own.into_iter().cloned());
    }
    let section = format!(
        "## {bench}: {title}\n\n{about}\n\n```sh\n{}\n```\n\nRun {} on {} (load average {load} at the start); it took {}.\n\n```text\n{printed}```\n",
        command.join(" "),
        utc(started),
        machine(),
        duration(seconds),
    );
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("the figures directory");
    let path = dir.join(format!("{bench}.md"));
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(section.as_bytes()))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    eprintln!("{bench}: wrote {}", path.display());
    std::process::exit(0);
}

/// `t` as `YYYY-MM-DD HH:MM UTC`.
fn utc(t: std::time::SystemTime) -> String {
    fsdpc::cli::utc(t)
}

/// The CPU model, the cores this process may use and the memory, from
/// /proc (`unknown` where it cannot be read).
fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("an unknown CPU".to_string(), |(_, v)| v.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = read("/proc/meminfo");
    let memory = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or("unknown memory".to_string(), |kib| {
            format!("{:.1} GiB of memory", kib / (1024.0 * 1024.0))
        });
    format!("{cpu}, {cores} cores, {memory}")
}

/// Seconds as `12.3 s` or `4 min 5 s`.
fn duration(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!("{} min {} s", (s / 60.0) as u64, (s % 60.0) as u64)
    }
}
