//! `afkit tagger`: train, evaluate and run afkit's part-of-speech tagger.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use afkit_engine::output::Output;
use afkit_engine::seed::Seed;
use afkit_engine::text::{read_conllu, split_with, tokenize, TaggedSentence, Tagger, TrainOptions};

#[derive(clap::Subcommand)]
pub enum TaggerCommand {
    /// Train an averaged-perceptron UPOS tagger on CoNLL-U treebanks.
    ///
    /// The shipped tagger (data/tagger.bin) was trained with
    /// `afkit tagger train --conllu en_ewt-ud-dev.conllu en_pud-ud-test.conllu --out data/tagger.bin`
    /// (`--force` replaces the checked-in file).
    Train {
        /// Training treebanks in CoNLL-U format (FORM and UPOS columns are read).
        #[arg(long, required = true, num_args = 1..)]
        conllu: Vec<PathBuf>,
        /// Where to write the trained weights (never over a treebank; an existing file afkit did
        /// not write needs --force).
        #[arg(long)]
        out: PathBuf,
        /// Replace OUT even if afkit did not write it (or it was changed since).
        #[arg(long)]
        force: bool,
        /// Passes over the training data.
        #[arg(long, default_value_t = TrainOptions::default().epochs)]
        epochs: usize,
        /// Seed of the shuffling between passes.
        #[arg(long, default_value_t = Seed::default())]
        seed: Seed,
    },
    /// Evaluate a tagger on CoNLL-U treebanks (gold tokenisation); prints "accuracy: 0.xxxx".
    Eval {
        /// Held-out treebanks in CoNLL-U format.
        #[arg(long, required = true, num_args = 1..)]
        conllu: Vec<PathBuf>,
        /// Weights to evaluate (default: the tagger shipped with afkit).
        #[arg(long)]
        model: Option<PathBuf>,
    },
    /// Tokenise and tag plain text, one sentence per line ("-" reads standard input).
    ///
    /// Prints `word/TAG ...` per line, or with `--split` the `sent2 | ending` split that ingest
    /// would make (`-` when the sentence has no verb phrase). The throughput goes to stderr.
    Tag {
        /// Text file with one sentence per line.
        file: PathBuf,
        /// Print the sent2 | ending split instead of the tags.
        #[arg(long)]
        split: bool,
        /// Weights to use (default: the tagger shipped with afkit).
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

pub fn run_tagger(command: TaggerCommand) -> Result<()> {
    match command {
        TaggerCommand::Train {
            conllu,
            out,
            epochs,
            seed,
            force,
        } => {
            let output = conllu
                .iter()
                .fold(Output::new(force), |output, file| output.protect(file));
            output.check(&out)?;
            train(&conllu, &out, &TrainOptions { epochs, seed }, &output)
        }
        TaggerCommand::Eval { conllu, model } => {
            let tagger = load_or_shipped(model.as_deref())?;
            let sentences = read_all(&conllu)?;
            let started = Instant::now();
            let (correct, total) = tagger.accuracy(&sentences);
            let seconds = started.elapsed().as_secs_f64();
            anyhow::ensure!(total > 0, "no tokens in the evaluation files");
            println!("accuracy: {:.4}", correct as f64 / total as f64);
            println!(
                "tokens: {total}, sentences: {}, {:.0} sentences/s",
                sentences.len(),
                sentences.len() as f64 / seconds
            );
            Ok(())
        }
        TaggerCommand::Tag { file, split, model } => {
            let tagger = load_or_shipped(model.as_deref())?;
            tag_lines(tagger, &file, split)
        }
    }
}

fn train(files: &[PathBuf], out: &Path, options: &TrainOptions, output: &Output) -> Result<()> {
    let sentences = read_all(files)?;
    let names = files
        .iter()
        .map(|f| {
            f.file_name()
                .map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into())
        })
        .collect();
    let started = Instant::now();
    let tagger = Tagger::train(&sentences, names, options, |epoch, accuracy| {
        eprintln!("epoch {epoch:>2}: training accuracy {accuracy:.4}");
    })?;
    tagger.save(out, output)?;
    let size = std::fs::metadata(out)?.len();
    println!(
        "trained on {} sentences ({} tokens) in {:.1} s; wrote {} ({} bytes)",
        tagger.info.sentences,
        tagger.info.tokens,
        started.elapsed().as_secs_f64(),
        out.display(),
        size
    );
    Ok(())
}

fn read_all(files: &[PathBuf]) -> Result<Vec<TaggedSentence>> {
    let mut sentences = Vec::new();
    for file in files {
        sentences.extend(read_conllu(file)?);
    }
    Ok(sentences)
}

enum TaggerRef {
    Shipped,
    Loaded(Box<Tagger>),
}

impl std::ops::Deref for TaggerRef {
    type Target = Tagger;
    fn deref(&self) -> &Tagger {
        match self {
            TaggerRef::Shipped => Tagger::shipped(),
            TaggerRef::Loaded(t) => t,
        }
    }
}

fn load_or_shipped(path: Option<&Path>) -> Result<TaggerRef> {
    Ok(match path {
        Some(p) => TaggerRef::Loaded(Box::new(Tagger::load(p)?)),
        None => TaggerRef::Shipped,
    })
}

fn tag_lines(tagger: TaggerRef, file: &Path, split: bool) -> Result<()> {
    let lines: Vec<String> = if file.as_os_str() == "-" {
        std::io::stdin().lock().lines().collect::<Result<_, _>>()?
    } else {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {} as UTF-8 text", file.display()))?;
        text.lines().map(str::to_string).collect()
    };
    let started = Instant::now();
    let rendered: Vec<String> = {
        use rayon::prelude::*;
        lines
            .par_iter()
            .map(|line| {
                if split {
                    match split_with(&tagger, line) {
                        Some((sent2, ending)) => format!("{sent2} | {ending}"),
                        None => "-".to_string(),
                    }
                } else {
                    let words = tokenize(line);
                    let tags = tagger.tag(&words);
                    words
                        .iter()
                        .zip(tags)
                        .map(|(w, t)| format!("{w}/{t}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                }
            })
            .collect()
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut stdout = std::io::stdout().lock();
    for line in rendered {
        writeln!(stdout, "{line}")?;
    }
    eprintln!(
        "{} sentences in {seconds:.3} s ({:.0} sentences/s)",
        lines.len(),
        lines.len() as f64 / seconds.max(1e-9)
    );
    Ok(())
}
