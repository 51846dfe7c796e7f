//! Bias audit of any SWAG-format dataset, and grading of predictions.
//!
//! The audit asks how far a 4-way question can be answered without understanding it: by chance,
//! by ending length, by n-gram style of the ending / second sentence / whole text (SWAG Table 3,
//! left columns), which words give the gold away (PPMI), and how close held-out items sit to the
//! training items (KNN distances, AFLite Table 3); with `--cv`, also how each ending relates to
//! its context (`relational`). `--lm` adds language models' zero-shot accuracy (`lm`), and
//! `--control` audits a second dataset the same way and sets the two side by side (`verdict`,
//! which also says in words what each family of baselines found). It reads only the dataset
//! directories, so it works on afkit's exports, the SWAG release, or anyone's SWAG-format data.

pub mod cv;
mod dataset;
mod findings;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
mod grams;
mod knn;
pub mod lm;
mod ngram;
mod observer;
mod ppmi;
pub mod predictions;
mod relational;
mod report;
pub mod score;
mod timing;
mod verdict;

use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;

use afkit_engine::embed::{SentenceEncoder, VectorStore};
use afkit_engine::models::DefaultModel;
use afkit_engine::output::Output;
use afkit_engine::seed::Seed;
use afkit_store::dataset::Split;
use afkit_store::vector_cache::VectorCache;
use dataset::Question;
pub use findings::{AuditReport, CouldBeRight, CvAudit, Findings, Knn, Summary};
pub use observer::{Observer, Silent};

/// What an audit reads and writes, and its settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The dataset directory (SWAG regular-column CSVs).
    pub dataset: PathBuf,
    /// Where audit.md, audit.json and the charts go.
    pub out: PathBuf,
    /// `Some(K)`: K-fold cross-validation by group over every labelled split; `None`: train → val.
    pub cv: Option<usize>,
    /// Seed of the λ-selection split, the KNN sample and the cross-validation folds.
    pub seed: Seed,
    /// PPMI: words listed per label.
    pub ppmi_top: usize,
    /// PPMI: words seen fewer times than this are skipped.
    pub ppmi_min_count: u64,
    /// Why the KNN distances are not measured (`None`: they are).
    pub skip_knn: Option<String>,
    /// KNN: at most this many questions per split are embedded.
    pub knn_max: usize,
    /// Leave out everything that needs the MiniLM encoder.
    pub no_embed: bool,
    /// Folder of the embedding cache to read and add to (`None`: embed every text again).
    pub embedding_cache: Option<PathBuf>,
    /// Language models whose zero-shot accuracy is measured.
    pub lm: Vec<lm::LmSpec>,
    /// A dataset audited the same way and reported beside this one (into `out/control`).
    pub control: Option<PathBuf>,
    /// Replace report files afkit did not write (never the dataset's CSV files).
    pub force: bool,
    /// `--cv`: relabelled copies each trained baseline is measured on as well, whose scatter
    /// widens its standard error where the folds' own understates it (0: none).
    pub chance_copies: usize,
    /// Why `--cv`'s fine-tuned baseline is not measured (`None`: it is, as `fine_tune` says).
    pub skip_fine_tune: Option<String>,
    pub fine_tune: cv::FineTune,
}

impl Config {
    /// The same audit of the control dataset, its files under `out/control`.
    fn for_control(&self, dir: &std::path::Path) -> Config {
        Config {
            dataset: dir.to_path_buf(),
            out: self.out.join("control"),
            control: None,
            ..self.clone()
        }
    }

    /// How the report is written: never over the dataset's CSV files, and checked before any
    /// work, so an audit that could not write its report stops at once.
    fn output(&self) -> Result<Output> {
        let mut output = Output::new(self.force);
        if let Ok(entries) = std::fs::read_dir(&self.dataset) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "csv") {
                    output = output.protect(&path);
                }
            }
        }
        for name in report::FILES {
            output.check(&self.out.join(name))?;
        }
        Ok(output)
    }
}

/// Zero-shot accuracies of the config's language models on `questions`.
fn measure_lms(
    config: &Config,
    questions: &[Question],
    observer: &mut dyn Observer,
    timings: &mut Vec<timing::Timing>,
) -> Result<Vec<lm::LmResult>> {
    let mut results = Vec::with_capacity(config.lm.len());
    for spec in &config.lm {
        let started = std::time::Instant::now();
        // Each question twice: after its context, then its endings alone (the zero-prompt check).
        observer.counting(
            2 * questions.len(),
            &format!(
                "question passes by {} (with and without the context)",
                spec.name
            ),
        );
        let counter = Mutex::new(&mut *observer);
        let done = || {
            counter
                .lock()
                .expect("no scoring thread panicked")
                .counted(1)
        };
        results.push(lm::zero_shot(spec, questions, &done)?);
        let name = format!("{}{}", verdict::LM_PREFIX, spec.name);
        timing::add(timings, &name, started.elapsed().as_secs_f64());
    }
    Ok(results)
}

/// Audits the config's dataset (and its control) and writes the report files.
pub fn run(config: &Config, observer: &mut dyn Observer) -> Result<Summary> {
    Ok(match config.cv {
        Some(k) => Summary::CrossValidated(cross_validated(config, k, observer)?),
        None => Summary::Holdout(holdout(config, observer)?),
    })
}

/// The train → val audit: reads the dataset, measures, writes the report files.
fn holdout(config: &Config, observer: &mut dyn Observer) -> Result<AuditReport> {
    let output = config.output()?;
    let train = dataset::read_split(&config.dataset.join(Split::Train.regular_csv()), true)?;
    let val = dataset::read_split(&config.dataset.join(Split::Val.regular_csv()), true)?;
    if train.is_empty() || val.is_empty() {
        bail!(
            "{}: train.csv and val.csv need at least one question each (train {}, val {})",
            config.dataset.display(),
            train.len(),
            val.len()
        );
    }
    let started = std::time::Instant::now();
    let knn = match &config.skip_knn {
        Some(why) => Knn::Skipped {
            skipped: why.clone(),
        },
        None => measure_knn(&train, &val, config, observer)?,
    };
    let knn_seconds = started.elapsed().as_secs_f64();
    let mut report = audit(&train, &val, config, knn, observer);
    let findings = &mut report.findings;
    timing::add(&mut findings.timings, "knn", knn_seconds);
    findings.lm = measure_lms(config, &val, observer, &mut findings.timings)?;
    let control = match &config.control {
        Some(dir) => Some(
            holdout(&config.for_control(dir), observer)
                .with_context(|| format!("the control dataset {}", dir.display()))?,
        ),
        None => None,
    };
    (report.findings.summary, report.findings.verdicts) =
        verdict::judge(report.rows(), control.as_ref().map(|c| c.rows()).as_deref());
    report.control = control.map(Box::new);
    report::write(&config.out, &report, &output)?;
    Ok(report)
}

/// The K-fold audit over every labelled split, by group; writes the report files.
fn cross_validated(config: &Config, k: usize, observer: &mut dyn Observer) -> Result<CvAudit> {
    let output = config.output()?;
    let (questions, files) = dataset::read_labelled_splits(&config.dataset)?;
    for f in files
        .iter()
        .filter(|f| f.skipped.as_deref() == Some(dataset::NO_LABELS))
    {
        observer.note(&format!(
            "note: {} skipped: it has no labels",
            config.dataset.join(&f.file).display()
        ));
    }
    let mut cv = cross_validate_baselines(config, &questions, k, observer)?;
    let mut timings = std::mem::take(&mut cv.timings);
    let fine_tuned = timing::timed(&mut timings, cv::Baseline::FineTunedMiniLm.name(), || {
        fine_tuned(&questions, k, config, observer)
    })?;
    cv.baselines
        .push((cv::Baseline::FineTunedMiniLm, fine_tuned));
    let pooled: Vec<&Question> = questions.iter().collect();
    let ppmi = timing::timed(&mut timings, "ppmi", || {
        ppmi::top_associations(&pooled, config.ppmi_top, config.ppmi_min_count)
    });
    let lm = measure_lms(config, &questions, observer, &mut timings)?;
    let mut audit = CvAudit {
        cv,
        files,
        ppmi,
        findings: Findings {
            lm,
            timings,
            could_be_right: CouldBeRight::of(&questions),
            ..Findings::default()
        },
        control: None,
    };
    let control = match &config.control {
        Some(dir) => Some(
            cross_validated(&config.for_control(dir), k, observer)
                .with_context(|| format!("the control dataset {}", dir.display()))?,
        ),
        None => None,
    };
    (audit.findings.summary, audit.findings.verdicts) =
        verdict::judge(audit.rows(), control.as_ref().map(|c| c.rows()).as_deref());
    audit.control = control.map(Box::new);
    report::write_cv(&config.out, &audit, &output)?;
    Ok(audit)
}

/// The cross-validated baselines of `questions` in `k` folds, the MiniLM ones embedding through
/// the config's cache, or skipped with the reason when the encoder is unavailable.
fn cross_validate_baselines(
    config: &Config,
    questions: &[Question],
    k: usize,
    observer: &mut dyn Observer,
) -> Result<cv::CvReport> {
    let encoder = if config.no_embed {
        Err("--no-embed".to_string())
    } else {
        SentenceEncoder::load_default().map_err(|err| {
            observer.note(&format!("minilm_s2 skipped: {err:#}"));
            format!("MiniLM encoder unavailable: {err:#}")
        })
    };
    let cache = open_cache(config)?;
    let encode = |texts: &[&str], progress: &mut dyn FnMut(usize)| match &encoder {
        Ok(encoder) => embed(encoder, cache.as_ref(), texts, progress),
        Err(why) => bail!("{why}"),
    };
    let embedder = match &encoder {
        Ok(_) => cv::Embedder::Encoder(&encode),
        Err(why) => cv::Embedder::Unavailable(why.clone()),
    };
    let files_read = Split::ALL.map(|s| config.dataset.join(s.regular_csv()).display().to_string());
    cv::cross_validate(
        questions,
        (k, config.seed),
        &cv::Baseline::ALL,
        &embedder,
        config.chance_copies,
        observer,
    )
    .with_context(|| format!("--cv {k} on {}", files_read.join(", ")))
}

/// `--cv`'s fine-tuned baseline, or why it was skipped: the sentence model is fetched as the
/// other MiniLM baselines fetch it, and its absence is a reason, not an error.
fn fine_tuned(
    questions: &[Question],
    k: usize,
    config: &Config,
    observer: &mut dyn Observer,
) -> Result<cv::CvResult> {
    let skip = |why: String| Ok(cv::CvResult::Skipped { skipped: why });
    if let Some(why) = &config.skip_fine_tune {
        return skip(why.clone());
    }
    match DefaultModel::MiniLm.ensure() {
        Ok(dir) => cv::fine_tune(
            questions,
            (k, config.seed),
            &dir,
            &config.fine_tune,
            observer,
        ),
        Err(err) => {
            observer.note(&format!("finetune_minilm skipped: {err:#}"));
            skip(format!("MiniLM encoder unavailable: {err:#}"))
        }
    }
}

/// Everything but the KNN distances (which need the encoder), from labelled train and val.
fn audit(
    train: &[Question],
    val: &[Question],
    config: &Config,
    knn: Knn,
    observer: &mut dyn Observer,
) -> AuditReport {
    let seed = config.seed;
    let gold: Vec<usize> = val
        .iter()
        .map(|q| q.label.expect("labels checked on read"))
        .collect();
    let lengths = |q: &Question| -> [f64; 4] {
        std::array::from_fn(|o| ngram::words(&q.endings[o]).len() as f64)
    };
    let mut timings = Vec::new();
    let started = std::time::Instant::now();
    let shortest: Vec<[f64; 4]> = val.iter().map(|q| lengths(q).map(|l| -l)).collect();
    let longest: Vec<[f64; 4]> = val.iter().map(lengths).collect();
    timing::add(&mut timings, "length", started.elapsed().as_secs_f64());
    let (ngram_acc, lambda) = ngram_baselines(train, val, seed, observer, &mut timings);
    let all: Vec<&Question> = train.iter().chain(val).collect();
    let ppmi = timing::timed(&mut timings, "ppmi", || {
        ppmi::top_associations(&all, config.ppmi_top, config.ppmi_min_count)
    });
    AuditReport {
        n_train: train.len(),
        n_val: val.len(),
        seed,
        random: ngram::tie_aware_accuracy(&vec![[0.0; 4]; val.len()], &gold),
        shortest: ngram::tie_aware_accuracy(&shortest, &gold),
        longest: ngram::tie_aware_accuracy(&longest, &gold),
        ngram_end: ngram_acc[0],
        ngram_s2: ngram_acc[1],
        ngram_ctx: ngram_acc[2],
        lambda,
        ppmi,
        knn,
        findings: Findings {
            timings,
            could_be_right: CouldBeRight::of(train.iter().chain(val)),
            ..Findings::default()
        },
        control: None,
    }
}

/// The text of option `o` of a question that one n-gram classifier sees.
type View = dyn Fn(&Question, usize) -> String;

/// The val accuracy and chosen λ of the n-gram classifier of each view (ending, sent2 + ending,
/// whole text), each trained on train, timed into `timings`.
fn ngram_baselines(
    train: &[Question],
    val: &[Question],
    seed: Seed,
    observer: &mut dyn Observer,
    timings: &mut Vec<timing::Timing>,
) -> ([f64; 3], [f64; 3]) {
    let views: [&View; 3] = [
        &|q: &Question, o: usize| q.endings[o].clone(),
        &|q: &Question, o: usize| format!("{} {}", q.sent2, q.endings[o]),
        &|q: &Question, o: usize| format!("{} {} {}", q.sent1, q.sent2, q.endings[o]),
    ];
    let mut ngram_acc = [0.0; 3];
    let mut lambda = [0.0; 3];
    observer.counting(3, "n-gram classifiers");
    for (i, view) in views.iter().enumerate() {
        let started = std::time::Instant::now();
        let vocab = ngram::Vocabulary::fit(
            train
                .iter()
                .flat_map(|q| (0..4).map(move |o| view(q, o)))
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str),
        );
        let encode = |qs: &[Question]| -> Vec<ngram::Choice> {
            qs.iter()
                .map(|q| ngram::Choice {
                    options: std::array::from_fn(|o| vocab.features(&view(q, o))),
                    gold: q.label.expect("labels checked on read"),
                })
                .collect()
        };
        (ngram_acc[i], lambda[i]) =
            ngram::train_and_evaluate(&encode(train), &encode(val), vocab.len(), seed);
        observer.counted(1);
        let name = ["ngram_end", "ngram_s2", "ngram_ctx"][i];
        timing::add(timings, name, started.elapsed().as_secs_f64());
    }
    (ngram_acc, lambda)
}

/// A seeded sample of at most `max` questions, in their original order.
fn sample(questions: &[Question], max: usize, seed: Seed) -> Vec<&Question> {
    if questions.len() <= max {
        return questions.iter().collect();
    }
    let mut idx: Vec<usize> = (0..questions.len()).collect();
    idx.shuffle(&mut seed.rng());
    idx.truncate(max);
    idx.sort_unstable();
    idx.into_iter().map(|i| &questions[i]).collect()
}

/// KNN distances with MiniLM; when the encoder cannot be loaded (no cached model and no pip),
/// the audit goes on without them and says why.
fn measure_knn(
    train: &[Question],
    val: &[Question],
    config: &Config,
    observer: &mut dyn Observer,
) -> Result<Knn> {
    let (max, seed) = (config.knn_max, config.seed);
    let encoder = match SentenceEncoder::load_default() {
        Ok(encoder) => encoder,
        Err(err) => {
            observer.note(&format!("KNN distances skipped: {err:#}"));
            return Ok(Knn::Skipped {
                skipped: format!("MiniLM encoder unavailable: {err:#}"),
            });
        }
    };
    let cache = open_cache(config)?;
    let encode = |texts: &[&str], progress: &mut dyn FnMut(usize)| {
        embed(&encoder, cache.as_ref(), texts, progress)
    };
    let (train, val) = (sample(train, max, seed), sample(val, max, seed.plus(1)));
    Ok(Knn::Measured(knn::measure(
        &encode,
        "all-MiniLM-L6-v2",
        &train,
        &val,
        observer,
    )?))
}

/// The embedding cache the config names, shared by the calls of one audit.
fn open_cache(config: &Config) -> Result<Option<Mutex<VectorCache>>> {
    if config.no_embed {
        return Ok(None);
    }
    let cache = config
        .embedding_cache
        .as_deref()
        .map(afkit_store::vector_cache::VectorCache::open_in);
    Ok(cache.transpose()?.map(Mutex::new))
}

/// MiniLM vectors of `texts`, through the cache where there is one.
fn embed(
    encoder: &SentenceEncoder,
    cache: Option<&Mutex<VectorCache>>,
    texts: &[&str],
    progress: &mut dyn FnMut(usize),
) -> Result<Vec<Vec<f32>>> {
    let mut guard = cache.map(|c| c.lock().expect("no embedding call panicked"));
    let cache = guard.as_deref_mut().map(|c| c as &mut dyn VectorStore);
    encoder.encode_cached(texts, cache, progress)
}
