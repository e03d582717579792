//! The book (`docs/src/`), the Markdown at the top of the repository (README.md, CHANGELOG.md,
//! SECURITY.md) and the benchmark's notes (bench/NOTES.md) keep working as documentation: every relative
//! link leads to a file that exists, and every `#anchor` to a heading of its page (with mdBook's slugs); a
//! link in the book stays inside the book, which is all `mdbook build` publishes; SUMMARY.md lists every
//! page; and every code sample in a language we can check still parses — YAML (as metahook reads it, every
//! document), JSON (`serde_json`), Python (`ast.parse`), JavaScript (`node --check`), shell (`bash -n`).
//! TOML samples are not checked: no TOML parser is among the crate's dependencies (`book.toml` itself is
//! parsed by `make docs`).
//!
//! The README's figures table is a copy of the performance page's, which is their source: the lines
//! between `<!-- figures:begin -->` and `<!-- figures:end -->` must be the same in both.
//!
//! Needs no cluster, only `python3`, `node` and `bash`, which `make test` needs anyway.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What the checks need of one Markdown file.
#[derive(Debug, Default)]
struct Doc {
    /// Link destinations, with their line.
    links: Vec<(String, usize)>,
    /// The ids mdBook gives the headings.
    anchors: BTreeSet<String>,
    /// Fenced code blocks: language (first word of the info string), text, line of the fence.
    samples: Vec<(String, String, usize)>,
}

/// mdBook's id for a heading's text (`mdbook::utils::normalize_id`, 0.4): letters, digits, `_` and `-`
/// kept and ASCII lower-cased, whitespace turned into `-`, anything else dropped.
fn slug(text: &str) -> String {
    text.trim()
        .trim_start_matches('#')
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// Reads `text` with the parser and options mdBook renders with (pulldown-cmark 0.10).
fn parse(text: &str) -> Doc {
    let mut options = Options::empty();
    for option in [
        Options::ENABLE_TABLES,
        Options::ENABLE_FOOTNOTES,
        Options::ENABLE_STRIKETHROUGH,
        Options::ENABLE_TASKLISTS,
        Options::ENABLE_HEADING_ATTRIBUTES,
    ] {
        options.insert(option);
    }
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut doc = Doc::default();
    // Same heading text, same slug: mdBook numbers the repeats `-1`, `-2`, … per page.
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut heading: Option<(Option<String>, String)> = None;
    let mut sample: Option<(String, String, usize)> = None;
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { id, .. }) => heading = Some((id.map(|i| i.to_string()), String::new())),
            Event::End(TagEnd::Heading(_)) => {
                let (explicit, text) = heading.take().expect("a heading ends after it starts");
                let id = explicit.unwrap_or_else(|| {
                    let id = slug(&text);
                    let count = seen.entry(id.clone()).or_insert(0);
                    let unique = if *count == 0 { id } else { format!("{id}-{count}") };
                    *count += 1;
                    unique
                });
                doc.anchors.insert(id);
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, heading)) = &mut heading {
                    heading.push_str(&t);
                }
                if let Some((_, code, _)) = &mut sample {
                    code.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                doc.links.push((dest_url.to_string(), line_of(range.start)));
            }
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                let language = info.split([',', ' ']).next().unwrap_or_default().to_owned();
                sample = Some((language, String::new(), line_of(range.start)));
            }
            Event::End(TagEnd::CodeBlock) => doc.samples.extend(sample.take()),
            _ => {}
        }
    }
    doc
}

/// `path` without `.` and `..` (which may not climb above the root).
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// A URL with a scheme (`https:`, `mailto:`) leaves the repository: not checked.
fn is_external(link: &str) -> bool {
    let scheme: String = link.chars().take_while(|c| c.is_ascii_alphanumeric() || "+.-".contains(*c)).collect();
    !scheme.is_empty() && link[scheme.len()..].starts_with(':')
}

/// The Markdown files the checks cover, relative to `root`: the book's pages, then `top`.
fn markdown_files(root: &Path, book: &Path, top: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path.strip_prefix(root).unwrap().to_owned());
            }
        }
    }
    let mut files = Vec::new();
    walk(&root.join(book), root, &mut files);
    files.extend(top.iter().map(PathBuf::from).filter(|f| root.join(f).exists()));
    files
}

/// `file` parsed, once.
fn read<'a>(docs: &'a mut BTreeMap<PathBuf, Doc>, root: &Path, file: &Path) -> Option<&'a Doc> {
    if !docs.contains_key(file) {
        let text = std::fs::read_to_string(root.join(file)).ok()?;
        docs.insert(file.to_owned(), parse(&text));
    }
    docs.get(file)
}

/// Every broken link of `files` (relative to `root`), one line each. Links from a file under `book`
/// must stay under `book`.
fn broken_links(root: &Path, book: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut docs: BTreeMap<PathBuf, Doc> = BTreeMap::new();
    let mut broken = Vec::new();
    for file in files {
        let links = read(&mut docs, root, file).map(|d| d.links.clone()).unwrap_or_default();
        for (link, line) in links {
            if is_external(&link) {
                continue;
            }
            let at = format!("{}:{line}: {link}", file.display());
            let (path, anchor) = link.split_once('#').map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
            let target = if path.is_empty() {
                Some(file.clone())
            } else if path.starts_with('/') {
                None
            } else {
                normalize(&file.parent().unwrap_or(Path::new("")).join(path))
            };
            let Some(target) = target else {
                broken.push(format!("{at}: leaves the repository (or is absolute)"));
                continue;
            };
            if file.starts_with(book) && !target.starts_with(book) {
                broken.push(format!("{at}: leaves the book; mdbook publishes only {}", book.display()));
                continue;
            }
            if !root.join(&target).exists() {
                broken.push(format!("{at}: no such file {}", target.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|e| e != "md") {
                broken.push(format!("{at}: an anchor into a file that is not Markdown cannot be checked"));
                continue;
            }
            let anchors = read(&mut docs, root, &target).map(|d| d.anchors.clone()).unwrap_or_default();
            if !anchors.contains(anchor) {
                broken.push(format!("{at}: no heading #{anchor} in {} (it has: {anchors:?})", target.display()));
            }
        }
    }
    broken
}

/// Pages of `book` that `book/SUMMARY.md` does not link to (mdBook would not build them).
fn missing_from_summary(root: &Path, book: &Path) -> Vec<String> {
    let summary = root.join(book).join("SUMMARY.md");
    let listed: BTreeSet<PathBuf> = parse(&std::fs::read_to_string(&summary).unwrap())
        .links
        .iter()
        .filter(|(link, _)| !is_external(link))
        .filter_map(|(link, _)| normalize(&book.join(link.split('#').next().unwrap_or_default())))
        .collect();
    markdown_files(root, book, &[])
        .into_iter()
        .filter(|page| page.file_name().is_none_or(|n| n != "SUMMARY.md") && !listed.contains(page))
        .map(|page| page.display().to_string())
        .collect()
}

/// Runs `program args` with `input` on stdin: `Err` with its stderr when it fails.
fn run(program: &str, args: &[&str], input: &str) -> Result<(), String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} (make test needs it): {e}"));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    if output.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&output.stderr).trim().to_owned()) }
}

/// Whether `code` parses as `language`; `None` for a language not checked.
fn check_sample(language: &str, code: &str, scratch: &Path) -> Option<Result<(), String>> {
    Some(match language {
        "yaml" | "yml" => {
            metahook::ops::yaml::from_documents::<serde_json::Value>(code).map(|_| ()).map_err(|e| e.to_string())
        }
        "json" => serde_json::from_str::<serde_json::Value>(code).map(|_| ()).map_err(|e| e.to_string()),
        "python" | "py" => run("python3", &["-c", "import ast, sys; ast.parse(sys.stdin.read())"], code),
        "js" | "javascript" | "mjs" => {
            let file = scratch.join("sample.mjs");
            std::fs::write(&file, code).unwrap();
            run("node", &["--check", file.to_str().unwrap()], "")
        }
        "sh" | "bash" | "shell" => run("bash", &["-n"], code),
        _ => return None,
    })
}

/// Every sample of `files` that does not parse, one line each; and how many were checked.
fn broken_samples(root: &Path, files: &[PathBuf]) -> (Vec<String>, usize) {
    let scratch = tempfile::tempdir().unwrap();
    let (mut broken, mut checked) = (Vec::new(), 0);
    for file in files {
        let doc = parse(&std::fs::read_to_string(root.join(file)).unwrap());
        for (language, code, line) in &doc.samples {
            match check_sample(language, code, scratch.path()) {
                Some(Ok(())) => checked += 1,
                Some(Err(why)) => {
                    broken.push(format!("{}:{line}: {language} sample does not parse: {why}", file.display()))
                }
                None => {}
            }
        }
    }
    (broken, checked)
}

const BOOK: &str = "docs/src";
const TOP: [&str; 4] = ["README.md", "CHANGELOG.md", "SECURITY.md", "bench/NOTES.md"];

// The figures: the performance page's table is their source, the README's a copy of it.

const FIGURES_BEGIN: &str = "<!-- figures:begin -->";
const FIGURES_END: &str = "<!-- figures:end -->";
const FIGURES_SOURCE: &str = "docs/src/performance.md";
const FIGURES_COPY: &str = "README.md";

/// The lines of `text` between its figures markers, each with its line number (from 1), blank lines at
/// either end left out; `Err` saying why when a marker is missing, repeated, or the end comes first.
fn figures(text: &str) -> Result<Vec<(usize, &str)>, String> {
    let lines: Vec<(usize, &str)> = text.lines().enumerate().map(|(i, line)| (i + 1, line)).collect();
    let find = |marker: &str| match lines.iter().filter(|(_, line)| line.trim() == marker).collect::<Vec<_>>()[..] {
        [(at, _)] => Ok(*at),
        [] => Err(format!("no line {marker}")),
        _ => Err(format!("{marker} more than once")),
    };
    let (begin, end) = (find(FIGURES_BEGIN)?, find(FIGURES_END)?);
    if end < begin {
        return Err(format!("{FIGURES_END} (line {end}) before {FIGURES_BEGIN} (line {begin})"));
    }
    let inside = &lines[begin..end - 1];
    let filled = |(_, line): &&(usize, &str)| !line.trim().is_empty();
    let first = inside.iter().position(|line| filled(&line)).unwrap_or(inside.len());
    let last = inside.iter().rposition(|line| filled(&line)).map_or(first, |at| at + 1);
    Ok(inside[first..last].to_vec())
}

/// What turns `source` into `copy`, line by line (a longest common subsequence): `-<line>: text` for a
/// line only `source` has, `+<line>: text` for one only `copy` has, with their own line numbers. Empty
/// when the texts are the same.
fn line_diff(source: &[(usize, &str)], copy: &[(usize, &str)]) -> Vec<String> {
    let (n, m) = (source.len(), copy.len());
    // common[i][j]: the longest common subsequence of source[i..] and copy[j..].
    let mut common = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            common[i][j] = if source[i].1 == copy[j].1 {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        if i < n && j < m && source[i].1 == copy[j].1 {
            (i, j) = (i + 1, j + 1);
        } else if j == m || (i < n && common[i + 1][j] >= common[i][j + 1]) {
            out.push(format!("-{}: {}", source[i].0, source[i].1));
            i += 1;
        } else {
            out.push(format!("+{}: {}", copy[j].0, copy[j].1));
            j += 1;
        }
    }
    out
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading_that_exist() {
    let root = repo_root();
    let files = markdown_files(&root, Path::new(BOOK), &TOP);
    assert!(files.len() > TOP.len(), "found no pages under {BOOK}");
    let broken = broken_links(&root, Path::new(BOOK), &files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn summary_lists_every_page_of_the_book() {
    let missing = missing_from_summary(&repo_root(), Path::new(BOOK));
    assert!(missing.is_empty(), "pages SUMMARY.md does not list (mdbook would leave them out): {missing:?}");
}

#[test]
fn every_code_sample_in_a_checked_language_parses() {
    let root = repo_root();
    let files = markdown_files(&root, Path::new(BOOK), &TOP);
    let (broken, checked) = broken_samples(&root, &files);
    assert!(broken.is_empty(), "samples that no longer parse:\n{}", broken.join("\n"));
    assert!(checked > 0, "no sample was checked");
}

#[test]
fn the_readmes_figures_are_a_copy_of_the_performance_pages() {
    let root = repo_root();
    let read = |file: &str| std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let (source_text, copy_text) = (read(FIGURES_SOURCE), read(FIGURES_COPY));
    let source = figures(&source_text).unwrap_or_else(|why| panic!("{FIGURES_SOURCE}: {why}"));
    let copy = figures(&copy_text).unwrap_or_else(|why| panic!("{FIGURES_COPY}: {why}"));
    assert!(source.iter().any(|(_, line)| line.starts_with('|')), "{FIGURES_SOURCE}: no table between the markers");
    let diff = line_diff(&source, &copy);
    assert!(
        diff.is_empty(),
        "the figures in {FIGURES_COPY} are not those of {FIGURES_SOURCE}, their source: change the source, then \
         copy what is between {FIGURES_BEGIN} and {FIGURES_END} into {FIGURES_COPY}.\n\
         - {FIGURES_SOURCE}, + {FIGURES_COPY}, with line numbers:\n{}",
        diff.join("\n")
    );
}

// The checks themselves, on a made-up book, so that a check that passes is one that could have failed.

fn scratch_repo(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

#[test]
fn headings_get_mdbooks_ids_and_repeats_are_numbered() {
    let doc = parse("# What a sync promises\n## `hookHosts` & TLS\n## Notes\n## Notes\n## Named {#own-id}\n");
    let anchors: Vec<&str> = doc.anchors.iter().map(String::as_str).collect();
    assert_eq!(anchors, ["hookhosts--tls", "notes", "notes-1", "own-id", "what-a-sync-promises"]);
}

#[test]
fn a_missing_file_a_missing_heading_and_a_link_out_of_the_book_are_reported() {
    let repo = scratch_repo(&[
        ("README.md", "[ok](book/a.md#intro) [gone](book/b.md) [no heading](book/a.md#outro)\n"),
        ("book/SUMMARY.md", "- [A](a.md)\n"),
        ("book/a.md", "# Intro\n[out](../README.md) [self](#intro) [web](https://example.com/x.md)\n"),
        ("book/orphan.md", "# Orphan\n"),
    ]);
    let book = Path::new("book");
    let files = markdown_files(repo.path(), book, &["README.md"]);
    let broken = broken_links(repo.path(), book, &files);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].starts_with("book/a.md:2: ../README.md: leaves the book"), "{broken:#?}");
    assert!(broken[1].starts_with("README.md:1: book/b.md: no such file"), "{broken:#?}");
    assert!(broken[2].starts_with("README.md:1: book/a.md#outro: no heading #outro"), "{broken:#?}");
    assert_eq!(missing_from_summary(repo.path(), book), ["book/orphan.md"]);
}

#[test]
fn a_sample_that_does_not_parse_is_reported_in_each_checked_language() {
    let bad = [
        ("yaml", "a: [1\n"),
        ("yaml", "ok: 1\n---\nb: {\n"),
        ("json", "{\"a\": 1,}\n"),
        ("python", "def f(:\n"),
        ("js", "const = 1;\n"),
        ("sh", "if then fi\n"),
    ];
    let text: String = bad.iter().map(|(language, code)| format!("```{language}\n{code}```\n\n")).collect();
    let good = "```yaml\na: 1\n---\nb: 2\n```\n```js\nexport const a = 1;\n```\n```text\nnot checked {\n```\n";
    let repo = scratch_repo(&[("bad.md", &text), ("good.md", good)]);
    let (broken, checked) = broken_samples(repo.path(), &[PathBuf::from("bad.md")]);
    assert_eq!(broken.len(), bad.len(), "{broken:#?}");
    assert_eq!(checked, 0);
    let (broken, checked) = broken_samples(repo.path(), &[PathBuf::from("good.md")]);
    assert!(broken.is_empty(), "{broken:#?}");
    assert_eq!(checked, 2, "the text block is not checked");
}

#[test]
fn a_changed_or_added_figure_and_a_missing_marker_are_reported() {
    let source = concat!(
        "# Figures\n<!-- figures:begin -->\n\n",
        "| what | s |\n|---|---|\n| backlog | 31.10 |\n| update | 39.93 |\n",
        "\n<!-- figures:end -->\n",
    );
    let changed = format!("intro\n\n{}", source.replace("31.10", "31.20"));
    let added = source.replace("| update |", "| idle | 0 |\n| update |");
    fn lines(text: &str) -> Vec<(usize, &str)> {
        figures(text).unwrap()
    }
    assert_eq!(lines(source).first(), Some(&(4, "| what | s |")), "blank lines at the ends are left out");
    assert!(line_diff(&lines(source), &lines(source)).is_empty());
    assert_eq!(line_diff(&lines(source), &lines(&changed)), ["-6: | backlog | 31.10 |", "+8: | backlog | 31.20 |"]);
    assert_eq!(line_diff(&lines(source), &lines(&added)), ["+7: | idle | 0 |"]);
    assert_eq!(line_diff(&lines(&added), &lines(source)), ["-7: | idle | 0 |"]);
    assert_eq!(figures("| a |\n").unwrap_err(), format!("no line {FIGURES_BEGIN}"));
    assert_eq!(figures(&source.replace(FIGURES_END, "")).unwrap_err(), format!("no line {FIGURES_END}"));
    assert_eq!(
        figures(&format!("{FIGURES_END}\n{FIGURES_BEGIN}\n")).unwrap_err(),
        format!("{FIGURES_END} (line 1) before {FIGURES_BEGIN} (line 2)")
    );
    assert!(figures(&format!("{source}{FIGURES_BEGIN}\n")).unwrap_err().contains("more than once"));
}

/// The page whose every case names its test (`<file>::<test name>`).
const THREAT_MODEL: &str = "docs/src/threat-model.md";

/// The `file.rs::name` references of `text` whose file has no `fn name`, and how many it names.
fn missing_tests(root: &Path, text: &str) -> (Vec<String>, usize) {
    let mut missing = Vec::new();
    let mut named = 0;
    for reference in text.split('`').skip(1).step_by(2) {
        let Some((file, name)) = reference.split_once(".rs::") else { continue };
        named += 1;
        let source = std::fs::read_to_string(root.join(format!("{file}.rs"))).unwrap_or_default();
        let defined = source.lines().any(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("async ").unwrap_or(line);
            line.strip_prefix("fn ").is_some_and(|rest| rest.starts_with(&format!("{name}(")))
        });
        if !defined {
            missing.push(reference.to_owned());
        }
    }
    (missing, named)
}

#[test]
fn every_test_the_threat_model_names_exists() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join(THREAT_MODEL)).unwrap();
    let (missing, named) = missing_tests(&root, &text);
    assert!(named >= 10, "{THREAT_MODEL} names {named} tests; every case names one");
    assert!(missing.is_empty(), "{THREAT_MODEL} names tests that do not exist: {missing:?}");
}

#[test]
fn a_threat_model_naming_a_test_that_does_not_exist_is_caught() {
    let root = repo_root();
    let (missing, named) = missing_tests(&root, "`tests/docs.rs::no_such_test` and `tests/docs.rs::repo_root`");
    assert_eq!((missing, named), (vec!["tests/docs.rs::no_such_test".to_owned()], 2));
}
