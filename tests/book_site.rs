//! The book's site: the CLI reference generated from `--help`, the console blocks run and
//! compared, includes that resolve, and `mdbook build` with every link checked.

use super::*;

// --- the CLI reference -----------------------------------------------------------------------

pub(super) fn sinter_cmd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sinter"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run sinter {}: {e}", args.join(" ")))
}

fn help(args: &[&str]) -> String {
    let out = sinter_cmd(args);
    assert!(out.status.success(), "sinter {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn render_cli_reference() -> String {
    let top = help(&["--help"]);
    let mut subcommands = Vec::new();
    let mut in_commands = false;
    for line in top.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
        } else if in_commands {
            match line.split_whitespace().next() {
                Some(name) if line.starts_with("  ") => {
                    if name != "help" {
                        subcommands.push(name.to_string());
                    }
                }
                _ => break,
            }
        }
    }
    let mut s = String::new();
    s += "# Command line\n\n";
    s += "<!-- Generated from `sinter --help` by tests/book.rs; do not edit. Regenerate with\n     SINTER_BLESS_BOOK=1 cargo test --test main book -->\n\n";
    s += "The `sinter` program's own help, for the program and each subcommand, as the build prints it.\n";
    s += "In the clone, `cargo run --release -- ARGS` runs `sinter ARGS`.\n";
    s += &format!("\n## `sinter`\n\n```text\n{}```\n", top);
    for sub in &subcommands {
        s += &format!("\n## `sinter {sub}`\n\n```text\n{}```\n", help(&[sub, "--help"]));
    }
    s
}

#[test]
fn ch10_cli_reference_is_generated_from_the_help() {
    check_generated("book/src/reference/cli.md", &render_cli_reference(), "`sinter --help`");
}

// --- console blocks --------------------------------------------------------------------------

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            markdown_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// Splits a command line at spaces, keeping "double-quoted" words whole.
fn split_args(line: &str) -> Vec<String> {
    let (mut args, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    args.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        args.push(cur);
    }
    args
}

/// Whether `want` (lines, `…` for any run of lines) matches `got` as a whole.
pub(super) fn matches_with_gaps(want: &[&str], got: &[&str]) -> bool {
    let segments: Vec<&[&str]> = want.split(|l| l.trim() == "…").collect();
    let mut at = 0;
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        if seg.is_empty() {
            continue;
        }
        let fits = |start: usize| start + seg.len() <= got.len() && seg.iter().zip(&got[start..]).all(|(w, g)| w.trim_end() == g.trim_end());
        let found = if i == 0 {
            fits(0).then_some(0)
        } else if last {
            got.len().checked_sub(seg.len()).filter(|&s| s >= at && fits(s))
        } else {
            (at..got.len()).find(|&s| fits(s))
        };
        match found {
            Some(s) => at = s + seg.len(),
            None => return false,
        }
        if last && at != got.len() {
            return false;
        }
    }
    segments.last().is_some_and(|s| s.is_empty()) || at == got.len()
}

#[test]
fn console_blocks_show_what_sinter_prints() {
    let mut files = Vec::new();
    markdown_files(&root().join("book/src"), &mut files);
    files.sort();
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "```console" {
                continue;
            }
            let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            let Some(cmd) = block.first().and_then(|l| l.strip_prefix("$ sinter ")) else { continue };
            let args = split_args(cmd);
            if args[0] == "run" && smollm2().is_none() {
                continue;
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = sinter_cmd(&args);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let got: Vec<&str> = stdout.lines().collect();
            assert!(
                out.status.success() && matches_with_gaps(&block[1..], &got),
                "{}: `sinter {cmd}` prints something else than the book shows (status {}).\nIt prints:\n{stdout}\nstderr:\n{}",
                file.strip_prefix(root()).unwrap().display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} console blocks found");
}

#[test]
fn matching_with_gaps() {
    let got = ["a", "b", "c", "d"];
    assert!(matches_with_gaps(&["a", "b", "c", "d"], &got));
    assert!(matches_with_gaps(&["a", "…", "d"], &got));
    assert!(matches_with_gaps(&["…", "c", "…"], &got));
    assert!(matches_with_gaps(&["a", "…"], &got));
    assert!(!matches_with_gaps(&["a", "c", "…"], &got));
    assert!(!matches_with_gaps(&["a", "b"], &got));
    assert!(!matches_with_gaps(&["…", "b"], &got));
    assert!(!matches_with_gaps(&["…", "x", "…"], &got));
}

/// mdBook renders an `{{#include file:anchor}}` whose anchor is missing as nothing, silently:
/// every include must name a file that exists and, if it names an anchor, one the file has.
#[test]
fn includes_name_files_and_anchors_that_exist() {
    let mut files = Vec::new();
    markdown_files(&root().join("book/src"), &mut files);
    let mut count = 0;
    for md in files {
        let text = std::fs::read_to_string(&md).unwrap();
        for piece in text.split("{{#include ").skip(1) {
            let target = piece.split("}}").next().unwrap().trim();
            let (path, anchor) = match target.rsplit_once(':') {
                Some((p, a)) if !a.contains('/') => (p, Some(a)),
                _ => (target, None),
            };
            let file = md.parent().unwrap().join(path);
            let page = md.strip_prefix(root()).unwrap().display().to_string();
            let content = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{page}: includes {path}: {e}"));
            if let Some(a) = anchor {
                assert!(
                    content.lines().any(|l| l.trim() == format!("// ANCHOR: {a}")) && content.lines().any(|l| l.trim() == format!("// ANCHOR_END: {a}")),
                    "{page}: includes anchor `{a}` of {path}, which has no `// ANCHOR: {a}` … `// ANCHOR_END: {a}`"
                );
            }
            count += 1;
        }
    }
    assert!(count >= 20, "only {count} includes found");
}

// --- mdbook build and the link check ---------------------------------------------------------

fn find_mdbook() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("mdbook")).find(|c| c.is_file()))
        .unwrap_or_default();
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin/mdbook")).filter(|p| p.is_file());
    let found = on_path.or(home);
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "mdbook is not installed: run scripts/setup");
        eprintln!("skipped: mdbook is not installed (scripts/setup installs it)");
    }
    found
}

fn html_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            html_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "html") {
            out.push(p);
        }
    }
}

/// The values of attribute `attr` (`href`, `src`, `id`) in an HTML text.
fn attr_values<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
    let pat = format!(" {attr}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find(&pat) {
        rest = &rest[i + pat.len()..];
        if let Some(end) = rest.find('"') {
            out.push(&rest[..end]);
            rest = &rest[end..];
        }
    }
    out
}

/// Decodes `%xx` escapes and the HTML entities mdBook writes in URLs.
fn unescape(s: &str) -> String {
    let s = s.replace("&amp;", "&");
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn book_builds_and_its_links_resolve() {
    let Some(mdbook) = find_mdbook() else { return };
    let dest = Path::new(env!("CARGO_TARGET_TMPDIR")).join("book-html");
    let _ = std::fs::remove_dir_all(&dest);
    let out = Command::new(&mdbook).arg("build").arg(root().join("book")).arg("--dest-dir").arg(&dest).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mdbook build failed:\n{log}");
    for line in log.lines() {
        assert!(!line.contains("ERROR") && !line.contains("WARN"), "mdbook complained:\n{log}");
    }
    let mut files = Vec::new();
    html_files(&dest, &mut files);
    assert!(files.len() >= 10, "mdbook wrote only {} pages", files.len());
    let ids = |p: &Path| -> Vec<String> {
        let html = std::fs::read_to_string(p).unwrap();
        attr_values(&html, "id").into_iter().map(str::to_string).collect()
    };
    let mut broken = Vec::new();
    for file in &files {
        let html = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(&dest).unwrap().display().to_string();
        if html.contains("{{#") {
            broken.push(format!("{rel}: an mdBook directive was not expanded (a bad {{{{#include}}}}?)"));
        }
        // A page with <base href="/"> (404.html) resolves links from the book's root.
        let base = html.find("<base href=\"").map(|i| {
            let v = &html[i + 12..];
            dest.join(v[..v.find('"').unwrap_or(0)].trim_start_matches('/'))
        });
        let own_ids = ids(file);
        for link in attr_values(&html, "href").into_iter().chain(attr_values(&html, "src")) {
            let link = unescape(link);
            if link.is_empty() || ["http://", "https://", "mailto:", "javascript:", "data:"].iter().any(|s| link.starts_with(s)) {
                continue;
            }
            let (path, frag) = match link.split_once('#') {
                Some((p, f)) => (p.to_string(), Some(f.to_string())),
                None => (link.clone(), None),
            };
            let path = path.split('?').next().unwrap_or_default().to_string();
            let target = if path.is_empty() {
                file.clone()
            } else if let Some(abs) = path.strip_prefix('/') {
                dest.join(abs)
            } else {
                base.clone().unwrap_or_else(|| file.parent().unwrap().to_path_buf()).join(&path)
            };
            let target = if target.is_dir() { target.join("index.html") } else { target };
            if !target.is_file() {
                broken.push(format!("{rel}: link `{link}`: {} does not exist", target.display()));
                continue;
            }
            if let Some(frag) = frag.filter(|f| !f.is_empty()) {
                let found = if target == *file { own_ids.contains(&frag) } else { ids(&target).contains(&frag) };
                if !found {
                    broken.push(format!("{rel}: link `{link}`: no element has id `{frag}`"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links in the book:\n{}", broken.join("\n"));
}

// --- chapter 4: one model in both spellings ----------------------------------------------------

/// Chapter 4 lists the kernels one Qwen2-0.5B layer (prefill, bf16, with the embedding and the
/// head) lowers to in Hugging Face's order and with RoPE first: the same kernels, in the same
/// order, each with the same ops.
#[test]
fn ch4_shows_one_model_in_both_spellings_with_the_same_kernels() {
    use sinter::zoo::qwen::{build_spelled, QwenConfig, Spelling};
    let mut cfg = QwenConfig::qwen2_0_5b();
    cfg.n_layers = 1;
    let kernels = |s: Spelling| -> Vec<String> {
        let g = build_spelled(&cfg, sinter::zoo::Mode::Prefill, sinter::DType::BF16, s).unwrap();
        let (_, report) = sinter_passes::compile(&g, &sinter::Target::SM_90A, &sinter_passes::PassOptions::for_graph(&g)).unwrap();
        report.kernels.iter().filter(|k| !k.load_time).map(|k| format!("{:?}: {}", k.family, k.ops.join(" "))).collect()
    };
    let (hf, first) = (kernels(Spelling::HuggingFace), kernels(Spelling::RopeFirst));
    assert_eq!(hf, first, "the two spellings lower to different kernels");
    let mut body = String::from("| # | Hugging Face's order | RoPE first |\n|---|---|---|\n");
    for (i, (a, b)) in hf.iter().zip(&first).enumerate() {
        body += &format!("| {} | `{a}` | `{b}` |\n", i + 1);
    }
    super::check_region("fusion.md", "qwen2-both-spellings", &body);
}
