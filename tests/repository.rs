//! Repository rules that no compiler checks: the documentation is true of the code (every
//! variable the code reads is documented with its default, and nothing documented is unread;
//! every relative link and anchor resolves; the README stays short; the version users cite is
//! the changelog's newest; user pages carry no development history), CI runs the README's test
//! command, and the no-I/O layers stay free of verbs, CUDA and the environment.
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
