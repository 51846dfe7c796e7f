//! `afkit import-pool`: pools made elsewhere, streamed, checked whole before any write; scored
//! pools are taken with their own features, plain ones scored with the local model.

use std::collections::{BTreeMap, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::config::Observer;
use super::pool::{load_local, new_pool};
use super::prompt::PromptTemplate;
use afkit_engine::device::Compute;
use afkit_engine::json_errors::json_error_without_position;
use afkit_engine::lm::features::{features, ContextFeatures, EndingFeatures};
use afkit_engine::lm::local::LocalLm;
use afkit_engine::lm::sampler::{
    acceptable_ending, normalise_ending, EndingSampler, SampledEnding, SamplingParams,
};
use afkit_store::examples::Example;
use afkit_store::pool::{NewGeneration, NewPool};
use afkit_store::Store;

enum ImportedEnding {
    Text(String),
    Scored {
        text: String,
        features: EndingFeatures,
    },
}

impl ImportedEnding {
    fn text(&self) -> &str {
        match self {
            ImportedEnding::Text(text) | ImportedEnding::Scored { text, .. } => text,
        }
    }

    fn features(&self) -> Option<&EndingFeatures> {
        match self {
            ImportedEnding::Text(_) => None,
            ImportedEnding::Scored { features, .. } => Some(features),
        }
    }
}

struct ImportedContext {
    ctx_logprob: f64,
    n_tok_sent1: usize,
    n_tok_sent2: usize,
}

/// One line of an `import-pool` file. Either every ending is a plain string (afkit scores them
/// with `--model`), or the pool comes scored: every ending an object with its features, plus the
/// gold ending's and the context's features.
struct ImportRecord {
    id: String,
    endings: Vec<ImportedEnding>,
    gold: Option<EndingFeatures>,
    context: Option<ImportedContext>,
}

const IMPORT_FORMAT: &str = "expected {\"id\": string, \"endings\": [string, ...]} or, scored, \
     {\"id\", \"endings\": [{\"text\", \"lp_cond\", \"lp_alone\", \"lp_final_punct\", \"n_tok\"}, ...], \
     \"gold\": {\"lp_cond\", \"lp_alone\", \"lp_final_punct\", \"n_tok\"}, \
     \"context\": {\"ctx_logprob\", \"n_tok_sent1\", \"n_tok_sent2\"}}";

/// The most tokens a count may give (a context or ending longer than this is no caption).
const MAX_TOKENS: u64 = 1_000_000;

type Object = serde_json::Map<String, Value>;

/// What a JSON value is, in words.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "true or false",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `"key"` of `place` (`"gold"`, `ending 3`), for messages.
fn field_name(key: &str, place: &str) -> String {
    if place.is_empty() {
        format!("\"{key}\"")
    } else {
        format!("\"{key}\" of {place}")
    }
}

/// A token count: a whole number from 0 to [`MAX_TOKENS`].
fn token_count(object: &Object, key: &str, place: &str) -> Result<usize, String> {
    let name = field_name(key, place);
    match object.get(key) {
        None => Err(format!("{name} is missing")),
        Some(v) => v
            .as_u64()
            .filter(|&n| n <= MAX_TOKENS)
            .map(|n| n as usize)
            .ok_or_else(|| {
                format!("{name} must be a whole number of tokens from 0 to {MAX_TOKENS}, found {v}")
            }),
    }
}

/// A log-probability: a number no greater than 0.
fn log_prob(value: Option<&Value>, name: &str) -> Result<f64, String> {
    let v = value.ok_or_else(|| format!("{name} is missing"))?;
    v.as_f64()
        .filter(|x| x.is_finite() && *x <= 0.0)
        .ok_or_else(|| {
            format!("{name} must be a log-probability (a number no greater than 0), found {v}")
        })
}

/// An ending's features (of an ending object, or of `"gold"`).
fn ending_features(object: &Object, place: &str) -> Result<EndingFeatures, String> {
    let lp = |key: &str| log_prob(object.get(key), &field_name(key, place));
    let optional_lp = |key: &str| match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        v => log_prob(v, &field_name(key, place)).map(Some),
    };
    Ok(EndingFeatures {
        lp_cond: lp("lp_cond")?,
        lp_alone: optional_lp("lp_alone")?,
        lp_final_punct: optional_lp("lp_final_punct")?,
        n_tok: token_count(object, "n_tok", place)?,
    })
}

fn ending(value: &Value, number: usize) -> Result<ImportedEnding, String> {
    let place = format!("ending {number}");
    match value {
        Value::String(text) => Ok(ImportedEnding::Text(text.clone())),
        Value::Object(object) => {
            let text = match object.get("text") {
                Some(Value::String(text)) => text.clone(),
                Some(v) => {
                    return Err(format!(
                        "\"text\" of {place} must be a string, found {}",
                        kind(v)
                    ))
                }
                None => return Err(format!("{place} has no \"text\"")),
            };
            Ok(ImportedEnding::Scored {
                text,
                features: ending_features(object, &place)?,
            })
        }
        v => Err(format!(
            "{place} must be a string, or an object with \"text\" and its features; found {}",
            kind(v)
        )),
    }
}

fn context(object: &Object) -> Result<ImportedContext, String> {
    Ok(ImportedContext {
        ctx_logprob: log_prob(
            object.get("ctx_logprob"),
            &field_name("ctx_logprob", "\"context\""),
        )?,
        n_tok_sent1: token_count(object, "n_tok_sent1", "\"context\"")?,
        n_tok_sent2: token_count(object, "n_tok_sent2", "\"context\"")?,
    })
}

/// An optional object field, read by `read`.
fn optional_object<T>(
    object: &Object,
    key: &str,
    read: impl Fn(&Object) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(inner)) => read(inner).map(Some),
        Some(v) => Err(format!("\"{key}\" must be an object, found {}", kind(v))),
    }
}

impl ImportRecord {
    /// A record from one parsed line, every field checked and named in the error.
    fn from_json(value: &Value) -> Result<ImportRecord, String> {
        let Value::Object(object) = value else {
            return Err(format!(
                "expected one JSON object per line, found {}",
                kind(value)
            ));
        };
        let id = match object.get("id") {
            Some(Value::String(id)) => id.clone(),
            Some(v) => return Err(format!("\"id\" must be a string, found {}", kind(v))),
            None => return Err("\"id\" is missing".into()),
        };
        let endings = match object.get("endings") {
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, e)| ending(e, i + 1))
                .collect::<Result<Vec<_>, String>>()?,
            Some(v) => return Err(format!("\"endings\" must be a list, found {}", kind(v))),
            None => return Err("\"endings\" is missing".into()),
        };
        Ok(ImportRecord {
            id,
            endings,
            gold: optional_object(object, "gold", |o| ending_features(o, "\"gold\""))?,
            context: optional_object(object, "context", context)?,
        })
    }

    /// Whether the line brings its own features; an error for a line that brings only some.
    fn is_scored(&self) -> std::result::Result<bool, &'static str> {
        let scored = self
            .endings
            .iter()
            .filter(|e| e.features().is_some())
            .count();
        match (scored, &self.gold, &self.context) {
            (0, None, None) => Ok(false),
            (n, Some(_), Some(_)) if n == self.endings.len() => Ok(true),
            (n, _, _) if n != 0 && n != self.endings.len() => {
                Err("some endings have features and some do not")
            }
            _ => Err("scored endings need both \"gold\" and \"context\" features"),
        }
    }
}

/// The lines of an import file, parsed and checked one at a time, with their line numbers and
/// whether they bring their own features. A byte-order mark before the first line is skipped.
fn import_lines(
    path: &Path,
) -> Result<impl Iterator<Item = Result<(usize, ImportRecord, bool)>> + '_> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(std::io::BufReader::new(file)
        .lines()
        .enumerate()
        .map(|(i, line)| (i, line.map(|l| without_bom(i, l))))
        .filter(|(_, line)| line.as_ref().map_or(true, |l| !l.trim().is_empty()))
        .map(move |(i, line)| {
            let line = line
                .with_context(|| format!("{}:{}: cannot read the line", path.display(), i + 1))?;
            let (rec, scored) = parse_import_line(&line)
                .map_err(|why| anyhow!("{}:{}{why}; {IMPORT_FORMAT}", path.display(), i + 1))?;
            Ok((i + 1, rec, scored))
        }))
}

/// The first line without a byte-order mark (some editors on Windows write one).
fn without_bom(index: usize, line: String) -> String {
    match line.strip_prefix('\u{feff}') {
        Some(rest) if index == 0 => rest.to_string(),
        _ => line,
    }
}

/// One line: well-formed, with at least one ending, and scored either fully or not at all. The
/// error starts with `:COLUMN: ` when the JSON itself is malformed, else with `: `.
fn parse_import_line(line: &str) -> std::result::Result<(ImportRecord, bool), String> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| format!(":{}: {}", e.column(), json_error_without_position(&e)))?;
    let rec = ImportRecord::from_json(&value).map_err(|why| format!(": {why}"))?;
    if rec.endings.is_empty() {
        return Err(
            ": \"endings\" is empty, so the context would count as done without a pool \
                    to filter"
                .into(),
        );
    }
    let scored = rec.is_scored().map_err(|why| format!(": {why}"))?;
    Ok((rec, scored))
}

/// Reads every line of an `import-pool` file as the command does before it looks the ids up in
/// the project; returns the number of records. The entry point of the parser's fuzz target.
pub fn check_import_lines(path: &Path) -> Result<usize> {
    import_lines(path)?.try_fold(0, |records, line| line.map(|_| records + 1))
}

/// What a first pass over the whole file found: every line parses, names a known example once,
/// and is consistently scored or not. Nothing is written unless the whole file passes.
struct ImportCheck {
    /// Per line, in order: its example, or `None` for a record that ingest dropped (a pool made
    /// elsewhere for every input record).
    example_ids: Vec<Option<i64>>,
    unscored: usize,
}

impl ImportCheck {
    fn contexts(&self) -> usize {
        self.example_ids.iter().flatten().count()
    }

    fn dropped_at_ingest(&self) -> usize {
        self.example_ids.len() - self.contexts()
    }
}

fn check_import_file(store: &Store, path: &Path) -> Result<ImportCheck> {
    let mut seen = HashSet::new();
    let mut check = ImportCheck {
        example_ids: Vec::new(),
        unscored: 0,
    };
    for line in import_lines(path)? {
        let (n, rec, scored) = line?;
        let Some(example_id) = store.example_id_by_ext_id(&rec.id)? else {
            if store.dropped_reason(&rec.id)?.is_some() {
                check.example_ids.push(None);
                continue;
            }
            bail!(
                "{}:{n}: no example with id {:?} in the project",
                path.display(),
                rec.id
            );
        };
        if !seen.insert(example_id) {
            bail!("{}:{n}: id {:?} appears twice", path.display(), rec.id);
        }
        check.unscored += usize::from(!scored);
        check.example_ids.push(Some(example_id));
    }
    Ok(check)
}

/// Endings a pool commit gathers before it is written: big enough that SQLite's per-transaction
/// cost vanishes, small enough that an interrupted import loses seconds of work.
const IMPORT_COMMIT_ENDINGS: usize = 8192;

/// Writes whole pools in one transaction; returns the candidates stored.
fn write_pools(store: &mut Store, batch: &mut Vec<NewPool>) -> Result<usize> {
    store.transaction(|store| {
        let mut written = 0;
        for p in batch.drain(..) {
            written += store.write_pool(&p)?;
        }
        Ok(written)
    })
}

/// What an `import-pool` call reads.
pub struct ImportConfig {
    /// The JSONL file of pools.
    pub file: PathBuf,
    /// The `--model` value that scores endings imported without features (resolved, and the
    /// model fetched, only when some line needs it).
    pub scorer: String,
    pub template: PromptTemplate,
    /// Also score those endings after the document start alone, as `generate --alone-scores`.
    pub alone_scores: bool,
}

/// What an `import-pool` call did.
#[derive(Debug, Default)]
pub struct ImportSummary {
    /// Contexts whose pool was imported.
    pub imported: usize,
    /// Contexts that already had a pool.
    pub skipped: usize,
    pub endings: usize,
    /// Endings without final punctuation, kept as given.
    pub incomplete: usize,
    /// Lines whose records ingest dropped.
    pub dropped_at_ingest: usize,
    /// Contexts that brought their own LM features.
    pub scored_elsewhere: usize,
    /// Contexts scored with the local model.
    pub scored_here: usize,
    /// (line, id) of the records whose endings were all refused (blank, invisible or punctuation
    /// only, copies of the found ending): no pool is stored for them, so `generate` still
    /// samples one.
    pub without_usable_endings: Vec<(usize, String)>,
    /// Endings refused, by reason.
    pub refused_endings: BTreeMap<&'static str, usize>,
}

/// Why an imported ending is not a candidate, if it is not: it must have a letter or digit, and
/// differ from the found ending and the record's earlier endings by more than case, spacing and
/// invisible characters (`key` is what they are compared by).
fn refusal(text: &str, key: &str, seen: &HashSet<String>, found: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("blank or invisible characters only")
    } else if !text.chars().any(char::is_alphanumeric) {
        Some("no letter or digit")
    } else if key == found {
        Some("the found ending (up to case and spacing)")
    } else if seen.contains(key) {
        Some("a repeat of an earlier ending (up to case and spacing)")
    } else {
        None
    }
}

/// What endings are compared by: lowercase, invisible characters (zero-width spaces and joiners,
/// byte order marks, soft hyphens) removed, runs of white space as one space.
fn comparison_key(text: &str) -> String {
    let visible: String = text
        .chars()
        .filter(|c| {
            !matches!(
                c,
                '\u{200b}'..='\u{200d}' | '\u{2060}' | '\u{feff}' | '\u{ad}'
            )
        })
        .collect();
    normalise_ending(&visible).to_lowercase()
}

/// Imports a pools file whole, after checking every line: pools commit in batches, so an
/// interrupted import keeps what it committed and a second call skips those contexts.
pub fn import(
    store: &mut Store,
    config: &ImportConfig,
    observer: &mut dyn Observer,
) -> Result<ImportSummary> {
    let check = check_import_file(store, &config.file)?;
    if check.example_ids.is_empty() {
        bail!(
            "{}: no pools in the file; {IMPORT_FORMAT}, one per line",
            config.file.display()
        );
    }
    // The scoring model is loaded only when some line brings no features of its own.
    let lm = (check.unscored > 0)
        .then(|| scoring_model(config, observer))
        .transpose()?;
    let generation_id = import_generation(store, &config.file, &config.template, lm.as_ref())?;
    observer.started(check.contexts(), 0);
    let mut counts = ImportSummary {
        dropped_at_ingest: check.dropped_at_ingest(),
        scored_elsewhere: check.contexts() - check.unscored,
        scored_here: check.unscored,
        ..ImportSummary::default()
    };
    let mut batch: Vec<NewPool> = Vec::new();
    let mut batch_endings = 0;
    for (line, example_id) in import_lines(&config.file)?.zip(&check.example_ids) {
        if let Err(stop) = afkit_engine::interrupt::check() {
            write_pools(store, &mut batch)?;
            return Err(stop.into());
        }
        let (line_no, rec, _) = line?;
        let Some(example_id) = *example_id else {
            continue; // dropped at ingest
        };
        observer.context_done(0, None);
        let scoring = (lm.as_ref(), config);
        let Some((pool, kept)) = record_pool(
            store,
            example_id,
            (line_no, rec),
            scoring,
            generation_id,
            &mut counts,
        )?
        else {
            continue;
        };
        batch_endings += kept;
        batch.push(pool);
        counts.imported += 1;
        if batch_endings >= IMPORT_COMMIT_ENDINGS {
            counts.endings += write_pools(store, &mut batch)?;
            batch_endings = 0;
        }
    }
    counts.endings += write_pools(store, &mut batch)?;
    Ok(counts)
}

/// The pool a record (and its line number) brings to its context, with the number of endings it
/// keeps; `None`, counted in `counts`, when the context already has a pool or none of the
/// record's endings is usable. Its endings without final punctuation are counted too.
fn record_pool(
    store: &Store,
    example_id: i64,
    (line_no, rec): (usize, ImportRecord),
    scoring: (Option<&LocalLm>, &ImportConfig),
    generation_id: i64,
    counts: &mut ImportSummary,
) -> Result<Option<(NewPool, usize)>> {
    if store.has_pool(example_id)? {
        counts.skipped += 1;
        return Ok(None);
    }
    let t0 = Instant::now();
    let ex = store
        .example(example_id)?
        .expect("checked by the first pass");
    counts.incomplete += rec
        .endings
        .iter()
        .filter(|e| !acceptable_ending(&normalise_ending(e.text()), usize::MAX))
        .count();
    let refused = &mut counts.refused_endings;
    let Some((kept, features)) = pool_of_record(&ex, &rec, scoring, refused)? else {
        counts.without_usable_endings.push((line_no, rec.id));
        return Ok(None);
    };
    let pool = new_pool(
        &ex,
        generation_id,
        rec.endings.len(),
        &kept,
        &features,
        t0.elapsed().as_secs_f64(),
    );
    Ok(Some((pool, kept.len())))
}

/// The local model that scores the endings that came without features.
fn scoring_model(config: &ImportConfig, observer: &mut dyn Observer) -> Result<LocalLm> {
    let path = afkit_engine::models::generator_gguf(&config.scorer)?;
    observer.note(&format!("loading {}", path.display()));
    load_local(&path, SamplingParams::default(), &Compute::cpu())
}

/// The generation row the imported pools belong to: the file and what scored the endings that
/// came without features (the local model, or nothing).
fn import_generation(
    store: &mut Store,
    file: &Path,
    template: &PromptTemplate,
    lm: Option<&LocalLm>,
) -> Result<i64> {
    let (scorer, sha) = match lm {
        Some(lm) => {
            let (_, scorer, sha) = lm.describe();
            (scorer, sha)
        }
        None => ("features imported".to_string(), None),
    };
    let params = serde_json::json!({ "file": file.display().to_string(), "scorer": scorer });
    store.find_or_insert_generation(&NewGeneration {
        backend: "import".into(),
        model: scorer,
        model_sha256: sha,
        prompt: template.name.clone(),
        params_json: params.to_string(),
        // Nothing is drawn: imported endings come with the file.
        seed: afkit_engine::seed::Seed::default(),
    })
}

/// A record's endings, normalised and without the refused ones ([`refusal`], counted by reason
/// in `refused`), with their LM features: the record's own, or the local model's. `None` when
/// no ending is left: an empty pool would count the context as done.
fn pool_of_record(
    ex: &Example,
    rec: &ImportRecord,
    (lm, config): (Option<&LocalLm>, &ImportConfig),
    refused: &mut BTreeMap<&'static str, usize>,
) -> Result<Option<(Vec<SampledEnding>, ContextFeatures)>> {
    let found = comparison_key(&ex.ending);
    let mut seen: HashSet<String> = HashSet::new();
    let mut kept = Vec::new();
    let mut imported_endings: Vec<&ImportedEnding> = Vec::new();
    for e in &rec.endings {
        let text = normalise_ending(e.text());
        let key = comparison_key(&text);
        if let Some(reason) = refusal(&text, &key, &seen, &found) {
            *refused.entry(reason).or_default() += 1;
            continue;
        }
        seen.insert(key);
        kept.push(SampledEnding { text, tokens: None });
        imported_endings.push(e);
    }
    if kept.is_empty() {
        return Ok(None);
    }
    let features = match (&rec.gold, &rec.context) {
        (Some(gold), Some(context)) => ContextFeatures {
            ctx_logprob: context.ctx_logprob,
            n_tok_sent1: context.n_tok_sent1,
            n_tok_sent2: context.n_tok_sent2,
            gold: gold.clone(),
            endings: imported_endings
                .iter()
                .map(|e| e.features().cloned().expect("checked by the first pass"))
                .collect(),
        },
        _ => {
            let lm = lm.expect("loaded when a line has no features");
            let prompt = config.template.render(&ex.sent1, &ex.sent2);
            let context = (ex.sent1.as_str(), ex.sent2.as_str());
            features(
                lm,
                &prompt,
                &prompt,
                context,
                &ex.ending,
                &kept,
                config.alone_scores,
            )?
        }
    };
    Ok(Some((kept, features)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(line: &str) -> String {
        parse_import_line(line).err().expect("refused")
    }

    #[test]
    fn lines_are_refused_in_words_a_user_knows() {
        assert!(error(r#"["v#0", ["a."]]"#).contains("one JSON object per line, found a list"));
        let said = error(r#"{"id": "v#0", "endings": [3]}"#);
        assert!(said.contains("ending 1 must be a string"), "{said}");
        assert!(!said.contains("enum"), "{said}");
        let scored = |n_tok_sent1: &str, lp: &str| {
            format!(
                r#"{{"id": "v", "endings": [{{"text": "a.", "lp_cond": {lp}, "lp_alone": -1, "n_tok": 2}}],
                   "gold": {{"lp_cond": -1, "lp_alone": -1, "n_tok": 2}},
                   "context": {{"ctx_logprob": -1, "n_tok_sent1": {n_tok_sent1}, "n_tok_sent2": 1}}}}"#
            )
        };
        let said = error(&scored("10000000000000000000", "-1"));
        assert!(
            said.contains("\"n_tok_sent1\" of \"context\" must be a whole number of tokens"),
            "{said}"
        );
        assert!(error(&scored("-3", "-1")).contains("whole number"));
        let said = error(&scored("5", "2.5"));
        assert!(
            said.contains("\"lp_cond\" of ending 1 must be a log-probability"),
            "{said}"
        );
        let (rec, scored_line) = parse_import_line(&scored("5", "-1")).unwrap();
        assert!(scored_line);
        assert_eq!(rec.context.unwrap().n_tok_sent1, 5);
    }
}
