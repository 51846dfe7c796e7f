//! Pool bundles (`afkit pool export` / `afkit pool import`): a project's pools with every stored
//! feature and score, without the corpus, so that the pools of a set of contexts can be kept (in
//! a repository, say) and filtered again in another project that ingested the same corpus.
//!
//! A bundle is a zip archive holding one deflated file, [`ENTRY`], of JSON lines:
//!
//! 1. a header: `{"format": "afkit pool bundle", "version": 2, "contexts": N, "generations":
//!    [...], "scorers": [...]}`, the generation jobs (backend, model, its SHA-256, prompt,
//!    settings, seed, start time) and the scorer models' SHA-256s that the lines name by index;
//! 2. one line per context, `{"context": {...}}`, in the source project's example order: its id
//!    (the ingested record's id, e.g. `video#index`), `hash` (SHA-256 of its group, sent1, sent2
//!    and found ending, so that a context whose text differs is refused), its `pool` row, its
//!    `endings` (the found one first, without its text, then the candidates in the order they
//!    were stored; each with its LM features and scorer scores), its growth rounds and the
//!    generation jobs that could not use it (the header's jobs and a line's parts are the
//!    store's `bundle` rows, which carry the bundle's keys);
//! 3. `{"end": {"contexts": N, "endings": M}}`, so a cut-off file is refused.
//!
//! Version 2 lets a scorer reading's score alone be null (the scorer now reads each ending after
//! its context only); version 1 bundles, where it is always a number, are read as well.
//!
//! Floats are written in their shortest form that reads back to the same bits, timestamps as
//! stored, and the archive's dates are fixed: exporting the same pools gives the same bytes,
//! and export → import → export gives the bundle back unchanged. Sentence vectors are not
//! carried (`filter` recomputes them); nor is anything of AF runs (a growth round names the run
//! it answered by that run's id in the project that grew the pool).
//!
//! Import checks the whole bundle against the project before it writes anything, and writes it
//! in one transaction: a killed import leaves the project as it was. It refuses a context the
//! project has not ingested, one whose text differs, and one that already has a pool. By default
//! one refused context refuses the bundle; a caller may instead leave the refused contexts out
//! (a corpus ingested by a later afkit can lack a few contexts that earlier rules kept).

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use afkit_engine::output::Output;
use afkit_store::bundle::{
    BundleContents, BundleEnding, BundleGeneration, BundleGrowth, BundlePool, BundleUnusable,
    ContextRows,
};
use afkit_store::examples::Example;
use afkit_store::Store;

/// The bundle's `format` field.
pub(crate) const FORMAT: &str = "afkit pool bundle";
/// The version this build writes; it reads every version from 1 up to it.
pub(crate) const VERSION: u32 = 2;
/// The one file in the archive.
pub(crate) const ENTRY: &str = "pools.jsonl";
/// Problems listed by a refused import before the count of the rest.
const SHOWN_PROBLEMS: usize = 10;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    version: u32,
    contexts: usize,
    generations: Vec<BundleGeneration>,
    scorers: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleContext {
    id: String,
    hash: String,
    pool: Option<BundlePool>,
    endings: Vec<BundleEnding>,
    growth: Vec<BundleGrowth>,
    unusable: Vec<BundleUnusable>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    contexts: usize,
    endings: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    Context(Box<BundleContext>),
    End(End),
}

/// What `pool export` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportSummary {
    pub file: PathBuf,
    pub contexts: usize,
    pub pools: usize,
    /// Generated endings (the found ones, carried without their text, not counted).
    pub endings: usize,
    pub bytes: u64,
}

/// What `pool import` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImportSummary {
    pub contexts: usize,
    pub pools: usize,
    /// Generated endings.
    pub endings: usize,
    pub generations: usize,
    /// The contexts left out (only with [`Unfit::LeaveOut`]), each with the reason.
    pub left_out: Vec<LeftOut>,
}

/// A bundle's context that the project could not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub id: String,
    pub reason: String,
}

/// What an import does with contexts the project cannot take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfit {
    /// Refuse the whole bundle, listing them.
    Refuse,
    /// Import every other context and report them.
    LeaveOut,
}

/// The hash a bundle keys a context's text by: SHA-256 of its group, sent1, sent2 and found
/// ending, NUL-separated.
fn context_hash(ex: &Example) -> String {
    let mut h = Sha256::new();
    for part in [&ex.group, &ex.sent1, &ex.sent2, &ex.ending] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    afkit_engine::models::hex(&h.finalize())
}

/// Writes the project's pools to `file` (through `output`: never over the project, a temporary
/// file renamed into place).
pub fn export_bundle(store: &Store, file: &Path, output: &Output) -> Result<ExportSummary> {
    let output = output.clone().protect_project(store.path());
    output.check(file)?;
    let contents = store.bundle_contents()?;
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        contexts: contents.contexts.len(),
        generations: contents.generations.clone(),
        scorers: contents.scorers.clone(),
    };
    let mut staged = output.stage(file)?;
    let mut summary = ExportSummary {
        file: file.to_path_buf(),
        contexts: contents.contexts.len(),
        pools: 0,
        endings: 0,
        bytes: 0,
    };
    {
        let mut zip = zip::ZipWriter::new(staged.file());
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .last_modified_time(zip::DateTime::default())
            .unix_permissions(0o644);
        zip.start_file(ENTRY, options)?;
        let mut out = std::io::BufWriter::new(&mut zip);
        write_line(&mut out, &header)?;
        let mut all_endings = 0;
        for &id in &contents.contexts {
            afkit_engine::interrupt::check()?;
            let line = bundle_context(store, &contents, id)?;
            summary.pools += usize::from(line.pool.is_some());
            summary.endings += line.endings.len().saturating_sub(1);
            all_endings += line.endings.len();
            write_line(&mut out, &Line::Context(Box::new(line)))?;
        }
        let end = End {
            contexts: contents.contexts.len(),
            endings: all_endings,
        };
        write_line(&mut out, &Line::End(end))?;
        out.flush()?;
        drop(out);
        zip.finish()?;
    }
    summary.bytes = staged.file().metadata()?.len();
    output.commit(vec![staged])?;
    Ok(summary)
}

fn write_line(out: &mut impl Write, value: &impl Serialize) -> Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// One context of the project as a bundle line.
fn bundle_context(
    store: &Store,
    contents: &BundleContents,
    example_id: i64,
) -> Result<BundleContext> {
    let ex = store
        .example(example_id)?
        .with_context(|| format!("example {example_id} is gone"))?;
    let rows = store.bundle_context(contents, example_id)?;
    let line = BundleContext {
        hash: context_hash(&ex),
        id: ex.ext_id,
        pool: rows.pool,
        endings: rows.endings,
        growth: rows.growth,
        unusable: rows.unusable,
    };
    check_finite(&line)?;
    Ok(line)
}

/// JSON has no infinities or NaN: a stored one would come back as something else, so it is
/// refused by name rather than written.
fn check_finite(c: &BundleContext) -> Result<()> {
    let mut floats: Vec<f64> = Vec::new();
    if let Some(p) = &c.pool {
        floats.extend(p.ctx_logprob);
        floats.push(p.seconds);
    }
    for e in &c.endings {
        floats.extend(
            [e.lp_cond, e.lp_alone, e.lp_final_punct]
                .into_iter()
                .flatten(),
        );
        floats.extend(e.scores.iter().flat_map(|s| [Some(s.1), s.2]).flatten());
    }
    floats.extend(c.growth.iter().map(|g| g.seconds));
    if floats.iter().any(|x| !x.is_finite()) {
        bail!(
            "context {} has a feature or score that is not a finite number; a bundle cannot \
             carry it",
            c.id
        );
    }
    Ok(())
}

/// Reads a bundle: the header, then `each` on every context line in order (checked on its own:
/// indices in range, the found ending first, candidate texts present and distinct), then the
/// closing line's counts. Fails on anything else, naming the line.
fn read_bundle<R: Read + Seek>(
    reader: R,
    mut each: impl FnMut(&Header, BundleContext) -> Result<()>,
) -> Result<Header> {
    let mut archive = zip::ZipArchive::new(reader).map_err(|e| {
        anyhow!("not a pool bundle, or one cut off or damaged (the zip archive is unreadable: {e})")
    })?;
    let entry = archive
        .by_name(ENTRY)
        .map_err(|e| anyhow!("not a pool bundle: the archive has no {ENTRY} ({e})"))?;
    let mut lines = BufReader::new(entry).lines();
    let mut next = |n: usize| -> Result<Option<String>> {
        lines
            .next()
            .transpose()
            .with_context(|| format!("{ENTRY} line {n}: unreadable (cut off or damaged)"))
    };
    let first = next(1)?.ok_or_else(|| anyhow!("{ENTRY} is empty"))?;
    let header = read_header(&first)?;
    let (mut contexts, mut endings) = (0, 0);
    let mut seen = HashSet::new();
    for n in 2.. {
        let Some(text) = next(n)? else {
            bail!("{ENTRY} ends at line {n} without its closing line: the bundle is cut off");
        };
        let line: Line =
            serde_json::from_str(&text).map_err(|e| anyhow!("{ENTRY} line {n}: {e}"))?;
        match line {
            Line::Context(c) => {
                let c = *c;
                check_context(&header, &c)
                    .with_context(|| format!("{ENTRY} line {n}, context {}", c.id))?;
                if !seen.insert(c.id.clone()) {
                    bail!("{ENTRY} line {n}: context {} appears twice", c.id);
                }
                contexts += 1;
                endings += c.endings.len();
                each(&header, c)?;
            }
            Line::End(end) => {
                if (end.contexts, end.endings) != (contexts, endings) || contexts != header.contexts
                {
                    bail!(
                        "{ENTRY} line {n}: the bundle says {} contexts and {} endings, but holds \
                         {contexts} and {endings}",
                        end.contexts,
                        end.endings
                    );
                }
                if next(n + 1)?.is_some() {
                    bail!("{ENTRY}: lines after the closing line {n}");
                }
                return Ok(header);
            }
        }
    }
    unreachable!("the loop returns or fails")
}

fn read_header(first: &str) -> Result<Header> {
    let value: serde_json::Value = serde_json::from_str(first)
        .map_err(|e| anyhow!("{ENTRY} line 1 is not a bundle header: {e}"))?;
    if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        bail!("not a pool bundle: {ENTRY} line 1 does not say \"format\": \"{FORMAT}\"");
    }
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if (1..=u64::from(VERSION)).contains(&v) => {}
        Some(v) if v > u64::from(VERSION) => bail!(
            "the bundle has format version {v}, newer than this afkit reads ({VERSION}); \
             upgrade afkit"
        ),
        other => bail!("the bundle's format version {other:?} is not one afkit reads"),
    }
    serde_json::from_value(value).map_err(|e| anyhow!("{ENTRY} line 1: {e}"))
}

/// The checks a context line needs on its own (no project).
fn check_context(header: &Header, c: &BundleContext) -> Result<()> {
    let generations = header.generations.len();
    let generation_ok = |g: usize| {
        if g < generations {
            Ok(())
        } else {
            Err(anyhow!("generation {g} is not in the header"))
        }
    };
    if c.hash.len() != 64 || !c.hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("hash {:?} is not a SHA-256", c.hash);
    }
    match (&c.pool, c.endings.first()) {
        (Some(p), Some(gold)) if gold.text.is_none() => generation_ok(p.generation)?,
        (Some(_), _) => bail!("a pool's endings must start with the found one (no text)"),
        (None, None) if !c.unusable.is_empty() => {}
        (None, _) => bail!("a context without a pool has no endings and is unusable"),
    }
    if !c.growth.is_empty() && c.pool.is_none() {
        bail!("growth rounds without a pool");
    }
    let mut texts = HashSet::new();
    for e in c.endings.iter().skip(1) {
        let text = e
            .text
            .as_deref()
            .context("only the first ending may be the found one")?;
        if text.trim().is_empty() || !texts.insert(text) {
            bail!("ending {text:?} is blank or appears twice");
        }
    }
    for e in &c.endings {
        e.generation.map(generation_ok).transpose()?;
        if e.scores.iter().any(|s| s.0 >= header.scorers.len()) {
            bail!("a score names a scorer model that is not in the header");
        }
    }
    c.growth
        .iter()
        .try_for_each(|g| generation_ok(g.generation))?;
    c.unusable
        .iter()
        .try_for_each(|u| generation_ok(u.generation))
}

/// Reads a whole bundle from bytes without a project: the fuzz target's entry.
pub fn check_bundle_bytes(bytes: &[u8]) -> Result<usize> {
    let mut n = 0;
    read_bundle(std::io::Cursor::new(bytes), |_, _| {
        n += 1;
        Ok(())
    })?;
    Ok(n)
}

fn open(file: &Path) -> Result<File> {
    File::open(file).with_context(|| format!("cannot open the bundle {}", file.display()))
}

/// Imports the bundle `file` into the project: every context checked first (ingested, same
/// text, no pool yet, the contexts its pool was primed with ingested too), then everything
/// written in one transaction. What happens to a context that fails a check is `unfit`'s.
pub fn import_bundle(store: &mut Store, file: &Path, unfit: Unfit) -> Result<ImportSummary> {
    let in_file = |e: anyhow::Error| e.context(format!("bundle {}", file.display()));
    store.write_transaction(|store| {
        let mut left_out = Vec::new();
        read_bundle(open(file)?, |_, c| {
            if let Err(e) = check_against(store, &c) {
                left_out.push(LeftOut {
                    id: c.id.clone(),
                    reason: format!("{e:#}"),
                });
            }
            Ok(())
        })
        .map_err(in_file)?;
        if !left_out.is_empty() && unfit == Unfit::Refuse {
            bail!(
                "nothing imported from {}; {} (--leave-out-unfit imports the contexts that fit)",
                file.display(),
                problem_list(&left_out)
            );
        }
        let skip: HashSet<&str> = left_out.iter().map(|l| l.id.as_str()).collect();
        let mut summary = write_all(store, file, &skip).map_err(in_file)?;
        if summary.contexts == 0 {
            bail!(
                "nothing imported from {}: no context of it fits this project; {}",
                file.display(),
                problem_list(&left_out)
            );
        }
        summary.left_out = left_out;
        Ok(summary)
    })
}

/// The first [`SHOWN_PROBLEMS`] refused contexts with their reasons, then how many more.
fn problem_list(left_out: &[LeftOut]) -> String {
    let more = left_out.len().saturating_sub(SHOWN_PROBLEMS);
    let mut list: Vec<String> = left_out
        .iter()
        .take(SHOWN_PROBLEMS)
        .map(|l| format!("context {}: {}", l.id, l.reason))
        .collect();
    if more > 0 {
        list.push(format!("and {more} more"));
    }
    list.join("; ")
}

/// Why the project cannot take this context, if it cannot.
fn check_against(store: &Store, c: &BundleContext) -> Result<()> {
    let ex = target_example(store, &c.id)?;
    if context_hash(&ex) != c.hash {
        bail!(
            "its text in this project (group, sent1, sent2 or found ending) differs from the \
             bundle's; ingest the corpus the bundle was made from"
        );
    }
    if store.has_pool(ex.id)? {
        bail!("it already has a pool in this project (a bundle adds pools, it never replaces one)");
    }
    if let Some(style) = c.pool.as_ref().and_then(|p| p.style_examples.as_ref()) {
        for id in style {
            if store.example_id_by_ext_id(id)?.is_none() {
                bail!("context {id}, shown before it when its pool was sampled, is not ingested");
            }
        }
    }
    if let Some(e) = c
        .endings
        .iter()
        .find(|e| e.text.as_deref() == Some(&ex.ending))
    {
        bail!("a candidate ending {:?} is its found ending", e.text);
    }
    Ok(())
}

fn target_example(store: &Store, ext_id: &str) -> Result<Example> {
    let id = store.example_id_by_ext_id(ext_id)?.ok_or_else(|| {
        anyhow!("it is not in this project: ingest the corpus the bundle was made from")
    })?;
    Ok(store.example(id)?.expect("the example exists"))
}

/// The second pass of an import, the checks done: the generation jobs, then every context but
/// those in `skip`.
fn write_all(store: &Store, file: &Path, skip: &HashSet<&str>) -> Result<ImportSummary> {
    let mut summary = ImportSummary {
        contexts: 0,
        pools: 0,
        endings: 0,
        generations: 0,
        left_out: Vec::new(),
    };
    let mut gen_ids: Option<Vec<i64>> = None;
    read_bundle(open(file)?, |header, c| {
        afkit_engine::interrupt::check()?;
        if skip.contains(c.id.as_str()) {
            return Ok(());
        }
        if gen_ids.is_none() {
            gen_ids = Some(store.find_or_insert_bundle_generations(&header.generations)?);
            summary.generations = header.generations.len();
        }
        let ids = gen_ids.as_deref().expect("set above");
        let ex = target_example(store, &c.id)?;
        summary.contexts += 1;
        summary.pools += usize::from(c.pool.is_some());
        summary.endings += c.endings.len().saturating_sub(1);
        let rows = ContextRows {
            pool: c.pool,
            endings: c.endings,
            growth: c.growth,
            unusable: c.unusable,
        };
        store.write_bundle_context(ex.id, &rows, ids, &header.scorers)
    })?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::check_bundle_bytes;

    #[test]
    fn the_fuzz_seed_reads_and_a_cut_one_does_not() {
        let bytes = include_bytes!("../../../fuzz/seeds/pool_bundle/two-contexts.afpool.zip");
        assert_eq!(check_bundle_bytes(bytes).unwrap(), 2);
        let err = check_bundle_bytes(&bytes[..bytes.len() - 10]).unwrap_err();
        assert!(format!("{err:#}").contains("cut off or damaged"), "{err:#}");
        assert!(check_bundle_bytes(b"not a zip").is_err());
    }
}
