//! The one rule for every file afkit writes for the user (exports, crowd task files, AFLite's
//! outputs, reports, audits, tagger models):
//!
//! - never over one of the command's own inputs or the project (paths compared resolved, and
//!   by file identity, so `./p.sqlite`, a symlink or a hard link to it are all caught), not even
//!   with `--force`;
//! - never over an existing file that afkit did not write, unless told (`--force`): afkit knows
//!   its own files by a ledger it keeps in each folder it writes into ([`LEDGER`]: each file's
//!   name and the SHA-256 of what afkit wrote), so a file the user edited since, or put there
//!   themselves, is refused by name;
//! - always through a temporary file in the target's folder, renamed into place, so a reader
//!   never sees a half-written file and a killed command leaves the old file whole.
//!
//! The ledger is updated before the renames (listing the old and the new content of each file)
//! and after them (the new content only), so a command killed between the two can be re-run
//! without `--force`.
//!
//! The files of one command are one unit (an export's folder and the answers file beside it):
//! once every temporary file is complete, a journal ([`JOURNAL`], in each folder whose ledger
//! lists one of the files) names every rename still to do, and is removed once they are all
//! done. A command killed before the journal leaves the old files whole; one killed after it
//! leaves the folder visibly unfinished, and the next command that writes there finishes the
//! renames first ([`Output::finish_interrupted`]), so readers find the old unit or the new one,
//! never a mix once afkit has run again.
//!
//! Every temporary file is locked by the process writing it, so a later command removes the ones
//! a killed command left (unlocked, not named by a journal) and never one still being written.
//! Files are created with the user's umask (as any program's would be), not private to them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::models::hex;

/// The ledger's file name in every folder afkit writes into.
pub(crate) const LEDGER: &str = ".afkit-written.json";

/// The journal of a unit of files whose renames were under way, in each folder it touches.
pub(crate) const JOURNAL: &str = ".afkit-unfinished.json";

/// The writer recorded for files written one by one (never removed as stale).
const SINGLE_FILES: &str = "afkit";

/// What every temporary file's name begins with; six random letters or digits follow, then the
/// target's extension.
const TEMP_PREFIX: &str = ".afkit-";

/// How a command may write its outputs: what it must never write over, and whether the user
/// allowed replacing files afkit did not write.
#[derive(Debug, Clone, Default)]
pub struct Output {
    protected: Vec<Protected>,
    force: bool,
}

#[derive(Debug, Clone)]
struct Protected {
    path: PathBuf,
    resolved: PathBuf,
}

/// A file being written: a temporary file beside its target, renamed into place by
/// [`Output::commit`] (dropped uncommitted, it is removed).
pub struct Staged {
    temp: tempfile::NamedTempFile,
    target: Target,
}

/// The renames of a unit still to do once its journal is written; see the module's comment.
#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    writer: String,
    /// A folder write: the folder and every file of it, for removing the writer's stale ones.
    folder: Option<(PathBuf, Vec<String>)>,
    moves: Vec<Move>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Move {
    temp: PathBuf,
    target: PathBuf,
    root: PathBuf,
    name: String,
    sha256: String,
}

/// A file to write, and the folder whose ledger lists it under `name`.
#[derive(Debug, Clone)]
struct Target {
    path: PathBuf,
    root: PathBuf,
    name: String,
}

impl Target {
    /// A file listed in its own folder's ledger.
    fn file(path: &Path) -> Target {
        Target {
            path: path.to_path_buf(),
            root: folder_of(path),
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }

    /// `name` (which may hold `/`) of the folder `root`, listed in that folder's ledger.
    fn in_folder(root: &Path, name: &str) -> Target {
        Target {
            path: root.join(name),
            root: root.to_path_buf(),
            name: name.to_string(),
        }
    }
}

impl Staged {
    pub fn file(&mut self) -> &mut fs::File {
        self.temp.as_file_mut()
    }

    /// Where the writer may write the contents itself (a chart library that takes a path).
    pub fn path(&self) -> &Path {
        self.temp.path()
    }
}

/// A folder's ledger: file name (relative to the folder) → who wrote it and the hashes of the
/// contents afkit wrote there (two while a write is under way).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    files: BTreeMap<String, Entry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    writer: String,
    sha256: Vec<String>,
}

impl Output {
    /// `force`: replace existing files afkit did not write (never the protected ones).
    pub fn new(force: bool) -> Output {
        Output {
            protected: Vec::new(),
            force,
        }
    }

    /// Never write over `path` (an input of the command, or the project with its SQLite side
    /// files).
    pub fn protect(mut self, path: &Path) -> Output {
        self.protected.push(Protected {
            path: path.to_path_buf(),
            resolved: resolve(path),
        });
        self
    }

    /// The project file and the side files SQLite keeps beside it.
    pub fn protect_project(self, project: &Path) -> Output {
        ["", "-wal", "-shm", "-journal"]
            .iter()
            .fold(self, |out, suffix| {
                out.protect(&with_suffix(project, suffix))
            })
    }

    /// Fails unless `target` may be written by `writer` (check early, before long work; the
    /// check is repeated when the file is committed).
    pub fn check(&self, target: &Path) -> Result<()> {
        self.check_target(&Target::file(target))
    }

    fn check_target(&self, t: &Target) -> Result<()> {
        let target = t.path.as_path();
        let resolved = resolve(target);
        for p in &self.protected {
            if resolved == p.resolved || same_file(target, &p.path) {
                let what = if target == p.path {
                    "an input of this command".to_string()
                } else {
                    format!(
                        "the same file as {}, an input of this command",
                        p.path.display()
                    )
                };
                bail!(
                    "{} is {what}; afkit never writes over its inputs or the project: choose \
                     another output path",
                    target.display()
                );
            }
        }
        if resolved.is_dir() {
            bail!(
                "{} is a directory: give a file name to write",
                target.display()
            );
        }
        if !self.force && fs::symlink_metadata(target).is_ok() && !written_by_afkit(t)? {
            bail!(
                "{} exists and afkit did not write it (or it was changed since): \
                 choose another name, or add --force to replace it",
                target.display()
            );
        }
        Ok(())
    }

    /// Starts writing `target`: checks it, then opens a temporary file beside it.
    pub fn stage(&self, target: &Path) -> Result<Staged> {
        self.stage_target(Target::file(target))
    }

    fn stage_target(&self, target: Target) -> Result<Staged> {
        finish_unfinished(&target.root)?;
        self.check_target(&target)?;
        let dir = folder_of(&target.path);
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        remove_stale_temps(&dir)?;
        let temp = locked_temp(&dir, &extension_of(&target.path))?;
        Ok(Staged { temp, target })
    }

    /// Finishes the renames of a unit that a killed command left under way in `dir` (see the
    /// module's comment); returns what it did, for the command to say, or `None` when nothing
    /// was unfinished.
    pub fn finish_interrupted(&self, dir: &Path) -> Result<Option<String>> {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        Ok(finish_unfinished(dir)?.then(|| {
            format!(
                "{}: an earlier write was interrupted while its files were being put in place; \
                 finished it first",
                dir.display()
            )
        }))
    }

    /// Writes one file whole.
    pub(crate) fn write(&self, target: &Path, bytes: &[u8]) -> Result<()> {
        let mut staged = self.stage(target)?;
        std::io::Write::write_all(staged.file(), bytes)
            .with_context(|| format!("cannot write {}", target.display()))?;
        self.commit(vec![staged])
    }

    /// Renames staged files into place, all checked first: none is renamed if any may not be.
    pub fn commit(&self, staged: Vec<Staged>) -> Result<()> {
        self.commit_as(staged, SINGLE_FILES)
    }

    fn commit_as(&self, staged: Vec<Staged>, writer: &str) -> Result<()> {
        self.commit_unit(staged, writer, None)
    }

    /// Commits `staged` as one unit (see the module's comment); `folder`: a folder write and
    /// every file of it.
    fn commit_unit(
        &self,
        staged: Vec<Staged>,
        writer: &str,
        folder: Option<(&Path, &BTreeMap<String, Vec<u8>>)>,
    ) -> Result<()> {
        for s in &staged {
            self.check_target(&s.target)?;
        }
        let journal = Journal::of(&staged, writer, folder)?;
        record(&journal.ledger_entries(), writer, true)?;
        let held = write_journal(&journal)?;
        let mut renamed = Vec::with_capacity(staged.len());
        for s in staged {
            let target = s.target.path;
            renamed.push(
                s.temp
                    .persist(&target)
                    .with_context(|| format!("cannot write {}", target.display()))?,
            );
        }
        finish(&journal)?;
        drop((held, renamed));
        Ok(())
    }

    /// [`Output::folder`], with files outside the folder (`beside`: path and contents) written
    /// in the same unit: after an interruption all of them are old or all new.
    pub fn folder_and_beside(
        &self,
        dir: &Path,
        files: &BTreeMap<String, Vec<u8>>,
        writer: &str,
        beside: &[(PathBuf, Vec<u8>)],
    ) -> Result<()> {
        if dir.exists() && !dir.is_dir() {
            bail!("{} exists and is not a directory", dir.display());
        }
        finish_unfinished(dir)?;
        for (path, _) in beside {
            finish_unfinished(&folder_of(path))?;
        }
        for name in files.keys() {
            self.check_target(&Target::in_folder(dir, name))?;
        }
        for (path, _) in beside {
            self.check(path)?;
        }
        let mut staged = Vec::with_capacity(files.len() + beside.len());
        for (name, bytes) in files {
            let mut s = self.stage_target(Target::in_folder(dir, name))?;
            std::io::Write::write_all(s.file(), bytes)
                .with_context(|| format!("cannot write {}", dir.join(name).display()))?;
            staged.push(s);
            crate::interrupt::check()?;
        }
        for (path, bytes) in beside {
            let mut s = self.stage(path)?;
            std::io::Write::write_all(s.file(), bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
            staged.push(s);
        }
        self.commit_unit(staged, writer, Some((dir, files)))
    }
}

impl Journal {
    /// The journal of committing `staged` (each temporary file flushed to the disk first).
    fn of(
        staged: &[Staged],
        writer: &str,
        folder: Option<(&Path, &BTreeMap<String, Vec<u8>>)>,
    ) -> Result<Journal> {
        let mut moves = Vec::with_capacity(staged.len());
        for s in staged {
            s.temp.as_file().sync_all()?;
            moves.push(Move {
                temp: absolute(s.temp.path()),
                target: absolute(&s.target.path),
                root: absolute(&s.target.root),
                name: s.target.name.clone(),
                sha256: hash_file(s.temp.path())?,
            });
        }
        Ok(Journal {
            writer: writer.to_string(),
            folder: folder.map(|(dir, files)| (absolute(dir), files.keys().cloned().collect())),
            moves,
        })
    }

    /// Each file's ledger entry: (file, new hash).
    fn ledger_entries(&self) -> Vec<(Target, String)> {
        self.moves
            .iter()
            .map(|m| {
                let target = Target {
                    path: m.target.clone(),
                    root: m.root.clone(),
                    name: m.name.clone(),
                };
                (target, m.sha256.clone())
            })
            .collect()
    }

    /// Every folder whose ledger lists one of the files: each holds a copy of the journal.
    /// Outer folders come first: they are written first and removed last, so a temporary file
    /// the journal names is named by a copy in its own folder or one above it for as long as
    /// it waits to be renamed (what [`remove_stale_temps`] looks for).
    fn roots(&self) -> Vec<&Path> {
        let mut roots: Vec<&Path> = self.moves.iter().map(|m| m.root.as_path()).collect();
        roots.sort_by_key(|r| (r.components().count(), *r));
        roots.dedup();
        roots
    }
}

/// Writes the journal into each of its folders, locked while this process finishes the unit.
fn write_journal(journal: &Journal) -> Result<Vec<fs::File>> {
    let text = serde_json::to_vec_pretty(journal)?;
    let mut held = Vec::new();
    for root in journal.roots() {
        let mut temp = locked_temp(root, ".json")?;
        std::io::Write::write_all(temp.as_file_mut(), &text)?;
        temp.as_file().sync_all()?;
        let path = root.join(JOURNAL);
        held.push(
            temp.persist(&path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        );
    }
    Ok(held)
}

/// Once every file of the unit is in place: the ledgers list the new contents only, a folder
/// write's stale files go, and the journal's copies are removed.
fn finish(journal: &Journal) -> Result<()> {
    record(&journal.ledger_entries(), &journal.writer, false)?;
    if let Some((dir, names)) = &journal.folder {
        remove_stale(dir, names, &journal.writer)?;
    }
    for root in journal.roots().into_iter().rev() {
        let path = root.join(JOURNAL);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", path.display()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Finishes the unit whose journal is in `dir`, if its writer is gone (a live writer holds the
/// journal locked and finishes it itself). Returns whether there was one to finish.
fn finish_unfinished(dir: &Path) -> Result<bool> {
    let path = dir.join(JOURNAL);
    let Ok(file) = fs::File::open(&path) else {
        return Ok(false);
    };
    if file.try_lock().is_err() {
        return Ok(false);
    }
    let journal: Journal =
        serde_json::from_reader(std::io::BufReader::new(&file)).with_context(|| {
            format!(
                "{}: not afkit's journal of an unfinished write; move it away to go on",
                path.display()
            )
        })?;
    for m in &journal.moves {
        if m.temp.exists() {
            fs::rename(&m.temp, &m.target).with_context(|| {
                format!(
                    "cannot finish the interrupted write of {}",
                    m.target.display()
                )
            })?;
        } else if !hash_file(&m.target).is_ok_and(|h| h == m.sha256) {
            bail!(
                "{}: an interrupted write cannot be finished, its new contents are gone and \
                 the file is not what it wrote; move {} away and run the command again",
                m.target.display(),
                path.display()
            );
        }
    }
    finish(&journal)?;
    Ok(true)
}

/// The temporary files the journals in `dir` and the folders above it name (a journal that
/// cannot be read names none: it is refused when its unit is finished).
fn temps_named_by_journals(dir: &Path) -> BTreeSet<PathBuf> {
    absolute(dir)
        .ancestors()
        .filter_map(|folder| fs::read(folder.join(JOURNAL)).ok())
        .filter_map(|bytes| serde_json::from_slice::<Journal>(&bytes).ok())
        .flat_map(|journal| journal.moves.into_iter().map(|m| m.temp))
        .collect()
}

/// A new temporary file in `dir`, created with the user's umask and locked by this process for
/// as long as it is open. The lock is taken after the file is created, so the file is checked
/// to still be the one at its path once locked: a cleaner may have taken it for a killed
/// command's leftover in between.
fn locked_temp(dir: &Path, suffix: &str) -> Result<tempfile::NamedTempFile> {
    loop {
        let temp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .suffix(suffix)
            .permissions(fs::Permissions::from_mode(0o666))
            .tempfile_in(dir)
            .with_context(|| format!("cannot create a file in {}", dir.display()))?;
        temp.as_file()
            .lock()
            .with_context(|| format!("cannot lock {}", temp.path().display()))?;
        let held = temp.as_file().metadata()?;
        let at_path = fs::symlink_metadata(temp.path());
        if at_path.is_ok_and(|m| m.dev() == held.dev() && m.ino() == held.ino()) {
            return Ok(temp);
        }
    }
}

/// Whether `name` is one of afkit's temporary files: the prefix, six random letters or digits,
/// then nothing or an extension.
fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(TEMP_PREFIX) else {
        return false;
    };
    let (random, tail) = rest.split_at(rest.len().min(6));
    random.len() == 6
        && random.chars().all(|c| c.is_ascii_alphanumeric())
        && (tail.is_empty() || tail.starts_with('.'))
}

/// Removes the temporary files a killed command left in `dir`: afkit's by name, unlocked (no
/// live process is writing them) and named by no journal in `dir` or a folder above it (an
/// unfinished unit still needs them).
fn remove_stale_temps(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    let needed = temps_named_by_journals(dir);
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !is_temp_name(&name.to_string_lossy()) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        if needed.contains(&absolute(&path)) {
            continue;
        }
        let Ok(file) = fs::File::open(&path) else {
            continue;
        };
        if file.try_lock().is_ok() {
            fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    Ok(())
}

/// Whether the target's ledger says afkit wrote what it holds now.
fn written_by_afkit(t: &Target) -> Result<bool> {
    written_by_afkit_in(&t.root, &t.name, &read_ledger(&t.root)?)
}

/// Records `files` in their folders' ledgers: with `keep_old`, beside what each held before.
fn record(files: &[(Target, String)], writer: &str, keep_old: bool) -> Result<()> {
    let mut by_root: BTreeMap<&Path, Vec<(&String, &String)>> = BTreeMap::new();
    for (target, hash) in files {
        by_root
            .entry(&target.root)
            .or_default()
            .push((&target.name, hash));
    }
    for (root, entries) in by_root {
        let mut ledger = read_ledger(root)?;
        for (name, hash) in entries {
            let entry = ledger.files.entry(name.clone()).or_insert_with(|| Entry {
                writer: writer.to_string(),
                sha256: Vec::new(),
            });
            entry.writer = writer.to_string();
            if !keep_old {
                entry.sha256.clear();
            }
            if !entry.sha256.contains(hash) {
                entry.sha256.push(hash.clone());
            }
        }
        write_ledger(root, &ledger)?;
    }
    Ok(())
}

/// Removes the files `writer` wrote into `dir` before that it did not write now (`files`), when
/// they still hold what it wrote, and the folders that leaves empty.
fn remove_stale(dir: &Path, files: &[String], writer: &str) -> Result<()> {
    let mut ledger = read_ledger(dir)?;
    let stale: Vec<String> = ledger
        .files
        .iter()
        .filter(|(name, e)| e.writer == writer && !files.contains(*name))
        .map(|(name, _)| name.clone())
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    let mut folders = BTreeSet::new();
    for name in stale {
        let path = dir.join(&name);
        if written_by_afkit_in(dir, &name, &ledger)? {
            fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
            folders.extend(path.parent().map(Path::to_path_buf));
        }
        if !path.exists() {
            ledger.files.remove(&name);
        }
    }
    write_ledger(dir, &ledger)?;
    for folder in folders.into_iter().rev() {
        if folder != dir {
            let _ = fs::remove_dir(folder); // only succeeds when empty
        }
    }
    Ok(())
}

fn written_by_afkit_in(dir: &Path, name: &str, ledger: &Ledger) -> Result<bool> {
    let path = dir.join(name);
    let is_file = fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
    Ok(is_file
        && ledger
            .files
            .get(name)
            .is_some_and(|e| hash_file(&path).is_ok_and(|h| e.sha256.contains(&h))))
}

fn read_ledger(dir: &Path) -> Result<Ledger> {
    let path = dir.join(LEDGER);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{}: not afkit's list of the files it wrote here; move it away to go on",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ledger::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn write_ledger(dir: &Path, ledger: &Ledger) -> Result<()> {
    let mut temp = locked_temp(dir, "")?;
    serde_json::to_writer_pretty(temp.as_file_mut(), ledger)?;
    std::io::Write::write_all(temp.as_file_mut(), b"\n")?;
    temp.as_file().sync_all()?;
    let path = dir.join(LEDGER);
    temp.persist(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn hash_file(path: &Path) -> Result<String> {
    let mut file =
        fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// The folder a file goes into (`.` for a bare name).
fn folder_of(target: &Path) -> PathBuf {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `.png` for `chart.png`: the temporary file keeps the extension, for writers that pick a
/// format by it.
fn extension_of(target: &Path) -> String {
    target
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default()
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// `path` made absolute (symlinks kept), for a journal read from another working directory.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// `path` made absolute with every symlink and `..` resolved, also when the file itself does
/// not exist yet (its folder is resolved and the name appended).
pub fn resolve(path: &Path) -> PathBuf {
    if let Ok(p) = fs::canonicalize(path) {
        return p;
    }
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => resolve(parent).join(name),
        _ => absolute,
    }
}

/// Whether two existing paths are one file (hard links included).
fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_afkit_wrote_is_replaced_and_a_users_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("tasks.csv");
        let output = Output::new(false);
        output.write(&out, b"one").unwrap();
        output.write(&out, b"two").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"two");

        fs::write(&out, b"edited by the user").unwrap();
        let err = output.write(&out, b"three").unwrap_err();
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(fs::read(&out).unwrap(), b"edited by the user");
        Output::new(true).write(&out, b"three").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"three");
    }

    #[test]
    fn an_input_is_never_written_over_even_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.jsonl");
        fs::write(&input, b"data").unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let hard = dir.path().join("hard.jsonl");
        fs::hard_link(&input, &hard).unwrap();
        let output = Output::new(true).protect(&input);
        let dotted = dir.path().join(".").join("in.jsonl");
        for target in [&input, &link, &hard, &dotted] {
            assert!(output.write(target, b"x").is_err(), "{target:?}");
        }
        assert_eq!(fs::read(&input).unwrap(), b"data");
    }

    #[test]
    fn a_unit_killed_between_its_renames_is_finished_by_the_next_write_into_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dir.path().join("ds");
        let answers = dir.path().join("ds-answers.csv");
        let output = Output::new(false);
        let files = |v: &str| -> BTreeMap<String, Vec<u8>> {
            ["a.csv", "sub/b.csv"]
                .iter()
                .map(|n| (n.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        let beside = |v: &str| vec![(answers.clone(), v.as_bytes().to_vec())];
        output
            .folder_and_beside(&ds, &files("old"), "export", &beside("old"))
            .unwrap();

        // The new unit, killed after its journal and its first rename.
        let new = files("new");
        let mut staged = Vec::new();
        for (name, bytes) in &new {
            let mut s = output.stage_target(Target::in_folder(&ds, name)).unwrap();
            std::io::Write::write_all(s.file(), bytes).unwrap();
            staged.push(s);
        }
        let mut s = output.stage(&answers).unwrap();
        std::io::Write::write_all(s.file(), b"new").unwrap();
        staged.push(s);
        let journal = Journal::of(&staged, "export", Some((&ds, &new))).unwrap();
        record(&journal.ledger_entries(), "export", true).unwrap();
        drop(write_journal(&journal).unwrap());
        let mut staged = staged.into_iter();
        let first = staged.next().unwrap();
        first.temp.persist(&first.target.path).unwrap();
        for s in staged {
            s.temp.keep().unwrap(); // the killed process's files stay, its locks go
        }
        assert_eq!(fs::read(ds.join("a.csv")).unwrap(), b"new");
        assert_eq!(
            fs::read(&answers).unwrap(),
            b"old",
            "a mix, visibly unfinished"
        );
        assert!(ds.join(JOURNAL).exists() && dir.path().join(JOURNAL).exists());

        // The next write into the unit's folder finishes it first.
        let note = output.finish_interrupted(&ds).unwrap();
        assert!(note.is_some_and(|n| n.contains("interrupted")));
        for name in new.keys() {
            assert_eq!(fs::read(ds.join(name)).unwrap(), b"new", "{name}");
        }
        assert_eq!(fs::read(&answers).unwrap(), b"new");
        assert!(!ds.join(JOURNAL).exists() && !dir.path().join(JOURNAL).exists());
        output
            .folder_and_beside(&ds, &files("newer"), "export", &beside("newer"))
            .unwrap();
        assert_eq!(fs::read(ds.join("sub/b.csv")).unwrap(), b"newer");
    }

    #[test]
    fn a_killed_write_between_the_ledger_and_the_rename_can_be_rerun() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.csv");
        let output = Output::new(false);
        output.write(&out, b"old").unwrap();
        let new = hex(&Sha256::digest(b"new"));
        record(&[(Target::file(&out), new)], SINGLE_FILES, true).unwrap();
        output.check(&out).unwrap();
        fs::write(&out, b"new").unwrap(); // as if renamed, then killed
        output.write(&out, b"newer").unwrap();
    }
}
