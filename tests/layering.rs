//! The layering of ARCHITECTURE.md, checked on the workspace: the `afkit` binary (its command
//! line in `src/cli/`) → one crate per pipeline stage → the store crate → the engine crate.
//! Cargo already refuses a path to a crate that is not a dependency, so what is checked here is
//! the dependency lists themselves (no arrow up, no stage naming another stage, SQLite in the
//! store alone) and what the compiler cannot see: flags only in the command line, the stage
//! shape, no import loop between the files of a crate, functions no longer than a screen.

use std::fmt;
use std::path::{Path, PathBuf};

/// The pipeline stages: one crate each under `crates/`, none of which may depend on another.
const STAGES: [&str; 9] = [
    "adapt", "aflite", "annotate", "assemble", "audit", "export", "filter", "generate", "ingest",
];

/// The crate every other one builds on: models, text and kernels, nothing of projects.
const ENGINE: &str = "engine";
/// The crate that owns the project file: the only one that may hold its SQLite connection.
const STORE: &str = "store";
/// The binary, above the stages: it may depend on anything.
const BINARY: &str = "afkit";

/// A crate's height in the layering: a crate depends only on crates below it.
fn height(krate: &str) -> usize {
    match krate {
        ENGINE => 0,
        STORE => 1,
        BINARY => 3,
        _ => 2,
    }
}

fn described(krate: &str) -> String {
    match krate {
        ENGINE | STORE => format!("{krate} crate"),
        BINARY => "the afkit binary".to_string(),
        _ => format!("stage {krate}"),
    }
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The crates under `crates/`, by folder name.
fn member_crates() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The manifest of a crate: the workspace root's for the binary.
fn manifest_of(krate: &str) -> PathBuf {
    if krate == BINARY {
        workspace().join("Cargo.toml")
    } else {
        workspace().join("crates").join(krate).join("Cargo.toml")
    }
}

/// The package names in the `[dependencies]` table of a manifest (dev-dependencies are the
/// tests' business), with their lines.
fn dependencies(manifest: &str) -> Vec<(usize, String)> {
    let mut inside = false;
    let mut found = Vec::new();
    for (i, line) in manifest.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name: String = line
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        found.push((i + 1, name));
    }
    found
}

/// A dependency that breaks the layering.
#[derive(Debug, PartialEq)]
struct Violation {
    manifest: String,
    line: usize,
    from: String,
    to: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} depends on {}",
            self.manifest,
            self.line,
            described(&self.from),
            described(&self.to)
        )
    }
}

/// The afkit crates that `manifest` (of crate `from`) may not depend on.
fn violations_in(from: &str, shown: &str, manifest: &str) -> Vec<Violation> {
    dependencies(manifest)
        .into_iter()
        .filter_map(|(line, name)| Some((line, name.strip_prefix("afkit-")?.to_string())))
        .filter(|(_, to)| height(to) >= height(from))
        .map(|(line, to)| Violation {
            manifest: shown.to_string(),
            line,
            from: from.to_string(),
            to,
        })
        .collect()
}

#[test]
fn crates_depend_only_on_crates_below_them() {
    let mut found = Vec::new();
    for krate in member_crates().iter().map(String::as_str).chain([BINARY]) {
        let manifest = std::fs::read_to_string(manifest_of(krate)).unwrap();
        let shown = if krate == BINARY {
            "Cargo.toml".to_string()
        } else {
            format!("crates/{krate}/Cargo.toml")
        };
        found.extend(violations_in(krate, &shown, &manifest));
    }
    let report: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(
        report.is_empty(),
        "the layering of ARCHITECTURE.md is broken:\n{}",
        report.join("\n")
    );
}

#[test]
fn every_crate_is_the_engine_the_store_or_a_stage() {
    // A new crate would otherwise count as a stage without being listed as one.
    let members = member_crates();
    for krate in &members {
        assert!(
            krate == ENGINE || krate == STORE || STAGES.contains(&krate.as_str()),
            "crates/{krate} is neither the engine, the store nor a stage of STAGES"
        );
    }
    for stage in STAGES {
        assert!(
            members.iter().any(|m| m == stage),
            "stage {stage} is not a crate under crates/"
        );
    }
}

#[test]
fn only_the_store_depends_on_sqlite() {
    let found: Vec<String> = member_crates()
        .iter()
        .map(String::as_str)
        .chain([BINARY])
        .filter(|k| *k != STORE)
        .filter(|k| {
            let manifest = std::fs::read_to_string(manifest_of(k)).unwrap();
            dependencies(&manifest).iter().any(|(_, n)| n == "rusqlite")
        })
        .map(described)
        .collect();
    assert!(
        found.is_empty(),
        "SQL belongs in the store crate (stages call the store's methods): {}",
        found.join(", ")
    );
}

#[test]
fn dependencies_are_read_from_their_table_only() {
    let manifest = "[package]\nname = \"afkit-filter\"\n\n[dependencies]\n# the store\n\
                    afkit-store.workspace = true\nafkit-generate = { workspace = true }\n\
                    anyhow = \"1\"\n\n[dev-dependencies]\nafkit-export.workspace = true\n";
    let names: Vec<(usize, String)> = dependencies(manifest);
    assert_eq!(
        names,
        [
            (6, "afkit-store".to_string()),
            (7, "afkit-generate".to_string()),
            (8, "anyhow".to_string())
        ]
    );
    let shown: Vec<String> = violations_in("filter", "crates/filter/Cargo.toml", manifest)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        ["crates/filter/Cargo.toml:7: stage filter depends on stage generate"]
    );
    let up = violations_in(STORE, "m", "[dependencies]\nafkit-ingest = \"0\"\n");
    assert_eq!(
        up[0].to_string(),
        "m:2: store crate depends on stage ingest"
    );
    assert!(violations_in(BINARY, "m", manifest).is_empty());
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

/// A source file of the workspace: its path as shown, its crate and its module path with the
/// crate's name first (`crates/generate/src/pool.rs` → `generate::pool`, a crate's `lib.rs` →
/// `generate`, the binary's `src/cli/mod.rs` → `afkit::cli`).
struct SourceFile {
    shown: String,
    krate: String,
    module: String,
    source: String,
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

/// The module path of a file under a crate's `src/`, the crate's name first.
fn module_path(krate: &str, relative: &Path) -> String {
    let path = relative.to_str().unwrap().strip_suffix(".rs").unwrap();
    let path = path.strip_suffix("/mod").unwrap_or(path);
    match path {
        "lib" | "main" => krate.to_string(),
        _ => format!("{krate}::{}", path.replace('/', "::")),
    }
}

/// Every `.rs` file of every crate of the workspace, in path order.
fn source_files() -> Vec<SourceFile> {
    let root = workspace();
    let mut roots: Vec<(String, PathBuf)> = member_crates()
        .into_iter()
        .map(|k| {
            let src = root.join("crates").join(&k).join("src");
            (k, src)
        })
        .collect();
    roots.push((BINARY.to_string(), root.join("src")));
    let mut files = Vec::new();
    for (krate, src) in roots {
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        paths.sort();
        for path in paths {
            let relative = path.strip_prefix(&src).unwrap();
            files.push(SourceFile {
                shown: path.strip_prefix(&root).unwrap().display().to_string(),
                module: module_path(&krate, relative),
                krate: krate.clone(),
                source: std::fs::read_to_string(&path).unwrap(),
            });
        }
    }
    files
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
    let files = source_files();
    let mut missing = Vec::new();
    for stage in STAGES {
        let shape = STAGE_SHAPE_EXCEPTIONS
            .iter()
            .find(|(name, _, _)| *name == stage)
            .map_or(STAGE_SHAPE, |(_, shape, _why)| *shape);
        let found = files
            .iter()
            .filter(|f| f.krate == stage)
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
    let found: Vec<String> = source_files()
        .iter()
        .filter(|f| f.krate != BINARY)
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
    let found: Vec<String> = source_files()
        .iter()
        .filter(|f| f.krate != STORE)
        .flat_map(|f| {
            raw_database_uses(&f.source)
                .into_iter()
                .map(move |line| format!("{}:{line}", f.shown))
        })
        .collect();
    assert!(
        found.is_empty(),
        "SQL belongs in crates/store/ (stages call the store's methods):\n{}",
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

/// The longest a function may be: past a screen, a function hides what it does.
const LONGEST_FUNCTION: usize = 60;

/// The longest a test may be: a test reads as setup, action and checks in one place, so it may
/// run a little longer than a function of the program, but not past that.
const LONGEST_TEST: usize = 80;

/// Every function of `source` longer than its limit, as (line, name, lines): from its `fn` line
/// to the `}` at the same indentation (rustfmt's layout). A file's `#[cfg(test)] mod … {` and
/// everything after it is test code (afkit keeps a file's tests in one module at its end);
/// `all_tests` says the whole file is.
fn long_functions(source: &str, all_tests: bool) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let tests_from = if all_tests {
        0
    } else {
        lines
            .windows(2)
            .position(|w| w[0].trim() == "#[cfg(test)]" && is_inline_module(w[1]))
            .unwrap_or(lines.len())
    };
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((name, length)) = function_at(&lines, i, line) else {
            continue;
        };
        let limit = if i >= tests_from {
            LONGEST_TEST
        } else {
            LONGEST_FUNCTION
        };
        if length > limit {
            found.push((i + 1, name, length));
        }
    }
    found
}

fn is_inline_module(line: &str) -> bool {
    line.trim_start().starts_with("mod ") && line.trim_end().ends_with('{')
}

/// The name and length of the function whose `fn` line is `lines[i]`, if it has a body.
fn function_at(lines: &[&str], i: usize, line: &str) -> Option<(String, usize)> {
    let code = line.trim_start();
    let indent = &line[..line.len() - code.len()];
    let after_qualifiers = ["pub ", "pub(crate) ", "pub(super) ", "const ", "unsafe "]
        .iter()
        .fold(code, |rest, q| rest.strip_prefix(q).unwrap_or(rest));
    let signature = after_qualifiers.strip_prefix("fn ")?;
    // A whole function on one line (a trait's default `{}`) or a declaration without a body.
    if code.trim_end().ends_with('}') || code.trim_end().ends_with(';') {
        return None;
    }
    let name: String = signature
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let closing = format!("{indent}}}");
    let end = lines[i + 1..].iter().position(|l| *l == closing)?;
    Some((name, end + 2))
}

/// Files that are test code throughout: the integration tests, the benchmarks, and a crate's
/// test modules kept in files of their own (`tests.rs`, `*_tests.rs`).
fn test_files() -> Vec<SourceFile> {
    let root = workspace();
    let mut files = Vec::new();
    for dir in ["tests", "benches"] {
        let mut paths = Vec::new();
        rust_files(&root.join(dir), &mut paths);
        paths.sort();
        for path in paths {
            files.push(SourceFile {
                shown: path.strip_prefix(&root).unwrap().display().to_string(),
                krate: BINARY.to_string(),
                module: String::new(),
                source: std::fs::read_to_string(&path).unwrap(),
            });
        }
    }
    files
}

fn is_test_module_file(shown: &str) -> bool {
    shown.ends_with("/tests.rs") || shown.ends_with("_tests.rs")
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let program = source_files()
        .into_iter()
        .map(|f| (is_test_module_file(&f.shown), f));
    let tests = test_files().into_iter().map(|f| (true, f));
    let report: Vec<String> = program
        .chain(tests)
        .flat_map(|(all_tests, f)| {
            long_functions(&f.source, all_tests)
                .into_iter()
                .map(move |(line, name, length)| {
                    format!("{}:{line}: {name} ({length} lines)", f.shown)
                })
        })
        .collect();
    assert!(
        report.is_empty(),
        "functions over {LONGEST_FUNCTION} lines, or tests over {LONGEST_TEST} (split them):\n{}",
        report.join("\n")
    );
}

#[test]
fn long_functions_are_measured_from_fn_to_its_closing_brace() {
    let body = "    let x = 1;\n".repeat(LONGEST_FUNCTION);
    let source =
        format!("pub fn long() {{\n{body}}}\n\nfn short() {{\n}}\n    fn inner() {{\n    }}\n    fn default(&mut self) {{}}\n    fn declared(&self);\n{body}    }}\n");
    assert_eq!(
        long_functions(&source, false),
        vec![(1, "long".to_string(), LONGEST_FUNCTION + 2)]
    );
}

#[test]
fn tests_may_run_longer_than_functions_but_not_past_their_own_limit() {
    let function = |name: &str, lines: usize| {
        format!("fn {name}() {{\n{}}}\n", "    let x = 1;\n".repeat(lines))
    };
    let source = [
        function("program", LONGEST_FUNCTION),
        "#[cfg(test)]\nmod tests {\n".to_string(),
        function("fits", LONGEST_TEST - 2),
        function("over", LONGEST_TEST),
        "}\n".to_string(),
    ]
    .concat();
    let found: Vec<String> = long_functions(&source, false)
        .into_iter()
        .map(|(_, name, _)| name)
        .collect();
    assert_eq!(found, ["program", "over"]);
    let test_file = function("a_test", LONGEST_TEST - 2);
    assert!(long_functions(&test_file, true).is_empty());
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
/// with; visibility such as `pub(super)` names nothing. Module paths start with the crate's name.
fn file_imports(from: &str, code: &str, modules: &[String]) -> Vec<String> {
    let own: Vec<&str> = from.split("::").collect();
    let krate = own[0];
    let children: Vec<String> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?.strip_suffix(';').map(String::from)
        })
        .collect();
    let mut roots: Vec<(&str, Vec<&str>)> = vec![
        ("crate::", vec![krate]),
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
    let files = source_files();
    let modules: Vec<String> = files.iter().map(|f| f.module.clone()).collect();
    let graph: Vec<(String, Vec<String>)> = files
        .iter()
        .map(|f| {
            let imports = file_imports(&f.module, &non_test_code(&f.source), &modules);
            (f.module.clone(), imports)
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
    let modules: Vec<String> = [
        "gen",
        "gen::config",
        "gen::pool",
        "gen::store",
        "gen::store::pool",
    ]
    .map(String::from)
    .to_vec();
    let code =
        "mod config;\nmod pool;\nuse config::Config;\nuse crate::store::{pool::NewPool, Store};\n\
                pub(super) fn f() { pool::new_pool(); }\n";
    assert_eq!(
        file_imports("gen", code, &modules),
        ["gen::config", "gen::pool", "gen::store", "gen::store::pool"]
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
