//! The layering of ARCHITECTURE.md, checked on the sources: `main` → `cli` → one module per
//! pipeline stage → base modules. A stage never names another stage (stages hand data over
//! through the project file, so each can be re-run or replaced on its own), and a base module
//! names neither a stage nor `cli`. Every `crate::NAME` path counts: `use` statements, inline
//! paths and `crate::{A, B}` groups, test modules included; comment lines do not.

use std::fmt;
use std::path::{Path, PathBuf};

/// The pipeline stages: one module each, none of which may name another.
const STAGES: [&str; 9] = [
    "adapt", "af", "aflite", "annotate", "assemble", "audit", "export", "generate", "ingest",
];

/// The command line, above the stages: it may name anything.
const CLI: &str = "cli";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layer {
    Cli,
    Stage,
    Base,
}

fn layer(module: &str) -> Layer {
    if module == CLI {
        Layer::Cli
    } else if STAGES.contains(&module) {
        Layer::Stage
    } else {
        Layer::Base
    }
}

/// A `crate::` path that crosses the layering.
#[derive(Debug, PartialEq)]
struct Violation {
    file: String,
    line: usize,
    from: String,
    to: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} imports {}",
            self.file,
            self.line,
            described(&self.from),
            described(&self.to)
        )
    }
}

/// "stage export", "base module store" or "cli".
fn described(module: &str) -> String {
    match layer(module) {
        Layer::Stage => format!("stage {module}"),
        Layer::Base => format!("base module {module}"),
        Layer::Cli => module.to_string(),
    }
}

/// Whether a module of layer `from` may name module `to`.
fn allowed(from: &str, to: &str) -> bool {
    from == to
        || match (layer(from), layer(to)) {
            (Layer::Cli, _) => true,
            (_, Layer::Base) => true,
            (Layer::Stage | Layer::Base, Layer::Stage | Layer::Cli) => false,
        }
}

fn is_identifier_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn identifier_at(text: &str, at: usize) -> &str {
    let end = text[at..]
        .bytes()
        .position(|b| !is_identifier_byte(b))
        .map_or(text.len(), |n| at + n);
    &text[at..end]
}

/// Byte offset → 1-based line number.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].bytes().filter(|&b| b == b'\n').count() + 1
}

/// The top-level names of the `{...}` group that starts at `open`, with their byte offsets.
fn group_names(text: &str, open: usize) -> Vec<(usize, &str)> {
    let mut names = Vec::new();
    let mut depth = 0;
    let mut expect_name = true;
    for (i, b) in text.bytes().enumerate().skip(open) {
        match b {
            b'{' => {
                depth += 1;
                expect_name = depth == 1;
            }
            b'}' if depth == 1 => break,
            b'}' => depth -= 1,
            b',' if depth == 1 => expect_name = true,
            _ if expect_name && depth == 1 && is_identifier_byte(b) => {
                names.push((i, identifier_at(text, i)));
                expect_name = false;
            }
            _ => {}
        }
    }
    names
}

/// Every module named by a `crate::` path in `source`, with its line. Comment lines are blanked
/// first, so that prose mentioning a module does not count.
fn crate_references(source: &str) -> Vec<(usize, String)> {
    let code: String = source
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let preceded = at > 0 && {
            let b = code.as_bytes()[at - 1];
            is_identifier_byte(b) || b == b'$'
        };
        if preceded {
            continue;
        }
        let after = at + "crate::".len();
        if code[after..].starts_with('{') {
            for (offset, name) in group_names(&code, after) {
                if name != "self" {
                    out.push((line_of(&code, offset), name.to_string()));
                }
            }
        } else {
            let name = identifier_at(&code, after);
            if !name.is_empty() {
                out.push((line_of(&code, at), name.to_string()));
            }
        }
    }
    out
}

/// The top-level module a file under `src/` belongs to (`src/store/af.rs` → `store`); `None`
/// for the crate roots.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn violations_in(file: &str, module: &str, source: &str) -> Vec<Violation> {
    crate_references(source)
        .into_iter()
        .filter(|(_, to)| !allowed(module, to))
        .map(|(line, to)| Violation {
            file: file.to_string(),
            line,
            from: module.to_string(),
            to,
        })
        .collect()
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A source file of a module of the crate: its path as shown (`src/...`), module and text.
struct ModuleFile {
    shown: String,
    module: String,
    source: String,
}

/// Every `.rs` file under `src/` that belongs to a module (not `lib.rs` or `main.rs`), in path
/// order.
fn module_files() -> Vec<ModuleFile> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .iter()
        .filter_map(|path| {
            let relative = path.strip_prefix(&src).unwrap();
            Some(ModuleFile {
                shown: format!("src/{}", relative.display()),
                module: module_of(relative)?,
                source: std::fs::read_to_string(path).unwrap(),
            })
        })
        .collect()
}

#[test]
fn stages_name_no_other_stage_and_base_modules_name_no_stage() {
    let found: Vec<Violation> = module_files()
        .iter()
        .flat_map(|f| violations_in(&f.shown, &f.module, &f.source))
        .collect();
    let report: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(
        report.is_empty(),
        "the layering of ARCHITECTURE.md is broken ({} references):\n{}",
        report.len(),
        report.join("\n")
    );
}

/// The one shape of a stage that works on a project: plain-data settings in, progress out
/// through the stage's observer, a summary back; all printing is the command line's.
const STAGE_SHAPE: &str =
    "pub fn run(store: &mut Store, config: &Config, observer: &mut dyn Observer) -> Result<Summary>";

/// Stages that do not take a project, with their shape and why.
const STAGE_SHAPE_EXCEPTIONS: [(&str, &str, &str); 3] = [
    (
        "aflite",
        "pub fn run(config: &Config, observer: &mut dyn Observer) -> Result<Summary>",
        "reads a labelled dataset file and writes filtered copies: no project",
    ),
    (
        "audit",
        "pub fn run(config: &Config, observer: &mut dyn Observer) -> Result<Summary>",
        "reads dataset folders (afkit's exports or anyone's SWAG files): no project",
    ),
    (
        "annotate",
        "pub fn annotate(store: &mut Store, config: &Config) -> Result<Outcome>",
        "the terminal UI is the stage: it draws itself, so there is nothing to observe",
    ),
];

/// `source` with every run of whitespace made one space, and none after `(` or before `)`.
fn one_line(source: &str) -> String {
    source
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(",)", ")")
}

#[test]
fn every_stage_has_the_one_stage_shape_or_says_why_not() {
    let files = module_files();
    let mut missing = Vec::new();
    for stage in STAGES {
        let shape = STAGE_SHAPE_EXCEPTIONS
            .iter()
            .find(|(name, _, _)| *name == stage)
            .map_or(STAGE_SHAPE, |(_, shape, _why)| *shape);
        let found = files
            .iter()
            .filter(|f| f.module == stage)
            .any(|f| one_line(&f.source).contains(&format!("{shape} {{")));
        if !found {
            missing.push(format!("stage {stage}: no `{shape}`"));
        }
    }
    assert!(
        missing.is_empty(),
        "stages out of shape (ARCHITECTURE.md, \"Stages\"):\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_signature_split_over_lines_is_one_line() {
    let source = "pub fn run(\n    store: &mut Store,\n    config: &Config,\n    observer: &mut dyn Observer,\n) -> Result<Summary> {";
    assert_eq!(one_line(source), format!("{STAGE_SHAPE} {{"));
}

/// Where a file outside `cli` defines command-line flags or commands: the derives that make a
/// type a set of flags, a subcommand list or a parser. `clap::ValueEnum` on a plain enum is
/// allowed, so that a flag's values stay the variants of the stage's own enum.
fn flag_definitions(source: &str) -> Vec<usize> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| {
            [
                "clap::Args",
                "clap::Subcommand",
                "clap::Parser",
                "#[arg(",
                "#[command(",
            ]
            .iter()
            .any(|needle| line.contains(needle))
        })
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn flags_are_defined_in_the_cli_only() {
    let found: Vec<String> = module_files()
        .iter()
        .filter(|f| layer(&f.module) != Layer::Cli)
        .flat_map(|f| {
            flag_definitions(&f.source)
                .into_iter()
                .map(move |line| format!("{}:{line}", f.shown))
        })
        .collect();
    assert!(
        found.is_empty(),
        "command-line flags belong in src/cli/ (stages take plain configs):\n{}",
        found.join("\n")
    );
}

/// The module that owns the project file: the only one that may hold its SQLite connection.
const STORE: &str = "store";

/// Where a file reaches the project's database past the store's typed operations: SQLite's
/// crate or the store's raw connection. Every table has one owner, so a query outside `store`
/// is a second place where a schema change must be made.
fn raw_database_uses(source: &str) -> Vec<usize> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| line.contains("rusqlite") || line.contains(".conn()"))
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn only_the_store_touches_the_database() {
    let found: Vec<String> = module_files()
        .iter()
        .filter(|f| f.module != STORE)
        .flat_map(|f| {
            raw_database_uses(&f.source)
                .into_iter()
                .map(move |line| format!("{}:{line}", f.shown))
        })
        .collect();
    assert!(
        found.is_empty(),
        "SQL belongs in src/store/ (stages call the store's methods):\n{}",
        found.join("\n")
    );
}

#[test]
fn raw_database_uses_are_found_but_comments_are_not() {
    let source = "use rusqlite::Connection;\nlet n = store.conn().execute(sql)?;\n\
                  // no rusqlite:: here\nstore.connect()?;\n";
    assert_eq!(raw_database_uses(source), vec![1, 2]);
}

#[test]
fn flag_definitions_are_found_but_value_enums_and_comments_are_not() {
    let source = "#[derive(clap::Args)]\nstruct A {\n    #[arg(long)]\n    x: u8,\n}\n\
                  #[derive(clap::ValueEnum)]\nenum E { X }\n// #[derive(clap::Parser)]\n";
    assert_eq!(flag_definitions(source), vec![1, 3]);
}

#[test]
fn every_stage_is_a_module_of_the_crate() {
    // A renamed stage would otherwise count as a base module and slip through.
    for stage in STAGES {
        let src = src_dir();
        assert!(
            src.join(stage).is_dir() || src.join(format!("{stage}.rs")).is_file(),
            "stage {stage} is not a module under src/"
        );
    }
}

#[test]
fn finds_paths_groups_and_inline_uses_but_not_comments() {
    let source = "use crate::store::Store;\n\
                  // crate::export is only mentioned here\n\
                  use crate::{\n    text::rules,\n    assemble::{self, split},\n};\n\
                  fn f() { crate::ingest::run(); $crate::af::x(); notcrate::audit::y(); }\n";
    let refs = crate_references(source);
    let names: Vec<(usize, &str)> = refs.iter().map(|(l, n)| (*l, n.as_str())).collect();
    assert_eq!(
        names,
        [(1, "store"), (4, "text"), (5, "assemble"), (7, "ingest")]
    );
    let found = violations_in("src/export/x.rs", "export", source);
    let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "src/export/x.rs:5: stage export imports stage assemble",
            "src/export/x.rs:7: stage export imports stage ingest",
        ]
    );
    let base = violations_in("src/store/x.rs", "store", "use crate::cli::Cli;\n");
    assert_eq!(
        base[0].to_string(),
        "src/store/x.rs:1: base module store imports cli"
    );
    assert!(violations_in("src/cli.rs", "cli", source).is_empty());
}

/// The longest a function may be: past a screen, a function hides what it does.
const LONGEST_FUNCTION: usize = 80;

/// Every function of `source` longer than [`LONGEST_FUNCTION`] lines, as (line, name, lines):
/// from its `fn` line to the `}` at the same indentation (rustfmt's layout).
fn long_functions(source: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let after_qualifiers = ["pub ", "pub(crate) ", "pub(super) ", "const ", "unsafe "]
            .iter()
            .fold(code, |rest, q| rest.strip_prefix(q).unwrap_or(rest));
        let Some(signature) = after_qualifiers.strip_prefix("fn ") else {
            continue;
        };
        // A whole function on one line (a trait's default `{}`) or a declaration without a body.
        if code.trim_end().ends_with('}') || code.trim_end().ends_with(';') {
            continue;
        }
        let name: String = signature
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let closing = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == closing) {
            let length = end + 2;
            if length > LONGEST_FUNCTION {
                found.push((i + 1, name, length));
            }
        }
    }
    found
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let report: Vec<String> = module_files()
        .iter()
        .flat_map(|f| {
            long_functions(&f.source)
                .into_iter()
                .map(move |(line, name, length)| {
                    format!("{}:{line}: {name} ({length} lines)", f.shown)
                })
        })
        .collect();
    assert!(
        report.is_empty(),
        "functions over {LONGEST_FUNCTION} lines (split them):\n{}",
        report.join("\n")
    );
}

#[test]
fn long_functions_are_measured_from_fn_to_its_closing_brace() {
    let body = "    let x = 1;\n".repeat(LONGEST_FUNCTION);
    let source =
        format!("pub fn long() {{\n{body}}}\n\nfn short() {{\n}}\n    fn inner() {{\n    }}\n    fn default(&mut self) {{}}\n    fn declared(&self);\n{body}    }}\n");
    assert_eq!(
        long_functions(&source),
        vec![(1, "long".to_string(), LONGEST_FUNCTION + 2)]
    );
}

/// The file-level module path of a file under `src/` (`src/generate/pool.rs` →
/// `generate::pool`, `src/generate/mod.rs` → `generate`).
fn file_module(shown: &str) -> String {
    let path = shown
        .strip_prefix("src/")
        .unwrap()
        .strip_suffix(".rs")
        .unwrap();
    let path = path.strip_suffix("/mod").unwrap_or(path);
    path.replace('/', "::")
}

/// `source` without comment lines and without its `#[cfg(test)]` module: what the file itself
/// imports (a test module may use its parent's items).
fn non_test_code(source: &str) -> String {
    let code: Vec<&str> = source
        .lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect();
    code.join("\n")
}

/// The path segments written from `at` on: `a::b::C` → [a, b, C]; a `{...}` group ends it and
/// gives one path per top-level name.
fn paths_at(code: &str, at: usize) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut pos = at;
    loop {
        let name = identifier_at(code, pos);
        if name.is_empty() {
            break;
        }
        segments.push(name.to_string());
        pos += name.len();
        if !code[pos..].starts_with("::") {
            return vec![segments];
        }
        pos += 2;
    }
    if code[pos..].starts_with('{') {
        return group_names(code, pos)
            .into_iter()
            .filter(|(_, name)| *name != "self")
            .map(|(_, name)| [segments.clone(), vec![name.to_string()]].concat())
            .collect();
    }
    vec![segments]
}

/// The files (as modules) that the file of module `from` names: through `crate::` and `super::`
/// paths and through the child modules it declares. A path names the longest module it starts
/// with; visibility such as `pub(super)` names nothing.
fn file_imports(from: &str, code: &str, modules: &[String]) -> Vec<String> {
    let own: Vec<&str> = from.split("::").collect();
    let children: Vec<String> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?.strip_suffix(';').map(String::from)
        })
        .collect();
    let mut roots: Vec<(&str, Vec<&str>)> = vec![
        ("crate::", vec![]),
        ("super::", own[..own.len() - 1].to_vec()),
    ];
    for child in &children {
        roots.push((child.as_str(), own.clone()));
    }
    let mut found = Vec::new();
    for (root, base) in &roots {
        let root = if root.ends_with("::") {
            root.to_string()
        } else {
            format!("{root}::")
        };
        for (at, _) in code.match_indices(root.as_str()) {
            let preceded = at > 0
                && (is_identifier_byte(code.as_bytes()[at - 1]) || code[..at].ends_with("::"));
            if preceded {
                continue;
            }
            let start = if root == "crate::" || root == "super::" {
                at + root.len()
            } else {
                at
            };
            for path in paths_at(code, start) {
                let full: Vec<&str> = base
                    .iter()
                    .copied()
                    .chain(path.iter().map(String::as_str))
                    .collect();
                if let Some(module) = (1..=full.len())
                    .rev()
                    .map(|n| full[..n].join("::"))
                    .find(|m| modules.contains(m))
                {
                    if module != from && !found.contains(&module) {
                        found.push(module);
                    }
                }
            }
        }
    }
    found.sort();
    found
}

/// One cycle of the graph, if it has any (depth-first search from every node).
fn find_cycle(graph: &[(String, Vec<String>)]) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &[(String, Vec<String>)],
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            return Some([&path[start..], &[node.to_string()]].concat());
        }
        if done.iter().any(|n| n == node) {
            return None;
        }
        path.push(node.to_string());
        let edges = graph
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, e)| e.clone());
        for next in edges.unwrap_or_default() {
            if let Some(cycle) = visit(&next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.push(node.to_string());
        None
    }
    let mut done = Vec::new();
    graph
        .iter()
        .find_map(|(node, _)| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_two_files_import_each_other_even_through_others() {
    let files = module_files();
    let modules: Vec<String> = files.iter().map(|f| file_module(&f.shown)).collect();
    let graph: Vec<(String, Vec<String>)> = files
        .iter()
        .zip(&modules)
        .map(|(f, m)| {
            (
                m.clone(),
                file_imports(m, &non_test_code(&f.source), &modules),
            )
        })
        .collect();
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "an import loop between files (a shared item belongs in a file both can name): {}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn file_imports_follow_crate_super_and_child_paths_but_not_visibility() {
    let modules: Vec<String> = ["gen", "gen::config", "gen::pool", "store", "store::pool"]
        .map(String::from)
        .to_vec();
    let code =
        "mod config;\nmod pool;\nuse config::Config;\nuse crate::store::{pool::NewPool, Store};\n\
                pub(super) fn f() { pool::new_pool(); }\n";
    assert_eq!(
        file_imports("gen", code, &modules),
        ["gen::config", "gen::pool", "store", "store::pool"]
    );
    assert_eq!(
        file_imports(
            "gen::pool",
            "use super::config::Config;\npub(super) fn g() {}",
            &modules
        ),
        ["gen::config"]
    );
    let looped = vec![
        ("a".to_string(), vec!["b".to_string()]),
        ("b".to_string(), vec!["a".to_string()]),
    ];
    assert_eq!(find_cycle(&looped).unwrap(), ["a", "b", "a"]);
}
