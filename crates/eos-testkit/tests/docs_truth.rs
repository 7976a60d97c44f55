//! The docs the code leans on stay true, checked against the tree rather than by a reader:
//!
//! - docs/ARCHITECTURE.md's crate table ("Crates") and docs/architecture/crates.md's ("Each crate
//!   in detail") have one row per workspace crate, and their last column names exactly the
//!   workspace crates that crate depends on. The truth is `cargo metadata`, so a crate split
//!   out, added or given a new dependency fails here until the tables say so.
//! - docs/ARCHITECTURE.md's "Where to change X" table names only paths that exist, and every
//!   function or type it names after a path occurs in that file, so a file moved, split or
//!   renamed fails here until the map says where the change is made now.
//! - Every citation of a document's section anywhere in the repository — a comment's
//!   `docs/ARCHITECTURE.md "Outbox"`, a chart's `README "Security"` — names a heading that exists
//!   in that document, so a renamed or moved section cannot leave references leading nowhere.
//!
//! It lives in eos-testkit because that crate is small and every `cargo test --workspace` builds
//! it; it reads files and runs `cargo metadata`, nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The document with the one-line crate table and the "where to change" table.
const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";
/// The crate tables checked against `cargo metadata`: (document, heading of their section).
const CRATE_TABLES: &[(&str, &str)] = &[
    (ARCHITECTURE, "Crates"),
    ("docs/architecture/crates.md", "Each crate in detail"),
];
/// The heading of the section that holds the "where to change" table.
const WHERE_SECTION: &str = "Where to change X";

/// Citations known to be stale in files this repository's docs work does not edit (the Helm
/// chart is maintained on its own; the workspace's Cargo.toml, outbox-relay's source and the
/// integration tests were being changed elsewhere when their sections left
/// docs/ARCHITECTURE.md), each with what it should say. Listed so the check can run everywhere
/// else; an entry that is no longer stale fails the test, so the list only shrinks.
const KNOWN_STALE: &[(&str, &str, &str)] = &[
    (
        "deploy/helm/eos-suite/values.yaml",
        "Processor state on disk",
        "a bold paragraph of the old README, never a heading: docs/ARCHITECTURE.md \
         \"Processor state on disk\"",
    ),
    (
        "deploy/helm/eos-suite/values.yaml",
        "Outbox",
        "moved from the README: docs/outbox.md \"The outbox\"",
    ),
];

/// Directories never scanned for citations: build output, the local stack's state, git.
const SKIPPED_DIRS: &[&str] = &[".git", "target", ".stack", "node_modules"];
/// This file: its scanner test holds citations on purpose.
const THIS_FILE: &str = "crates/eos-testkit/tests/docs_truth.rs";
/// Larger files are data, not prose.
const MAX_SCANNED_BYTES: u64 = 2 * 1024 * 1024;

#[derive(Debug)]
struct Workspace {
    root: PathBuf,
    /// crate name -> (manifest path relative to the root, workspace crates it depends on)
    crates: BTreeMap<String, (String, BTreeSet<String>)>,
}

fn cargo_metadata() -> Workspace {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let root = PathBuf::from(
        metadata["workspace_root"]
            .as_str()
            .expect("workspace_root in cargo metadata"),
    );
    let packages = metadata["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut crates = BTreeMap::new();
    for package in packages {
        let name = package["name"].as_str().expect("package name").to_owned();
        let manifest = package["manifest_path"].as_str().expect("manifest_path");
        let manifest = Path::new(manifest)
            .strip_prefix(&root)
            .unwrap_or(Path::new(manifest))
            .display()
            .to_string();
        // Every kind (normal, build, dev): the table says what a crate links, whatever for.
        let dependencies = package["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["path"].is_string())
            .filter_map(|d| d["name"].as_str())
            .filter(|d| names.contains(*d))
            .map(str::to_owned)
            .collect();
        crates.insert(name, (manifest, dependencies));
    }
    Workspace { root, crates }
}

/// The text of the section under `## heading` (up to the next heading of the same level).
fn section<'a>(markdown: &'a str, heading: &str) -> Option<&'a str> {
    let marker = format!("\n## {heading}\n");
    let start = markdown.find(&marker)? + marker.len();
    let rest = &markdown[start..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    Some(&rest[..end])
}

/// A Markdown table row's cells; a `|` inside backquotes is part of its cell.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim().trim_start_matches('|').trim_end_matches('|');
    let (mut cells, mut cell, mut in_code) = (Vec::new(), String::new(), false);
    for c in row.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                cell.push(c);
            }
            '|' if !in_code => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            _ => cell.push(c),
        }
    }
    cells.push(cell.trim().to_owned());
    cells
}

/// What is between backquotes in `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The rows of the first table in `section` that starts with a header cell `first_header`
/// (header and separator left out), for `document`'s messages.
fn table_rows<'a>(section: &'a str, first_header: &str, document: &str) -> Vec<&'a str> {
    let mut rows = section
        .lines()
        .skip_while(|line| !line.trim_start().starts_with(&format!("| {first_header}")))
        .take_while(|line| line.trim_start().starts_with('|'));
    let header = rows.next().unwrap_or_else(|| {
        panic!("{document} has no table starting `| {first_header} |` where it was looked for")
    });
    let columns = cells(header).len();
    rows.filter(|row| !row.contains("---"))
        .inspect(|row| {
            assert_eq!(
                cells(row).len(),
                columns,
                "{document} table row with another column count than its header: {row}"
            );
        })
        .collect()
}

/// A crate table's rows: crate name -> the workspace crates its last column names.
fn crate_table(
    markdown: &str,
    (document, heading): (&str, &str),
    workspace_crates: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let crates = section(markdown, heading)
        .unwrap_or_else(|| panic!("{document} has no \"## {heading}\" section"));
    let mut table = BTreeMap::new();
    for row in table_rows(crates, "crate", document) {
        let cells = cells(row);
        let name = code_spans(&cells[0])
            .first()
            .unwrap_or_else(|| panic!("{document} crate table row without a `crate` name: {row}"))
            .to_string();
        let dependencies = code_spans(&cells[cells.len() - 1])
            .into_iter()
            .filter(|span| workspace_crates.contains(*span))
            .map(str::to_owned)
            .collect();
        table.insert(name, dependencies);
    }
    table
}

fn list(names: &BTreeSet<String>) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What is stale in the table, one line each; empty when it matches.
fn crate_table_problems(
    table: &BTreeMap<String, BTreeSet<String>>,
    workspace: &Workspace,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, (manifest, dependencies)) in &workspace.crates {
        let Some(listed) = table.get(name) else {
            problems.push(format!(
                "crate `{name}` ({manifest}) has no row; it depends on {}",
                list(dependencies)
            ));
            continue;
        };
        if listed != dependencies {
            let missing: BTreeSet<String> = dependencies.difference(listed).cloned().collect();
            let extra: BTreeSet<String> = listed.difference(dependencies).cloned().collect();
            let mut fix = Vec::new();
            if !missing.is_empty() {
                fix.push(format!("add {}", list(&missing)));
            }
            if !extra.is_empty() {
                fix.push(format!("remove {}", list(&extra)));
            }
            problems.push(format!(
                "`{name}`: the table says it depends on {}, cargo metadata says {}: {}",
                list(listed),
                list(dependencies),
                fix.join("; ")
            ));
        }
    }
    for name in table
        .keys()
        .filter(|name| !workspace.crates.contains_key(*name))
    {
        problems.push(format!(
            "the row `{name}` names no workspace crate: remove it or rename it"
        ));
    }
    problems
}

#[test]
fn the_crate_tables_match_cargo_metadata() {
    let workspace = cargo_metadata();
    let names = workspace.crates.keys().cloned().collect();
    for &(document, heading) in CRATE_TABLES {
        let markdown = fs::read_to_string(workspace.root.join(document))
            .unwrap_or_else(|error| panic!("read {document}: {error}"));
        let table = crate_table(&markdown, (document, heading), &names);
        let problems = crate_table_problems(&table, &workspace);
        assert!(
            problems.is_empty(),
            "{document} \"{heading}\" is stale against `cargo metadata` (the column \"depends on \
             (workspace crates)\" must name exactly the workspace crates each crate depends on):\n  - {}",
            problems.join("\n  - ")
        );
    }
}

/// A place a row of the "where to change" table names: a path from the repository root (a
/// directory when it ends with `/`) and the functions or types that must occur in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    path: String,
    names: Vec<String>,
}

/// Whether `span` is a name as the table writes one: `ident` or `Type::ident`.
fn is_name(span: &str) -> bool {
    span.split("::").all(|segment| {
        segment.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The places one "where" cell names. Every code span is a path (it has a `/`) or a name; a
/// name belongs to the last path before it. Anything else in backquotes is an error, so the
/// table cannot name something this check skips.
fn places(cell: &str) -> Result<Vec<Place>, String> {
    let mut places: Vec<Place> = Vec::new();
    for span in code_spans(cell) {
        if span.contains('/') {
            places.push(Place {
                path: span.to_owned(),
                names: Vec::new(),
            });
        } else if !is_name(span) {
            return Err(format!(
                "`{span}` is neither a path (with a `/`) nor a function or type name: write it \
                 without backquotes"
            ));
        } else if let Some(place) = places.last_mut() {
            place.names.push(span.to_owned());
        } else {
            return Err(format!(
                "`{span}` comes before any path: say which file holds it"
            ));
        }
    }
    if places.is_empty() {
        return Err("no path in backquotes".to_owned());
    }
    Ok(places)
}

/// Whether `word` occurs in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        !text[..at].ends_with(ident) && !text[at + word.len()..].starts_with(ident)
    })
}

/// The texts a place's names are looked for in: the file, or every file under the directory.
fn place_texts(path: &Path) -> Vec<String> {
    if path.is_file() {
        return fs::read_to_string(path).into_iter().collect();
    }
    scanned_files(path)
        .iter()
        .filter_map(|file| fs::read_to_string(file).ok())
        .collect()
}

/// What is wrong with one place, one line each: a path that is not there (or not the kind the
/// trailing `/` says), a name its file does not hold.
fn place_problems(root: &Path, place: &Place) -> Vec<String> {
    let path = root.join(&place.path);
    let exists = if place.path.ends_with('/') {
        path.is_dir()
    } else {
        path.is_file()
    };
    if !exists {
        let kind = if place.path.ends_with('/') {
            "directory"
        } else {
            "file"
        };
        return vec![format!("`{}`: no such {kind}", place.path)];
    }
    let texts = place_texts(&path);
    place
        .names
        .iter()
        .filter(|name| {
            !name
                .split("::")
                .all(|segment| texts.iter().any(|text| has_word(text, segment)))
        })
        .map(|name| format!("`{}` does not hold `{name}`", place.path))
        .collect()
}

#[test]
fn every_place_where_to_change_x_names_exists() {
    let root = cargo_metadata().root;
    let markdown = fs::read_to_string(root.join(ARCHITECTURE)).expect("read the architecture doc");
    let table = section(&markdown, WHERE_SECTION)
        .unwrap_or_else(|| panic!("{ARCHITECTURE} has no \"## {WHERE_SECTION}\" section"));
    let rows = table_rows(table, "to change", ARCHITECTURE);
    assert!(
        rows.len() >= 12,
        "{ARCHITECTURE} \"{WHERE_SECTION}\" has {} rows: the table or its parser is broken",
        rows.len()
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for row in rows {
        let cells = cells(row);
        let (change, cell) = (&cells[0], &cells[cells.len() - 1]);
        match places(cell) {
            Err(problem) => problems.push(format!("\"{change}\": {problem}")),
            Ok(places) => {
                for place in &places {
                    checked += 1;
                    problems.extend(
                        place_problems(&root, place)
                            .into_iter()
                            .map(|problem| format!("\"{change}\": {problem}")),
                    );
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{ARCHITECTURE} \"{WHERE_SECTION}\" names places that are not there ({checked} paths \
         checked); say where the change is made now:\n  - {}",
        problems.join("\n  - ")
    );
}

/// The "where" cells' reading on the forms the table uses, and the errors it must not let pass.
#[test]
fn the_where_table_reader_finds_paths_and_names() {
    let place = |path: &str, names: &[&str]| Place {
        path: path.to_owned(),
        names: names.iter().map(|n| (*n).to_owned()).collect(),
    };
    assert_eq!(
        places("`crates/a/src/x.rs` (`run`, `Loop::decide`); tests in `it/` and `.sqlx/`"),
        Ok(vec![
            place("crates/a/src/x.rs", &["run", "Loop::decide"]),
            place("it/", &[]),
            place(".sqlx/", &[]),
        ])
    );
    assert!(places("`run` in `crates/a/src/x.rs`").is_err());
    assert!(places("`crates/a/src/x.rs` with `--flag`").is_err());
    assert!(places("no code at all").is_err());
    assert!(has_word("fn decide(&self)", "decide"));
    assert!(!has_word("fn decide_all(&self)", "decide"));
    assert!(!has_word("fn undecide(&self)", "decide"));
}

/// One citation: `file` (as written) and the `section` it names, at `line` of the citing file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Citation {
    line: usize,
    file: String,
    section: String,
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

/// Comment leaders that may stand between a cited file and its section, or inside a section
/// broken across lines: Rust, shell/YAML/TOML, SQL, C-style block comments.
const COMMENT_LEADERS: &[&str] = &["//!", "///", "//", "#", "--", "*"];

/// Skips whitespace, commas, backquotes, a possessive `'s` and comment leaders.
fn skip_separators(text: &str) -> &str {
    let mut rest = text;
    loop {
        let trimmed = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',' || c == '`');
        let trimmed = ["'s", "’s"]
            .iter()
            .find_map(|s| trimmed.strip_prefix(s))
            .unwrap_or(trimmed);
        let trimmed = COMMENT_LEADERS
            .iter()
            .find_map(|leader| trimmed.strip_prefix(leader))
            .unwrap_or(trimmed);
        if trimmed.len() == rest.len() {
            return rest;
        }
        rest = trimmed;
    }
}

/// The section name in quotes at the start of `text` (a JSON string's `\"` too), its line breaks
/// and comment leaders folded into single spaces.
fn quoted_section(text: &str) -> Option<String> {
    let text = text.strip_prefix('\\').unwrap_or(text);
    let body = text.strip_prefix('"')?;
    let end = body.find('"')?;
    let raw = body[..end].strip_suffix('\\').unwrap_or(&body[..end]);
    // A section's name is prose: code between two quotes is not one.
    let starts_as_prose = raw.starts_with(|c: char| c.is_alphanumeric());
    if !starts_as_prose || raw.len() > 120 || raw.contains(['\\', ';', '{', '}', '=', '<', '>']) {
        return None;
    }
    let words: Vec<&str> = raw
        .split_whitespace()
        .filter(|word| !COMMENT_LEADERS.contains(word))
        .collect();
    Some(words.join(" "))
}

/// Every citation in `text`: a Markdown file's path or `README`, then (after a space, a comma,
/// a possessive or a line break with its comment leader) the section's name in double quotes.
/// A quote right after the name is a string literal's end, not a citation.
fn citations(text: &str) -> Vec<Citation> {
    let mut found = Vec::new();
    for (at, _) in text
        .match_indices(".md")
        .chain(text.match_indices("README"))
    {
        let (file_start, file_end) = if text[at..].starts_with(".md") {
            let end = at + 3;
            if text[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                continue;
            }
            let start = text[..at]
                .char_indices()
                .rev()
                .take_while(|(_, c)| is_path_char(*c))
                .last()
                .map_or(at, |(i, _)| i);
            (start, end)
        } else {
            let end = at + "README".len();
            let word_before =
                text[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '/');
            if word_before
                || text[end..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '.' || c == '_')
            {
                continue;
            }
            (at, end)
        };
        let file = text[file_start..file_end].trim_start_matches(['.', '/']);
        if file == ".md" || file.is_empty() {
            continue;
        }
        let after = &text[file_end..];
        let separated = skip_separators(after);
        if separated.len() == after.len() {
            continue;
        }
        let Some(section) = quoted_section(separated) else {
            continue;
        };
        found.push(Citation {
            line: text[..at].matches('\n').count() + 1,
            file: file.to_owned(),
            section,
        });
    }
    found.sort_by_key(|c| c.line);
    found
}

/// The headings of a Markdown document, outside code fences, as a citation names them: without
/// backquotes, a leading "1. " or a trailing `{#anchor}`.
fn headings(markdown: &str) -> BTreeSet<String> {
    let mut in_fence = false;
    let mut headings = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if in_fence || !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let mut heading = line[hashes..].trim().replace('`', "");
        if let Some(anchor) = heading.rfind(" {#") {
            heading.truncate(anchor);
        }
        let numbered = heading
            .split_once(". ")
            .filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit()));
        if let Some((_, rest)) = numbered {
            heading = rest.to_owned();
        }
        headings.insert(heading);
    }
    headings
}

/// The document a citation in `citing` (relative to the root) means: `README` is the
/// repository's; a path with a directory is from the root; a bare name is in docs/, else beside
/// the citing file.
fn cited_document(root: &Path, citing: &Path, file: &str) -> PathBuf {
    if file == "README" {
        return root.join("README.md");
    }
    let beside = citing.parent().map(|dir| root.join(dir).join(file));
    let candidates = if file.contains('/') {
        vec![Some(root.join(file)), beside]
    } else {
        vec![
            Some(root.join("docs").join(file)),
            beside,
            Some(root.join(file)),
        ]
    };
    candidates
        .iter()
        .flatten()
        .find(|path| path.is_file())
        .cloned()
        .unwrap_or_else(|| root.join(file))
}

fn scanned_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("read a directory").flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && !SKIPPED_DIRS.contains(&name.as_str()) {
                dirs.push(path);
            } else if kind.is_file()
                && name != "Cargo.lock"
                && entry.metadata().is_ok_and(|m| m.len() <= MAX_SCANNED_BYTES)
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_cited_section_exists() {
    let root = cargo_metadata().root;
    let mut cache: BTreeMap<PathBuf, Option<BTreeSet<String>>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut known_stale_seen = BTreeSet::new();
    let mut count = 0;
    for path in scanned_files(&root) {
        let Ok(text) = fs::read_to_string(&path) else {
            continue; // not UTF-8: not prose
        };
        let relative = path
            .strip_prefix(&root)
            .expect("under the root")
            .to_path_buf();
        if relative == Path::new(THIS_FILE) {
            continue;
        }
        for citation in citations(&text) {
            count += 1;
            let document = cited_document(&root, &relative, &citation.file);
            let shown = document
                .strip_prefix(&root)
                .unwrap_or(&document)
                .display()
                .to_string();
            let headings = cache
                .entry(document.clone())
                .or_insert_with(|| fs::read_to_string(&document).ok().map(|md| headings(&md)));
            let known = KNOWN_STALE.iter().find(|(file, section, _)| {
                relative == Path::new(file) && *section == citation.section
            });
            let at = format!("{}:{}", relative.display(), citation.line);
            match (headings, known) {
                (None, _) => problems.push(format!(
                    "{at} cites {} \"{}\", and there is no {shown}",
                    citation.file, citation.section
                )),
                (Some(headings), _) if headings.contains(&citation.section) => {
                    if let Some((file, section, _)) = known {
                        problems.push(format!(
                            "{file} \"{section}\" is in KNOWN_STALE but resolves now: remove the entry"
                        ));
                    }
                }
                (Some(_), Some(known)) => {
                    known_stale_seen.insert(*known);
                }
                (Some(headings), None) => problems.push(format!(
                    "{at} cites {} \"{}\": {shown} has no such heading (it has: {})",
                    citation.file,
                    citation.section,
                    headings
                        .iter()
                        .map(|h| format!("\"{h}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
    }
    for known in KNOWN_STALE
        .iter()
        .filter(|k| !known_stale_seen.contains(*k))
    {
        problems.push(format!(
            "KNOWN_STALE lists {} \"{}\", which is cited there no more: remove the entry",
            known.0, known.1
        ));
    }
    assert!(
        count > 50,
        "only {count} citations found: the scanner is broken"
    );
    assert!(
        problems.is_empty(),
        "citations of document sections that do not exist ({count} checked):\n  - {}",
        problems.join("\n  - ")
    );
}

/// The scanner on the forms the repository uses: a check that finds nothing proves nothing.
#[test]
fn the_scanner_finds_every_form_of_citation() {
    let text = concat!(
        "//! see docs/ARCHITECTURE.md \"Outbox\" and docs/ARCHITECTURE.md, \"Loop invariants\".\n",
        "/// (`docs/ARCHITECTURE.md` \"Pitfalls\"; docs/ARCHITECTURE.md's \"Latency\")\n",
        "-- The envelope's rules (docs/ARCHITECTURE.md\n",
        "-- \"Wire format\").\n",
        "# The README's \"Run with\n# Docker Compose\" section\n",
        "{\"content\": \"a tree (README \\\"eosctl\\\")\"}\n",
        "[MODEL_CHECKING.md](MODEL_CHECKING.md) \"a link, not a citation\"\n",
        "docs/ARCHITECTURE.md says \"no citation\" here; READMEs \"nor\" here; a README.md.\n",
        "const PAGE: &str = \"cli.md\"; if file == \"README\" { x(\"y\") }\n",
        "README \"<section>\" and docs/X.md \"a = b;\" are no citations either\n",
    );
    let found: Vec<(usize, String, String)> = citations(text)
        .into_iter()
        .map(|c| (c.line, c.file, c.section))
        .collect();
    let expected = [
        (1, "docs/ARCHITECTURE.md", "Outbox"),
        (1, "docs/ARCHITECTURE.md", "Loop invariants"),
        (2, "docs/ARCHITECTURE.md", "Pitfalls"),
        (2, "docs/ARCHITECTURE.md", "Latency"),
        (3, "docs/ARCHITECTURE.md", "Wire format"),
        (5, "README", "Run with Docker Compose"),
        (7, "README", "eosctl"),
    ]
    .map(|(line, file, section)| (line, file.to_owned(), section.to_owned()));
    assert_eq!(found, expected);
    let headings = headings(
        "# Title\n## 4. Prove it: the replay audit\n```\n## not one\n```\n### `eosctl` {#cli}\n",
    );
    assert_eq!(
        headings,
        ["Title", "Prove it: the replay audit", "eosctl"]
            .map(str::to_owned)
            .into()
    );
}
