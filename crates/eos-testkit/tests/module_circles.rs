//! The house rule of no module circles (docs/CODE_STYLE.md "The shape of a service"), checked
//! against the tree: inside every crate of the workspace, no source file uses a module that uses
//! it back, directly or through others.
//! A circle means two files each know the other's inside, so neither can be read, changed or
//! tested alone; the fix is the type they share in a module of its own that both use.
//!
//! A file's uses are its `crate::…` paths (and a child module's `super::…`), outside comments
//! and its `#[cfg(test)] mod tests`; each names the longest module path it starts with. It lives
//! in eos-testkit beside docs_truth.rs: it reads files, nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every crate's `src` directory under the workspace.
fn crate_sources(workspace: &Path) -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = fs::read_dir(workspace.join("crates"))
        .expect("crates/ is readable")
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    sources.push(workspace.join("integration-tests/src"));
    sources.sort();
    sources
}

/// Each `.rs` file under `src` by its module path (`lib`/`main` for the roots, `a::b` for
/// `a/b.rs` or `a/b/mod.rs`), with the code that counts: no comment lines, no test module.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("the source tree is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|last| last == "mod") {
                parts.pop();
            }
            let text = fs::read_to_string(&path).expect("a source file is readable");
            found.insert(parts.join("::"), code_that_counts(&text));
        }
    }
    found
}

fn code_that_counts(text: &str) -> String {
    let before_tests = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    before_tests
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths `code` names after `crate::` (a `{…}` group gives each of its members).
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // `eos_schema::crate::…` cannot occur; `$crate::` in a macro is not a module path.
        let preceded = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if preceded.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for member in group[..end].split(',') {
                paths.push(path_segments(member.trim()));
            }
        } else {
            paths.push(path_segments(rest));
        }
    }
    paths
}

/// The leading `a::b::c` of `text`, as segments.
fn path_segments(text: &str) -> Vec<String> {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    text[..end]
        .split("::")
        .filter(|segment| !segment.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Which modules each module uses, by the longest known module path each reference starts with.
fn uses(modules: &BTreeMap<String, String>) -> BTreeMap<&str, BTreeSet<&str>> {
    let known: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    let longest = |segments: &[String]| {
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find_map(|candidate| known.get(candidate.as_str()).copied())
    };
    let mut graph = BTreeMap::new();
    for (module, code) in modules {
        let mut used = BTreeSet::new();
        for segments in crate_paths(code) {
            if let Some(target) = longest(&segments) {
                used.insert(target);
            }
        }
        // A child's `super::x`: its parent module, or the parent's child `x`.
        if let Some((parent, _)) = module.rsplit_once("::") {
            let mut rest = code.as_str();
            while let Some(at) = rest.find("super::") {
                rest = &rest[at + "super::".len()..];
                let mut segments: Vec<String> = parent.split("::").map(str::to_owned).collect();
                segments.extend(path_segments(rest));
                if let Some(target) = longest(&segments) {
                    used.insert(target);
                }
            }
        }
        used.remove(module.as_str());
        graph.insert(module.as_str(), used);
    }
    graph
}

/// The circles of `graph`: its strongly connected parts of more than one module (Tarjan).
fn circles<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct Search<'a, 'g> {
        graph: &'g BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<&'a str>>,
    }
    impl<'a> Search<'a, '_> {
        fn visit(&mut self, node: &'a str) {
            let next = self.index.len();
            self.index.insert(node, next);
            self.low.insert(node, next);
            self.stack.push(node);
            self.on_stack.insert(node);
            for &used in self.graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(used) {
                    self.visit(used);
                    let low = self.low[node].min(self.low[used]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(used) {
                    let low = self.low[node].min(self.index[used]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut part = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    part.push(member);
                    if member == node {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort_unstable();
                    self.found.push(part);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for &node in graph.keys() {
        if !search.index.contains_key(node) {
            search.visit(node);
        }
    }
    search.found
}

#[test]
fn no_crate_has_a_module_circle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace is two levels up");
    let mut found = Vec::new();
    for src in crate_sources(workspace) {
        let modules = modules(&src);
        for circle in circles(&uses(&modules)) {
            found.push(format!("{}: {}", src.display(), circle.join(" ↔ ")));
        }
    }
    assert!(
        found.is_empty(),
        "module circles (docs/CODE_STYLE.md \"The shape of a service\": move what the \
         modules share into a module both use):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_circle_is_found_through_groups_super_and_a_third_module() {
    let modules: BTreeMap<String, String> = [
        ("a", "use crate::{b::Thing, c};"),
        ("b", "use crate::c::Other;"),
        ("c", "fn f() -> crate::a::X { todo() }"),
        ("d", "// use crate::e::Y;\nuse crate::a;"),
        ("e", "use crate::d::Z;"),
        ("p", "mod q;"),
        ("p::q", "use super::Parent;"),
        ("r", "use crate::p::q::Child;"),
    ]
    .into_iter()
    .map(|(name, code)| (name.to_owned(), code_that_counts(code)))
    .collect();
    let graph = uses(&modules);
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
    assert!(graph["p::q"].contains("p"), "{graph:?}");
    assert!(!graph["d"].contains("e"), "a comment is not a use");
    let tests_only =
        code_that_counts("use crate::x;\n#[cfg(test)]\nmod tests {\n use crate::y;\n}");
    assert!(tests_only.contains("crate::x") && !tests_only.contains("crate::y"));
}
