//! `fsdpc report` end to end: reports of a small plan and of a real
//! `fsdpc train --trace` run (gpt-mini, 2 ranks, 2 steps) opened in
//! headless Chromium. Checks: the screenshot is a PNG that is not blank
//! where the memory chart and the timeline are (pixel variety), no console
//! message was logged, and in the live DOM the curve and the timeline are
//! drawn (non-empty path, rectangles with a non-empty bounding box). Bad
//! input is a clear error.
//!
//! Chromium is Debian's `chromium` (scripts/test.sh installs it). Without
//! it the browser checks are skipped with the reason, except under CI
//! (env `CI` set), where they fail.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::cli::{check_error, dir, ok, s};
use std::time::{Duration, Instant};

/// The Chromium binary, or why there is none (a failure under CI).
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file());
    if found.is_none() {
        let why = "no chromium on PATH (apt-get install -y chromium; scripts/test.sh does)";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipping the browser checks: {why}");
    }
    found
}

/// Runs headless Chromium on `page` with `extra` flags, its output in
/// files (a pipe would fill and stall it); kills it after two minutes (a
/// hung browser is a failure, not a hung test).
fn browse(bin: &Path, profile: &Path, page: &Path, extra: &[String]) -> Output {
    let (out, err) = (profile.with_extension("out"), profile.with_extension("err"));
    let file = |p: &Path| std::fs::File::create(p).expect("output file");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--window-size=1280,2000",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(file(&out))
        .stderr(file(&err))
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish within two minutes on {}",
                page.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: std::fs::read(&out).expect("stdout"),
        stderr: std::fs::read(&err).expect("stderr"),
    }
}

/// Console messages Chromium logged (`--enable-logging=stderr`).
fn console_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect()
}

/// Records errors from the start and, once the page has loaded, what the
/// test checks into `<pre id="checks">` for `--dump-dom` to print.
const PROBE: &str = r#"<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
(function () { var f = console.error; console.error = function () {
  window.__errors.push(Array.prototype.join.call(arguments, ' ')); f.apply(console, arguments); }; })();
window.addEventListener('load', function () {
  function box(el) { if (!el) return null; var r = el.getBoundingClientRect();
    return [r.left, r.top, r.width, r.height]; }
  function bbox(el) { if (!el) return [0, 0]; var b = el.getBBox(); return [b.width, b.height]; }
  var visible = function (sel) { var n = 0; document.querySelectorAll(sel).forEach(function (r) {
    var b = r.getBBox(); if (b.width > 0 && b.height > 0) n++; }); return n; };
  var curve = document.getElementById('memory-curve');
  var measured = document.getElementById('measured-memory');
  var out = {
    errors: window.__errors,
    curve_d: curve ? curve.getAttribute('d').length : 0,
    curve_bbox: bbox(curve),
    measured_bbox: bbox(measured),
    areas: visible('#memory-chart path.area'),
    rects: document.querySelectorAll('#timeline-chart rect.ins').length,
    visible_rects: visible('#timeline-chart rect.ins'),
    measured_rects: visible('#timeline-chart g[data-measured="true"] rect.ins'),
    memory_box: box(document.getElementById('memory-chart')),
    timeline_box: box(document.getElementById('timeline-chart')),
    comparison: !!document.getElementById('comparison-chart')
  };
  var pre = document.createElement('pre'); pre.id = 'checks';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"#;

/// The probe's findings from the DOM Chromium dumped.
fn probe(bin: &Path, d: &Path, report: &Path) -> Value {
    let html = std::fs::read_to_string(report).expect("report");
    let probed = d.join("probed.html");
    std::fs::write(
        &probed,
        html.replacen("<head>", &format!("<head>{PROBE}"), 1),
    )
    .expect("write");
    let o = browse(
        bin,
        &d.join("profile-dom"),
        &probed,
        &["--dump-dom".into(), "--virtual-time-budget=5000".into()],
    );
    assert!(
        o.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dom = String::from_utf8_lossy(&o.stdout);
    let start =
        dom.find("<pre id=\"checks\">").expect("the probe ran") + "<pre id=\"checks\">".len();
    let end = start + dom[start..].find("</pre>").expect("</pre>");
    let text = dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).expect("the probe's JSON")
}

/// Distinct colors and the share of non-white pixels in `region`
/// (`[left, top, width, height]` in CSS pixels, at scale factor 1).
fn variety(png_path: &Path, region: &Value) -> (usize, f64) {
    let file = std::fs::File::open(png_path).expect("screenshot written");
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let channels = match info.color_type {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        other => panic!("unexpected PNG color type {other:?}"),
    };
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let r: Vec<f64> = region
        .as_array()
        .expect("a box")
        .iter()
        .map(|v| v.as_f64().expect("number"))
        .collect();
    let (w, h) = (info.width as usize, info.height as usize);
    let x0 = (r[0].max(0.0) as usize).min(w);
    let y0 = (r[1].max(0.0) as usize).min(h);
    let x1 = ((r[0] + r[2]) as usize).min(w);
    let y1 = ((r[1] + r[3]) as usize).min(h);
    assert!(
        x1 > x0 && y1 > y0,
        "region {r:?} is outside the {w}x{h} screenshot"
    );
    let mut colors = std::collections::HashSet::new();
    let mut ink = 0usize;
    for y in y0..y1 {
        for x in x0..x1 {
            let p = &buf[(y * w + x) * channels..][..3];
            colors.insert((p[0], p[1], p[2]));
            if p != [255, 255, 255] {
                ink += 1;
            }
        }
    }
    (colors.len(), ink as f64 / ((x1 - x0) * (y1 - y0)) as f64)
}

/// Opens `report` in Chromium and checks what the module header says.
fn check_in_browser(d: &Path, report: &Path, measured: bool) {
    let Some(bin) = chromium() else {
        return;
    };
    let shot = d.join("shot.png");
    let o = browse(
        &bin,
        &d.join("profile-shot"),
        report,
        &[format!("--screenshot={}", shot.display())],
    );
    assert!(
        o.status.success(),
        "chromium --screenshot failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(console_lines(&o), Vec::<String>::new(), "console messages");

    let checks = probe(&bin, d, report);
    assert_eq!(checks["errors"], Value::Array(vec![]), "{checks}");
    assert!(checks["curve_d"].as_u64().unwrap_or(0) > 20, "{checks}");
    // The curve spans most of the plot's width and has some height.
    let b = &checks["curve_bbox"];
    assert!(
        b[0].as_f64().unwrap_or(0.0) > 500.0 && b[1].as_f64().unwrap_or(0.0) > 10.0,
        "{checks}"
    );
    assert!(checks["areas"].as_u64().unwrap_or(0) > 0, "{checks}");
    let rects = checks["rects"].as_u64().unwrap_or(0);
    assert!(rects > 0 && checks["visible_rects"] == rects, "{checks}");
    if measured {
        assert!(
            checks["measured_rects"].as_u64().unwrap_or(0) > 0,
            "{checks}"
        );
        assert!(
            checks["measured_bbox"][0].as_f64().unwrap_or(0.0) > 100.0,
            "{checks}"
        );
        assert_eq!(checks["comparison"], true, "{checks}");
    }
    for region in ["memory_box", "timeline_box"] {
        let (colors, ink) = variety(&shot, &checks[region]);
        // Axes, areas and rectangles in several colors, not a blank page.
        assert!(
            colors >= 6 && ink > 0.03,
            "{region}: {colors} colors, {ink:.3} ink"
        );
    }
}

fn html_ok(report: &Path) {
    let html = std::fs::read_to_string(report).expect("report written");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.trim_end().ends_with("</html>"));
    // Self-contained: nothing fetched, no script.
    for needle in ["<script", "src=", "href=", "@import", "url("] {
        assert!(!html.contains(needle), "the report contains `{needle}`");
    }
}

#[test]
fn report_of_a_small_plan_renders_in_chromium() {
    let d = dir("small");
    let (plan, report) = (d.join("plan.json"), d.join("report.html"));
    ok(&["compile", "gpt-mini", "--world", "2", "-o", s(&plan)]);
    let said = ok(&["report", s(&plan), "-o", s(&report)]);
    assert!(said.starts_with("wrote "), "{said}");
    html_ok(&report);
    // Another cluster: same plan, other speeds.
    let other = d.join("other.html");
    ok(&[
        "report",
        s(&plan),
        "--cluster",
        "h100-80g-ib",
        "-o",
        s(&other),
    ]);
    let text = std::fs::read_to_string(&other).expect("report");
    assert!(text.contains("h100-80g-ib"));
    check_in_browser(&d, &report, false);

    // Bad input.
    let junk = d.join("junk.json");
    std::fs::write(&junk, "not json").expect("write");
    check_error(&["report", s(&junk)], "junk.json");
    check_error(
        &["report", s(&plan), "--measured", s(&junk)],
        "is not a trace",
    );
    check_error(
        &["report", s(&plan), "--measured", s(&plan)],
        "not an fsdpc trace",
    );
    check_error(
        &["report", s(&plan), "--cluster", "nowhere"],
        "neither a preset",
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn report_with_a_measured_gpt_mini_run_renders_in_chromium() {
    let d = dir("measured");
    let (plan, trace, report) = (
        d.join("plan.json"),
        d.join("measured.json"),
        d.join("report.html"),
    );
    // Planned for this machine, so predicted and measured are on one scale.
    let mini = [
        "compile",
        "gpt-mini",
        "--world",
        "2",
        "--cluster",
        "cpu-local",
    ];
    ok(&[&mini[..], &["-o", s(&plan)]].concat());
    ok(&["train", s(&plan), "--steps", "2", "--trace", s(&trace)]);
    ok(&[
        "report",
        s(&plan),
        "--measured",
        s(&trace),
        "-o",
        s(&report),
    ]);
    html_ok(&report);
    let html = std::fs::read_to_string(&report).expect("report");
    assert!(html.contains("id=\"comparison\"") && html.contains("measured step time"));
    check_in_browser(&d, &report, true);

    // The trace of another plan is refused.
    let plan1 = d.join("plan1.json");
    ok(&[
        "compile",
        "gpt-mini",
        "--world",
        "1",
        "--cluster",
        "cpu-local",
        "-o",
        s(&plan1),
    ]);
    check_error(
        &["report", s(&plan1), "--measured", s(&trace)],
        "different plans",
    );
    let _ = std::fs::remove_dir_all(&d);
}
