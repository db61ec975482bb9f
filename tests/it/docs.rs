//! The documentation's commands run here, so the docs cannot rot.
//!
//! Pages: `README.md` and every `docs/*.md`. The convention (docs/README.md
//! states it for whoever writes a page):
//!
//! - Every fenced block names its language. A block tagged `console` holds
//!   commands to run: each command is a line `$ fsdpc ...`, continued on
//!   the next line after a trailing `\`; `#` lines are comments; nothing
//!   else may be in it (output is never typed into the docs). A block
//!   tagged anything else (`sh` for cargo, python or launchers, `json`,
//!   `text`) is not run.
//! - A command's words are split as a POSIX shell splits them (quotes and
//!   backslashes); shell syntax (pipes, redirections, `;`, `&&`, variables)
//!   and unquoted glob characters are refused, so each line is one command
//!   a person can paste. `fsdpc` is the binary under test
//!   (`CARGO_BIN_EXE_fsdpc`).
//! - Each page runs its commands in order, in a fresh temporary directory
//!   holding links to the repository's `examples/` and `tests/`: paths are
//!   as from the repository root, and a page's later commands read what its
//!   earlier ones wrote (`-o plan.json`, then `fsdpc inspect plan.json`).
//! - A command must exit 0. Tags after `console` change that:
//!   - `console error`: every command must be refused: a non-zero exit and
//!     a message on stderr starting `error: ` (at most 3 lines, no panic).
//!   - `console slow`: run only when `FSDPC_DOCS_SLOW=1` (`fsdpc
//!     calibrate` takes far longer than the rest); otherwise skipped.
//!   - `console mpi`: commands `$ mpirun -np N fsdpc ...`. Built with
//!     `--features mpi` and `mpirun` on PATH, they run with
//!     `--allow-run-as-root --oversubscribe` added (as tests/it/mpi.rs does).
//!     Built without the feature, the `fsdpc ...` part runs alone and must
//!     be refused in one `error: ` line (the backend is not compiled in).
//!     With the feature but no `mpirun`, the block is skipped.
//!   - `console cuda`: built with `--features cuda` on a machine with an
//!     NVIDIA GPU (`/dev/nvidiactl`), the commands must succeed; anywhere
//!     else each must be refused in one `error: ` line (not compiled in, or
//!     the library or device that is missing), which is checked.
//! - Skips are written straight to the terminal, past the test harness's
//!   capture, so `cargo test` shows them.
//! - Every failure of every page is reported together, each naming the
//!   page, line, command, exit status and the end of its stderr.
//!
//! A second test checks the pages' relative links: each names a file of
//! the repository that exists (nothing outside it), and a `#anchor` into a
//! Markdown file names one of its headings.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest a documented command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and docs/*.md, in that order (docs sorted by name).
fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "no pages in docs/");
    let mut pages = vec![root().join("README.md")];
    pages.extend(docs);
    pages
}

/// The page's path as the messages name it (relative to the repository).
fn name(page: &Path) -> String {
    page.strip_prefix(root())
        .unwrap_or(page)
        .display()
        .to_string()
}

/// Writes a line to the terminal, past the harness's output capture.
fn note(msg: &str) {
    let _ = writeln!(std::io::stderr(), "docs: {msg}");
}

/// How a `console` block's commands are run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Run,
    Error,
    Slow,
    Mpi,
    Cuda,
}

struct Block {
    line: usize,
    kind: Kind,
    /// (line, text) of each command, continuations joined.
    commands: Vec<(usize, String)>,
}

/// An opening code fence (CommonMark): three or more backticks and an
/// info string without backticks. Returns the backticks and the info.
fn fence(line: &str) -> Option<(usize, &str)> {
    let t = line.trim_start();
    let ticks = t.len() - t.trim_start_matches('`').len();
    let info = &t[ticks..];
    (ticks >= 3 && !info.contains('`')).then_some((ticks, info))
}

/// Whether `line` closes a fence of `ticks` backticks.
fn closes(line: &str, ticks: usize) -> bool {
    let t = line.trim();
    t.len() >= ticks && t.chars().all(|c| c == '`')
}

/// The lines of `text` outside fenced blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut open: Option<usize> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match open {
            Some(ticks) if closes(line, ticks) => open = None,
            Some(_) => {}
            None => match fence(line) {
                Some((ticks, _)) => open = Some(ticks),
                None => out.push((i + 1, line)),
            },
        }
    }
    out
}

/// The page's `console` blocks; problems with the page's blocks go to
/// `failures`.
fn blocks(page: &Path, failures: &mut Vec<String>) -> Vec<Block> {
    let text = std::fs::read_to_string(page).expect("the page reads");
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    while let Some((n, line)) = lines.next() {
        let Some((ticks, info)) = fence(line) else {
            continue;
        };
        let mut tags = info.split_whitespace();
        let lang = tags.next();
        let tags: Vec<&str> = tags.collect();
        let body: Vec<(usize, &str)> = lines
            .by_ref()
            .take_while(|(_, l)| !closes(l, ticks))
            .collect();
        let at = format!("{}:{n}", name(page));
        let Some(lang) = lang else {
            failures.push(format!(
                "{at}: a fenced block without a language (console, sh, text, json ...)"
            ));
            continue;
        };
        if lang != "console" {
            if body.iter().any(|(_, l)| l.starts_with("$ ")) {
                failures.push(format!(
                    "{at}: a ```{lang} block holds `$ ` commands, which only `console` \
                     blocks run: tag it `console` (or write the commands without `$ `)"
                ));
            }
            continue;
        }
        let kind = match tags[..] {
            [] => Kind::Run,
            ["error"] => Kind::Error,
            ["slow"] => Kind::Slow,
            ["mpi"] => Kind::Mpi,
            ["cuda"] => Kind::Cuda,
            _ => {
                failures.push(format!(
                    "{at}: unknown console tags {tags:?} (none, error, slow, mpi or cuda)"
                ));
                continue;
            }
        };
        let mut commands: Vec<(usize, String)> = Vec::new();
        let mut continued = false;
        for (m, l) in body {
            let l = l.trim_end();
            if continued {
                let last = commands.last_mut().expect("a command to continue");
                let (rest, more) = match l.strip_suffix('\\') {
                    Some(r) => (r, true),
                    None => (l, false),
                };
                last.1.push(' ');
                last.1.push_str(rest.trim());
                continued = more;
            } else if let Some(cmd) = l.strip_prefix("$ ") {
                let (cmd, more) = match cmd.strip_suffix('\\') {
                    Some(r) => (r, true),
                    None => (cmd, false),
                };
                commands.push((m, cmd.trim().to_string()));
                continued = more;
            } else if !(l.is_empty() || l.starts_with('#')) {
                failures.push(format!(
                    "{}:{m}: a console block holds only `$ ` commands and `#` comments \
                     (output is not typed into the docs): {l}",
                    name(page)
                ));
            }
        }
        if commands.is_empty() {
            failures.push(format!("{at}: a console block without commands"));
        }
        out.push(Block {
            line: n,
            kind,
            commands,
        });
    }
    out
}

/// Splits `line` into words as a POSIX shell does for a plain command:
/// quotes, backslashes and `#` comments; anything a shell would expand or
/// treat as syntax is refused.
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("an unterminated ' quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("an unterminated \" quote".into()),
                        },
                        Some('$' | '`') => {
                            return Err("variables and command substitution are not run".into())
                        }
                        Some(c) => word.push(c),
                        None => return Err("an unterminated \" quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next().ok_or("a trailing backslash")?);
            }
            '#' if !in_word => break,
            '|' | '&' | ';' | '<' | '>' | '(' | ')' | '$' | '`' | '{' | '}' => {
                return Err(format!(
                    "shell syntax `{c}` is not run: one command per line, no pipes, \
                     redirections or variables"
                ))
            }
            '*' | '?' | '[' => {
                return Err(format!(
                    "an unquoted `{c}`, which a shell would expand: quote the word"
                ))
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `program args` in `cwd`, its output into files under `logs`,
/// killed after `COMMAND_TIMEOUT`.
fn run(program: &str, args: &[String], cwd: &Path, logs: &Path) -> Result<Outcome, String> {
    let (out_path, err_path) = (logs.join("stdout"), logs.join("stderr"));
    let file = |p: &Path| std::fs::File::create(p).expect("a log file");
    let mut child = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .spawn()
        .map_err(|e| format!("{program} does not start: {e}"))?;
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("the child can be waited for") {
            break s;
        }
        if started.elapsed() > COMMAND_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {COMMAND_TIMEOUT:?}; killed"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Ok(Outcome {
        code: status.code(),
        stdout: read(&out_path),
        stderr: read(&err_path),
    })
}

/// The last lines of `text`, indented, for a failure message.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(20);
    lines[start..]
        .iter()
        .map(|l| format!("    | {l}\n"))
        .collect()
}

/// Whether `o` is a refusal: non-zero exit, stderr starting `error: ` in
/// at most `max_lines` lines, no panic.
fn refused(o: &Outcome, max_lines: usize) -> bool {
    o.code != Some(0)
        && o.stderr.starts_with("error: ")
        && o.stderr.trim_end().lines().count() <= max_lines
        && !o.stderr.contains("panicked")
}

fn mpirun_available() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs every command of `page`; failures go to `failures`. Returns how
/// many commands ran.
fn run_page(page: &Path, failures: &mut Vec<String>) -> usize {
    let blocks = blocks(page, failures);
    if blocks.is_empty() {
        return 0;
    }
    let bin = env!("CARGO_BIN_EXE_fsdpc");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let logs = tempfile::tempdir().expect("a temporary directory");
    for linked in ["examples", "tests"] {
        std::os::unix::fs::symlink(root().join(linked), dir.path().join(linked))
            .expect("a link to the repository");
    }
    let slow = std::env::var("FSDPC_DOCS_SLOW").is_ok_and(|v| v == "1");
    let cuda_runs = cfg!(feature = "cuda") && Path::new("/dev/nvidiactl").exists();
    let mut ran = 0;
    for block in blocks {
        let at = format!("{}:{}", name(page), block.line);
        match block.kind {
            Kind::Slow if !slow => {
                note(&format!(
                    "{at}: skipped a `console slow` block (set FSDPC_DOCS_SLOW=1 to run it)"
                ));
                continue;
            }
            Kind::Mpi if cfg!(feature = "mpi") && !mpirun_available() => {
                note(&format!(
                    "{at}: skipped a `console mpi` block: built with --features mpi, but \
                     `mpirun` is not on PATH"
                ));
                continue;
            }
            _ => {}
        }
        for (line, text) in &block.commands {
            let at = format!("{}:{line}: `{text}`", name(page));
            let argv = match words(text) {
                Ok(w) => w,
                Err(e) => {
                    failures.push(format!("{at}: {e}"));
                    continue;
                }
            };
            // The program and its arguments, and how the outcome is judged.
            let (program, args, expect_refusal): (String, Vec<String>, Option<usize>) =
                match (block.kind, argv.first().map(String::as_str)) {
                    (Kind::Mpi, Some("mpirun")) => {
                        let Some(at_fsdpc) = argv.iter().position(|w| w == "fsdpc") else {
                            failures.push(format!("{at}: an mpirun command without `fsdpc`"));
                            continue;
                        };
                        if cfg!(feature = "mpi") {
                            let mut args = vec![
                                "--allow-run-as-root".to_string(),
                                "--oversubscribe".to_string(),
                            ];
                            args.extend(argv[1..at_fsdpc].iter().cloned());
                            args.push(bin.to_string());
                            args.extend(argv[at_fsdpc + 1..].iter().cloned());
                            ("mpirun".into(), args, None)
                        } else {
                            (bin.into(), argv[at_fsdpc + 1..].to_vec(), Some(1))
                        }
                    }
                    (Kind::Mpi, _) => {
                        failures.push(format!("{at}: a `console mpi` command starts `mpirun`"));
                        continue;
                    }
                    (kind, Some("fsdpc")) => {
                        let refusal = match kind {
                            Kind::Error => Some(3),
                            Kind::Cuda if !cuda_runs => Some(1),
                            _ => None,
                        };
                        (bin.into(), argv[1..].to_vec(), refusal)
                    }
                    _ => {
                        failures.push(format!("{at}: a command starts `fsdpc`"));
                        continue;
                    }
                };
            ran += 1;
            let started = Instant::now();
            let outcome = match run(&program, &args, dir.path(), logs.path()) {
                Ok(o) => o,
                Err(e) => {
                    failures.push(format!("{at}: {e}"));
                    continue;
                }
            };
            eprintln!("{at}: exit {:?} in {:.2?}", outcome.code, started.elapsed());
            match expect_refusal {
                None if outcome.code != Some(0) => failures.push(format!(
                    "{at}: exit {:?}\n{}",
                    outcome.code,
                    tail(if outcome.stderr.trim().is_empty() {
                        &outcome.stdout
                    } else {
                        &outcome.stderr
                    })
                )),
                Some(lines) if !refused(&outcome, lines) => failures.push(format!(
                    "{at}: expected a refusal (non-zero exit, `error: ...` in at most \
                     {lines} line(s)); got exit {:?}\n{}",
                    outcome.code,
                    tail(&outcome.stderr)
                )),
                Some(_) if block.kind != Kind::Error => note(&format!(
                    "{at}: refused as expected without {}: {}",
                    if block.kind == Kind::Mpi {
                        "--features mpi"
                    } else {
                        "--features cuda and a GPU"
                    },
                    outcome.stderr.trim()
                )),
                _ => {}
            }
        }
    }
    ran
}

#[test]
fn every_documented_command_runs() {
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut ran = 0;
    let pages = pages();
    for page in &pages {
        let t = Instant::now();
        let n = run_page(page, &mut failures);
        eprintln!("{}: {n} command(s) in {:.1?}", name(page), t.elapsed());
        ran += n;
    }
    eprintln!(
        "{ran} commands on {} pages in {:.1?}",
        pages.len(),
        started.elapsed()
    );
    assert!(ran > 0, "no documented command ran");
    assert!(
        failures.is_empty(),
        "{} documented command(s) or block(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// GitHub's anchor of a heading: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside fenced blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter(|(_, l)| l.starts_with('#'))
        .map(|(_, l)| anchor(l.trim_start_matches('#')))
        .collect()
}

/// The link targets of one line of prose: `[text](target)`, inline code
/// left out.
fn link_targets(line: &str) -> Vec<String> {
    // Code spans (a run of n backticks up to the next run of exactly n)
    // left out.
    let mut prose = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        prose.push_str(&rest[..start]);
        let after = &rest[start..];
        let n = after.len() - after.trim_start_matches('`').len();
        let body = &after[n..];
        let mut end = None;
        let mut i = 0;
        while let Some(j) = body[i..].find('`') {
            let at = i + j;
            let run = body[at..].len() - body[at..].trim_start_matches('`').len();
            if run == n {
                end = Some(at + n);
                break;
            }
            i = at + run;
        }
        match end {
            Some(e) => rest = &body[e..],
            None => {
                rest = body;
            }
        }
    }
    prose.push_str(rest);
    prose
        .match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &prose[i + 2..];
            rest.find(')').map(|end| rest[..end].trim().to_string())
        })
        .collect()
}

#[test]
fn links_point_inside_the_repository_and_resolve() {
    let root = root().canonicalize().expect("the repository");
    let mut failures = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("the page reads");
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let at = format!("{}:{n}: ({target})", name(&page));
                let (path, frag) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    page.parent().expect("a page's folder").join(path)
                };
                let Ok(file) = file.canonicalize() else {
                    failures.push(format!("{at}: no such file"));
                    continue;
                };
                if !file.starts_with(&root) {
                    failures.push(format!("{at}: points outside the repository"));
                    continue;
                }
                if let Some(frag) = frag {
                    let body = std::fs::read_to_string(&file).unwrap_or_default();
                    if file.extension().is_some_and(|e| e == "md") && !anchors(&body).contains(frag)
                    {
                        failures.push(format!("{at}: no heading with the anchor #{frag}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "broken links:\n{}",
        failures.join("\n")
    );
}

#[test]
fn words_split_as_a_shell_splits_them() {
    assert_eq!(
        words("fsdpc train gpt-mini --freeze 'transformer.h.0.*' # a comment").unwrap(),
        [
            "fsdpc",
            "train",
            "gpt-mini",
            "--freeze",
            "transformer.h.0.*"
        ]
    );
    assert_eq!(words(r#"a "b c" d\ e"#).unwrap(), ["a", "b c", "d e"]);
    assert!(words("fsdpc inspect plan.json | head").is_err());
    assert!(words("fsdpc train --freeze transformer.h.0.*").is_err());
    assert!(words("fsdpc train $MODEL").is_err());
}
