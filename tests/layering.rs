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
        format!("pub fn long() {{\n{body}}}\n\nfn short() {{\n}}\n    fn inner() {{\n    }}\n");
    assert_eq!(
        long_functions(&source),
        vec![(1, "long".to_string(), LONGEST_FUNCTION + 2)]
    );
}
