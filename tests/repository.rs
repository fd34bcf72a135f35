//! Repository rules that no compiler checks: the documentation is true of the code (every
//! variable the code reads is documented with its default, and nothing documented is unread;
//! every relative link and anchor resolves; the README stays short; the version users cite is
//! the changelog's newest; user pages carry no development history; every line a page quotes
//! is the code's words, and every finding id is documented and real), CI runs the README's
//! test command, and the no-I/O layers stay free of verbs, CUDA and the environment.
#![allow(clippy::unwrap_used)] // test helpers panic with context

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use nccl_net::core::config::{KNOBS, NOT_IMPLEMENTED};
use nccl_net::doctor::NCCL_VARIABLES;

const CONFIGURATION: &str = "docs/configuration.md";
const DEVELOPMENT: &str = "docs/development.md";
const README_MAX_LINES: usize = 300;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: impl AsRef<Path>) -> String {
    let path = root().join(path);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Files under `dir` (recursively) whose name ends with `ext`, as paths relative to the root.
fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, ext, out);
            } else if path.to_string_lossy().ends_with(ext) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(dir), ext, &mut out);
    out.sort();
    out.into_iter()
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect()
}

/// Every Markdown page users read: the README, the changelog and `docs/`.
fn markdown_pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md"), PathBuf::from("CHANGELOG.md")];
    pages.extend(files("docs", ".md"));
    pages
}

/// The user pages that describe the current code only (not the changelog or the dated record
/// of earlier builds).
fn current_state_pages() -> Vec<PathBuf> {
    markdown_pages()
        .into_iter()
        .filter(|p| !p.starts_with("docs/history") && *p != Path::new("CHANGELOG.md"))
        .collect()
}

/// The text outside fenced code blocks.
fn prose(markdown: &str) -> String {
    let mut fenced = false;
    markdown
        .lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Table rows whose first cell is one backticked variable name: name → second cell.
fn variable_rows(markdown: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    for line in prose(markdown).lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[0].is_empty() {
            continue;
        }
        let Some(name) = cells[1].strip_prefix('`').and_then(|c| c.strip_suffix('`')) else {
            continue;
        };
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            let previous = rows.insert(name.to_owned(), cells[2].replace('`', ""));
            assert!(previous.is_none(), "{name} has two rows");
        }
    }
    rows
}

/// String literals passed to `call(` in `text`, e.g. `var_os("HOME")` → `HOME`.
fn literal_arguments(text: &str, call: &str) -> Vec<String> {
    text.match_indices(&format!("{call}(\""))
        .filter_map(|(at, m)| {
            let rest = &text[at + m.len()..];
            let name = &rest[..rest.find('"')?];
            name.chars()
                .all(|c| c.is_ascii_uppercase() || c == '_')
                .then(|| name.to_owned())
        })
        .collect()
}

/// Every environment variable the plugin, the doctor and the tools read: the declared knobs,
/// the named-only options, NCCL's own variables the doctor weighs, and any name the sources
/// read by literal (so a read added outside those lists is caught too).
fn variables_the_code_reads() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = KNOBS
        .iter()
        .chain(NOT_IMPLEMENTED)
        .map(|k| k.name.to_owned())
        .chain(NCCL_VARIABLES.iter().map(|(name, _)| (*name).to_owned()))
        .collect();
    for file in files("src", ".rs").into_iter().chain(files("src", ".c")) {
        let text = read(&file);
        for call in ["var_os", "env::var", "env", "getenv"] {
            names.extend(literal_arguments(&text, call));
        }
    }
    names
}

/// The `NCCL_NET_RS_*` names in `text`; the prefix alone (a family name) is left out.
fn plugin_variable_names(text: &str) -> Vec<String> {
    text.match_indices("NCCL_NET_RS_")
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.ends_with('_'))
        .collect()
}

/// `NCCL_NET_RS_*` names the scripts read, beyond the plugin's own.
fn script_variables() -> BTreeSet<String> {
    let names: BTreeSet<String> = files("scripts", ".sh")
        .iter()
        .flat_map(|file| plugin_variable_names(&read(file)))
        .collect();
    let knobs: BTreeSet<String> = KNOBS.iter().map(|k| k.name.to_owned()).collect();
    &names - &knobs
}

#[test]
fn the_configuration_page_documents_exactly_the_variables_the_code_reads() {
    let documented = variable_rows(&read(CONFIGURATION));
    let documented_names: BTreeSet<String> = documented.keys().cloned().collect();
    let read_by_code = variables_the_code_reads();
    let missing: Vec<_> = read_by_code.difference(&documented_names).collect();
    let unread: Vec<_> = documented_names.difference(&read_by_code).collect();
    assert!(
        missing.is_empty(),
        "{CONFIGURATION} has no table row for {missing:?}: add one (name, default, meaning)"
    );
    assert!(
        unread.is_empty(),
        "{CONFIGURATION} documents {unread:?}, which no code reads: remove the rows, or declare \
         the variables in src/core/config.rs"
    );
}

#[test]
fn documented_defaults_are_the_codes_defaults() {
    let documented = variable_rows(&read(CONFIGURATION));
    for knob in KNOBS.iter().chain(NOT_IMPLEMENTED) {
        let cell = &documented[knob.name];
        assert!(
            cell.starts_with(knob.default),
            "{CONFIGURATION} gives {} the default '{cell}', src/core/config.rs '{}'",
            knob.name,
            knob.default
        );
    }
}

#[test]
fn the_development_page_documents_the_scripts_variables() {
    let documented: BTreeSet<String> = variable_rows(&read(DEVELOPMENT)).into_keys().collect();
    assert_eq!(
        documented,
        script_variables(),
        "{DEVELOPMENT}'s variable table and the NCCL_NET_RS_* names scripts/ reads differ"
    );
}

#[test]
fn every_plugin_variable_the_pages_name_exists() {
    let known: BTreeSet<String> = &variables_the_code_reads() | &script_variables();
    for page in markdown_pages() {
        if page.starts_with("docs/history") {
            continue;
        }
        for name in plugin_variable_names(&read(&page)) {
            assert!(
                known.contains(&name),
                "{} names {name}, which nothing reads",
                page.display()
            );
        }
    }
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces as hyphens.
fn slug(heading: &str) -> String {
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

/// The anchors of a page's headings, with GitHub's `-1`, `-2` for repeated ones.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(markdown).lines() {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let base = slug(heading.trim_start_matches('#'));
        let count = seen.entry(base.clone()).or_default();
        out.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    out
}

/// Targets of inline links `[text](target)` outside code.
fn link_targets(markdown: &str) -> Vec<String> {
    let text = prose(markdown);
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            Some(rest[..rest.find(')')?].to_owned())
        })
        .collect()
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for page in markdown_pages() {
        for target in link_targets(&read(&page)) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            if !root().join(&file).exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if !anchor.is_empty() && !anchors(&read(&file)).contains(anchor) {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_stays_short() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines (at most {README_MAX_LINES}): move reference material to docs/"
    );
}

#[test]
fn user_pages_carry_no_development_history() {
    // A user cannot follow these: issue numbers of this project's tracker, files outside the
    // repository, commit hashes as narrative, and "this build" (which build?).
    let forbidden = ["issue #", "../shared", "nccl-net-abi.md", "this build"];
    for page in current_state_pages() {
        let text = read(&page);
        for phrase in forbidden {
            assert!(
                !text.to_lowercase().contains(phrase),
                "{} says '{phrase}': history goes in CHANGELOG.md or docs/history/",
                page.display()
            );
        }
        let hashes: Vec<&str> = text
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| {
                w.len() == 7
                    && w.chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                    && w.chars().any(|c| c.is_ascii_digit())
                    && w.chars().any(|c| c.is_ascii_alphabetic())
            })
            .collect();
        assert!(
            hashes.is_empty(),
            "{} names commits {hashes:?}: history goes in CHANGELOG.md or docs/history/",
            page.display()
        );
    }
}

#[test]
fn the_version_users_cite_is_the_changelogs_newest() {
    let version = env!("CARGO_PKG_VERSION");
    let changelog = read("CHANGELOG.md");
    let newest = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## "))
        .and_then(|h| h.split_whitespace().next())
        .unwrap();
    assert_eq!(
        newest, version,
        "Cargo.toml says {version}, CHANGELOG.md's newest entry {newest}: add the entry"
    );
    assert!(
        read("README.md").contains(&format!("Version {version}")),
        "README.md must name version {version}"
    );
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = read("README.md");
    assert!(
        readme.contains("scripts/test.sh"),
        "README must name the test command"
    );
    assert!(
        read(".ci/run").contains("scripts/test.sh"),
        ".ci/run must call the README's test command"
    );
}

#[test]
fn core_and_topology_do_no_verbs_cuda_or_environment_access() {
    let mut sources = files("src/core", ".rs");
    sources.extend(files("src/topology", ".rs"));
    assert!(!sources.is_empty());
    for path in sources {
        let text = read(&path);
        for forbidden in ["rdma_sys", "cudarc", "std::env::var", "env::vars", "\"/sys"] {
            // SysfsRoot's default is the one place the real /sys is named.
            if forbidden == "\"/sys" && path.ends_with("sysfs.rs") {
                continue;
            }
            let offending = text.lines().filter(|l| l.contains(forbidden)).count();
            assert_eq!(
                offending,
                0,
                "{} uses `{forbidden}`: that belongs in verbs/, gpu or plugin.rs",
                path.display()
            );
        }
    }
}

/// Every string literal in `src/`, escapes and line continuations resolved, whitespace runs as
/// one space, backticks dropped (a page's code span cannot hold them), each `{...}` placeholder
/// as a NUL (which no quoted phrase holds), one literal per line.
fn source_literals() -> String {
    let mut out = String::new();
    for file in files("src", ".rs") {
        let text = read(&file);
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                // Comments quote freely: skip them.
                '/' if chars.peek() == Some(&'/') => {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            break;
                        }
                    }
                    continue;
                }
                // A char literal ('"', '\'') or a lifetime ('a).
                '\'' => {
                    let mut ahead = chars.clone();
                    match (ahead.next(), ahead.next()) {
                        (Some('\\'), _) => {
                            chars.next();
                            chars.next();
                            chars.next();
                        }
                        (Some(_), Some('\'')) => {
                            chars.next();
                            chars.next();
                        }
                        _ => {}
                    }
                    continue;
                }
                '"' => {}
                _ => continue,
            }
            let mut raw = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next() {
                        // A continuation: the newline and the next line's indentation go.
                        Some('\n') => {
                            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                                chars.next();
                            }
                        }
                        Some('n' | 't') => raw.push(' '),
                        Some(other) => raw.push(other),
                        None => {}
                    },
                    _ => raw.push(c),
                }
            }
            out.push_str(&normalized(&raw));
            out.push('\n');
        }
    }
    out
}

fn normalized(raw: &str) -> String {
    let mut out = String::new();
    let mut in_placeholder = false;
    for c in raw.chars().filter(|&c| c != '`') {
        match c {
            '{' if !in_placeholder => {
                in_placeholder = true;
                out.push('\0');
            }
            '}' if in_placeholder => in_placeholder = false,
            _ if in_placeholder => {}
            c if c.is_whitespace() => {
                if !out.ends_with(' ') {
                    out.push(' ');
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether `phrase` is part of what `literal` can print, its NULs (placeholders) taking any
/// text: the phrase matches from some position of the literal to a later one, with at least 8
/// of its characters, and a third, matched by the literal's own.
fn printable_by(literal: &[char], phrase: &str) -> bool {
    let n = literal.len();
    // Per position of the literal reachable after the phrase read so far (any start): the
    // most characters matched literally on the way there.
    let mut states: Vec<Option<usize>> = vec![Some(0); n + 1];
    for c in phrase.chars() {
        for j in 0..n {
            if let (Some(k), '\0') = (states[j], literal[j]) {
                states[j + 1] = states[j + 1].max(Some(k));
            }
        }
        let mut next = vec![None; n + 1];
        for j in 0..n {
            let Some(k) = states[j] else { continue };
            if literal[j] == '\0' {
                next[j] = next[j].max(Some(k));
            } else if literal[j] == c {
                next[j + 1] = next[j + 1].max(Some(k + 1));
            }
        }
        states = next;
        if states.iter().all(Option::is_none) {
            return false;
        }
    }
    let matched = states.into_iter().flatten().max().unwrap_or(0);
    matched >= 8 && 3 * matched >= phrase.chars().count()
}

/// The phrases of a quoted part that must be the code's own words: runs of three or more
/// words between punctuation (`:`, `;`, brackets, commas) and between words that vary from run
/// to run: those with a digit (a count, an address, a device name) and a page's own
/// placeholders in capitals (`ADDR`, `X`).
fn phrases(part: &str) -> Vec<String> {
    let mut out = Vec::new();
    for clause in part.split([':', ';', '(', ')', '[', ']', ',']) {
        let mut run: Vec<&str> = Vec::new();
        for word in clause.split_whitespace().chain(std::iter::once("0")) {
            let placeholder = word.len() <= 8
                && word.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !word.starts_with("NCCL");
            if placeholder || word.chars().any(|c| c.is_ascii_digit()) {
                if run.len() >= 3 {
                    out.push(run.join(" "));
                }
                run.clear();
            } else {
                run.push(word);
            }
        }
    }
    out
}

/// The code spans of `markdown` (single backticks), whitespace runs as one space.
fn code_spans(markdown: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut in_fence = false;
    let mut text = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            text.push_str(line);
            text.push('\n');
        }
    }
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 1 {
            spans.push(span.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    spans
}

/// The parts of a quoted line the page wrote itself: split at its own elisions (`...`, `<x>`).
fn quoted_parts(span: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut chars = span.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '<' {
            for d in chars.by_ref() {
                if d == '>' {
                    break;
                }
            }
            parts.push(std::mem::take(&mut part));
        } else if c == '.' && span[span.len() - chars.clone().count() - 1..].starts_with("...") {
            chars.next();
            chars.next();
            parts.push(std::mem::take(&mut part));
        } else if c == '…' {
            parts.push(std::mem::take(&mut part));
        } else {
            part.push(c);
        }
    }
    parts.push(part);
    parts
        .into_iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| p.split_whitespace().count() >= 3)
        .collect()
}

/// Whether a code span quotes something other than the plugin's or the doctor's words: a
/// command line, code, a package relation, or a line NCCL, libibverbs or the C library prints.
fn quotes_someone_else(span: &str) -> bool {
    const NOT_OURS: &[&str] = &[
        // NCCL's own log lines.
        "NET/Plugin:",
        "Using network",
        "# ",
        // The format of a finding line, described.
        "SEVERITY ",
        // Code and package metadata.
        "fn ",
        "test = ",
        "libc6 ",
        "libibverbs1 ",
        "dlopen(",
    ];
    let first = span.split_whitespace().next().unwrap_or("");
    NOT_OURS.iter().any(|p| span.starts_with(p))
        || span.contains(" --")
        || span.contains(" | ")
        || span.contains("\\|")
        || span.contains(" × ")
        || span.contains(" mod ")
        || first.contains('/') && !first.starts_with("NET/")
        || first.contains('=')
        || [
            "cargo",
            "kubectl",
            "dpkg",
            "rdma",
            "ip",
            "nccl-net-bench",
            "nccl-net-doctor",
        ]
        .contains(&first)
}

/// Words in the plugin's lines that other software wrote: libibverbs' status strings, the C
/// library's error strings, NCCL's own log lines around them.
const OTHERS_WORDS: &[&str] = &[
    "transport retry counter exceeded",
    "Cannot allocate memory",
    "Too many open files",
    "Function not implemented",
    "connection timed out",
    "Loaded net plugin RsIB",
    "NCCL WARN init failed",
];

/// A finding line as the doctor prints it (`WARN mtu rxe1: what`): the line's own words are
/// what follows the entity.
fn finding_text(span: &str) -> &str {
    const SEVERITIES: [&str; 6] = ["FAIL ", "WARN ", "UNKNOWN ", "SKIP ", "INFO ", "PASS "];
    match span.split_once(": ") {
        Some((_, what)) if SEVERITIES.iter().any(|s| span.starts_with(s)) => what,
        _ => span,
    }
}

#[test]
fn every_line_the_pages_quote_is_one_the_code_prints() {
    let literals: Vec<Vec<char>> = source_literals()
        .lines()
        .map(|l| l.chars().collect())
        .collect();
    let mut unknown = Vec::new();
    for page in current_state_pages() {
        for span in code_spans(&read(&page)) {
            if quotes_someone_else(&span) {
                continue;
            }
            for phrase in quoted_parts(finding_text(&span))
                .iter()
                .flat_map(|p| phrases(p))
                .filter(|p| !OTHERS_WORDS.contains(&p.as_str()))
            {
                let first: Vec<char> = phrase.split(' ').next().unwrap_or("").chars().collect();
                let found = literals.iter().any(|l| {
                    l.windows(first.len()).any(|w| w == first.as_slice())
                        && printable_by(l, &phrase)
                }) || literals.iter().any(|l| printable_by(l, &phrase));
                if !found {
                    unknown.push(format!("{}: `{phrase}` (in `{span}`)", page.display()));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "{} phrase(s) of quoted lines that no string in src/ holds (reword the page to the \
         code's words):\n{}",
        unknown.len(),
        unknown.join("\n")
    );
}

/// Whether `s` has the shape of a finding's check id (`pair.devices`, `gdr.peermem`) with one of
/// the doctor's check prefixes.
fn check_id_shape(s: &str, prefixes: &BTreeSet<&str>) -> bool {
    s.split_once('.').is_some_and(|(prefix, rest)| {
        prefixes.contains(prefix)
            && !rest.is_empty()
            && rest
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
    })
}

/// Every finding id the doctor emits is named on its page, and every id a page names is one
/// the code emits (`pair.devices` was emitted and named nowhere).
#[test]
fn every_finding_id_is_documented_and_every_documented_id_exists() {
    let mut prefixes: BTreeSet<&str> = nccl_net::doctor::CHECKS
        .iter()
        .filter_map(|(id, _)| id.split_once('.').map(|(p, _)| p))
        .collect();
    prefixes.insert("pair");
    let emitted: BTreeSet<String> = source_literals()
        .lines()
        .filter(|l| check_id_shape(l, &prefixes))
        .map(str::to_owned)
        .chain(
            nccl_net::doctor::CHECKS
                .iter()
                .map(|(id, _)| (*id).to_owned()),
        )
        .collect();
    let doctor_page: BTreeSet<String> = code_spans(&read("docs/doctor.md")).into_iter().collect();
    let undocumented: Vec<_> = emitted
        .iter()
        .filter(|id| !doctor_page.contains(*id))
        .collect();
    assert!(
        undocumented.is_empty(),
        "docs/doctor.md names no finding {undocumented:?}: add a row"
    );
    for page in current_state_pages() {
        for span in code_spans(&read(&page)) {
            assert!(
                !check_id_shape(&span, &prefixes) || emitted.contains(&span),
                "{}: `{span}` is no finding the doctor emits",
                page.display()
            );
        }
    }
}
