//! Verified assembly: the rules of [`rules`] applied to every context's annotation rounds.
//!
//! A context's rounds are read in order; the first whose labels make the found ending gold
//! decides its question (a round before it was sent back for re-annotation). A question shows
//! three of its generations judged unlikely, and annotators often accept exactly three, which
//! leaves no choice. So when the deciding round accepted fewer than `choose_from`, the context
//! gets one spare round: its found ending beside up to five scored pool endings no annotator has
//! seen. The spare round's ranks say nothing of the found ending, whose place is settled; its
//! generations judged unlikely and not ranked best join the candidates. Once every context is
//! decided, [`choice`] orders each question's candidates by how real they look, so that the three
//! shown are the hardest of what annotators accepted. The question is built from the labels in
//! hand while its spare round waits; assembling again after the spare labels arrive widens the
//! choice.

use std::collections::{BTreeSet, HashMap, HashSet};

use anyhow::Result;

use afkit_engine::seed::Seed;
use afkit_store::annotate::labels::SubmissionRecord;
use afkit_store::annotate::tasks::ENDINGS_PER_TASK;
use afkit_store::assemble::{CurrentTask, FinalPoint, NewAssembled};
use afkit_store::dataset::{Judgement, Rank, Split};
use afkit_store::examples::Example;
use afkit_store::Store;

use super::choice;
use super::order::{DistractorOrder, RunData};
use super::rules::{self, Built, Decision};
use super::summary::Summary;

/// What verified assembly reads besides the labels.
pub(crate) struct Inputs<'a> {
    pub store: &'a Store,
    pub run_id: i64,
    pub run: &'a RunData<'a>,
    pub order: &'a DistractorOrder,
    /// A question whose deciding round accepted fewer generations than this gets a spare
    /// round, and one with more than three has its three chosen by [`choice`]; 3 turns both off.
    pub choose_from: usize,
    /// Seed of the choice's folds.
    pub seed: Seed,
    /// The candidates question reviews set aside, by context.
    pub vetoes: &'a HashMap<i64, HashSet<i64>>,
}

/// From the annotators' labels: the verified examples, and the items to send back for
/// re-annotation or a spare round (with the endings their new task shows).
pub(crate) fn assemble(
    inputs: &Inputs,
    examples: &[Example],
    summary: &mut Summary,
    reannotations: &mut Vec<(i64, Vec<i64>)>,
) -> Result<Vec<NewAssembled>> {
    let tasks = inputs.store.current_tasks()?;
    let mut verifier = Verifier {
        inputs,
        built: Vec::new(),
        choosable: Vec::new(),
        summary,
        reannotations,
    };
    for ex in examples {
        if !inputs.run.assignments.contains_key(&ex.id) {
            continue;
        }
        match tasks.get(&ex.id) {
            Some(task) => verifier.decide(ex, task)?,
            None => verifier.summary.awaiting_labels += 1,
        }
    }
    verifier.choose(examples)?;
    let mut built = verifier.built;
    for example in &mut built {
        example.distractors.truncate(4);
    }
    Ok(built)
}

/// One annotation round of a context.
struct Round<'a> {
    number: i64,
    endings: &'a [i64],
    submissions: &'a [SubmissionRecord],
}

impl Round<'_> {
    /// Every round of the task's context, the earliest first, its open task last.
    fn all(task: &CurrentTask) -> Vec<Round<'_>> {
        task.earlier
            .iter()
            .map(|r| Round {
                number: r.round,
                endings: &r.endings,
                submissions: &r.submissions,
            })
            .chain(std::iter::once(Round {
                number: task.round,
                endings: &task.endings,
                submissions: &task.submissions,
            }))
            .collect()
    }

    /// The consensus label of every ending, from the submissions that are not broken flags;
    /// `None` while there are none.
    fn labels(&self) -> Option<HashMap<i64, rules::Consensus>> {
        let submissions: Vec<_> = self.submissions.iter().filter(|s| !s.broken).collect();
        if submissions.is_empty() {
            return None;
        }
        Some(
            self.endings
                .iter()
                .filter_map(|&e| {
                    let votes: Vec<(Judgement, Option<Rank>)> = submissions
                        .iter()
                        .filter_map(|s| s.labels.iter().find(|(l, _)| l.ending_id == e))
                        .map(|(l, _)| (l.judgement, l.rank))
                        .collect();
                    rules::consensus(&votes).map(|c| (e, c))
                })
                .collect(),
        )
    }
}

/// What verified assembly has produced so far.
struct Verifier<'a> {
    inputs: &'a Inputs<'a>,
    built: Vec<NewAssembled>,
    /// Indices into `built` of the questions whose found ending is gold: the choice's questions.
    choosable: Vec<usize>,
    summary: &'a mut Summary,
    reannotations: &'a mut Vec<(i64, Vec<i64>)>,
}

impl Verifier<'_> {
    /// Applies the assembly rules to a context's rounds: its verified examples (and a spare
    /// round when it has too few to choose from), its next round of annotation, or why it is
    /// dropped or waits.
    fn decide(&mut self, ex: &Example, task: &CurrentTask) -> Result<()> {
        let pool = if task.round > 0 {
            self.scored_pool(ex)?
        } else {
            HashMap::new()
        };
        let rounds = Round::all(task);
        let last = rounds.len() - 1;
        for (i, round) in rounds.iter().enumerate() {
            let Some(labels) = round.labels() else {
                if i == last {
                    self.count_unlabelled(task);
                }
                continue;
            };
            let generations = self.generations(ex, round.endings, &pool);
            match rules::decide(ex.gold_ending_id, &generations, &labels) {
                Decision::Gold {
                    found_rank,
                    example,
                    generated_gold,
                } => {
                    let decided = Decided {
                        found_rank,
                        example,
                        generated_gold,
                    };
                    return self.build(ex, task, &rounds[i..], decided, pool);
                }
                Decision::Reannotate { reason, keep } if i == last => {
                    let pool = if task.round > 0 {
                        pool
                    } else {
                        self.scored_pool(ex)?
                    };
                    self.reannotate(ex, task, (reason, &keep), &pool);
                    return Ok(());
                }
                Decision::Drop(reason) if i == last => {
                    *self
                        .summary
                        .dropped
                        .entry(reason.as_str().into())
                        .or_default() += 1;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A task without usable labels: awaiting them, or flagged broken by every submission.
    fn count_unlabelled(&mut self, task: &CurrentTask) {
        if task.submissions.is_empty() {
            self.summary.awaiting_labels += 1;
        } else {
            self.summary.broken += 1;
        }
    }

    /// The endings of a round other than the found one, in the order they become distractors.
    fn generations(
        &self,
        ex: &Example,
        endings: &[i64],
        pool: &HashMap<i64, FinalPoint>,
    ) -> Vec<i64> {
        let generations: Vec<i64> = endings
            .iter()
            .copied()
            .filter(|&e| e != ex.gold_ending_id)
            .collect();
        let Inputs { run, order, .. } = self.inputs;
        order.order(ex, run, &generations, pool, "distractors")
    }

    /// The question decided by `rounds[0]`, with the candidates its later (spare) rounds add;
    /// queues a spare round when it has fewer than `choose_from` and none was asked yet.
    fn build(
        &mut self,
        ex: &Example,
        task: &CurrentTask,
        rounds: &[Round],
        decided: Decided,
        pool: HashMap<i64, FinalPoint>,
    ) -> Result<()> {
        let Decided {
            found_rank,
            mut example,
            generated_gold,
        } = decided;
        let split = self.inputs.run.splits[&ex.group];
        let fold = self.inputs.run.folds.get(&ex.id).copied();
        let mut spare_awaiting = false;
        for spare in &rounds[1..] {
            match spare.labels() {
                Some(labels) => {
                    let generations = self.generations(ex, spare.endings, &pool);
                    let more = rules::spare_distractors(&generations, &labels);
                    example.distractors.extend(more);
                }
                None => {
                    self.summary.spare_rounds_awaiting_labels += 1;
                    spare_awaiting = true;
                }
            }
        }
        // Reviews set candidates aside after the choice (`choose`), so that a review of one
        // question changes no other question's choice; a question left with fewer than three
        // is dropped there and gets more candidates from a spare round.
        let too_few = self.usable(ex.id, &example.distractors) < 3;
        self.summary.review_too_few += usize::from(too_few);
        let source = gold_source(found_rank, rounds[0].number);
        self.choosable.push(self.built.len());
        self.built
            .push(verified(ex.id, split, fold, source, &example));
        if let Some(generated) = generated_gold {
            self.built.extend(generated_gold_example(
                ex.id,
                split,
                fold,
                &generated,
                self.summary,
            ));
        }
        let wants_more = rounds.len() == 1 && example.distractors.len() < self.inputs.choose_from;
        if (too_few && !spare_awaiting) || wants_more {
            self.queue_spare(ex, task, pool)?;
        }
        Ok(())
    }

    /// Queues a spare round: the found ending and up to five scored pool endings no annotator
    /// has seen, those nearest the found endings' scores first; counted when none is left.
    fn queue_spare(
        &mut self,
        ex: &Example,
        task: &CurrentTask,
        pool: HashMap<i64, FinalPoint>,
    ) -> Result<()> {
        let pool = if pool.is_empty() {
            self.scored_pool(ex)?
        } else {
            pool
        };
        let fresh = unshown(&pool, &task.ever_shown, &[]);
        let draw = format!("spare\u{0}{}", task.round + 1);
        let Inputs { run, order, .. } = self.inputs;
        let fresh = order.order(ex, run, &fresh, &pool, &draw);
        if fresh.is_empty() {
            self.summary.spare_pool_empty += 1;
            return Ok(());
        }
        let endings = std::iter::once(ex.gold_ending_id)
            .chain(fresh.into_iter().take(ENDINGS_PER_TASK - 1))
            .collect();
        self.summary.spare_rounds_queued += 1;
        self.reannotations.push((ex.id, endings));
        Ok(())
    }

    /// The context's scored pool: it holds the scores of endings a re-annotation refill brought
    /// in (not assigned negatives) and the candidates of a new refill, so it is read only for a
    /// context past its first round or one to refill.
    fn scored_pool(&self, ex: &Example) -> Result<HashMap<i64, FinalPoint>> {
        Ok(self
            .inputs
            .store
            .scored_pool(self.inputs.run_id, ex.id)?
            .into_iter()
            .collect())
    }

    /// Queues the context for another round (counted by `reason`) with the endings it `keep`s
    /// and fresh ones from its `pool` that no annotator has seen; lists it when too few are left.
    fn reannotate(
        &mut self,
        ex: &Example,
        task: &CurrentTask,
        (reason, keep): (rules::ReannotateReason, &[i64]),
        pool: &HashMap<i64, FinalPoint>,
    ) {
        let fresh = unshown(pool, &task.ever_shown, keep);
        let draw = format!("refill\u{0}{}", task.round + 1);
        let Inputs { run, order, .. } = self.inputs;
        let fresh = order.order(ex, run, &fresh, pool, &draw);
        match refill(task, keep, fresh) {
            Some(endings) => {
                *self
                    .summary
                    .reannotation_queued
                    .entry(reason.as_str().into())
                    .or_default() += 1;
                self.reannotations.push((ex.id, endings));
            }
            None => self.summary.cannot_refill.push(ex.ext_id.clone()),
        }
    }

    /// How many of a context's `candidates` no review set aside.
    fn usable<T>(&self, example_id: i64, candidates: &[(i64, T)]) -> usize {
        let vetoed = self.inputs.vetoes.get(&example_id);
        candidates
            .iter()
            .filter(|d| !rules::is_vetoed(vetoed, d.0))
            .count()
    }

    /// Counts every question's candidates and, when `choose_from` allows a choice, puts the
    /// candidates of each question with more than three in [`choice`]'s order; then sets aside
    /// the candidates reviews named. The choice reads every candidate, set aside or not: its
    /// readers learn from all questions, and a review must not change the others' order.
    fn choose(&mut self, examples: &[Example]) -> Result<()> {
        for &i in &self.choosable {
            let built = &self.built[i];
            let n = self.usable(built.example_id, &built.distractors);
            *self.summary.candidates_per_question.entry(n).or_default() += 1;
        }
        if self.inputs.choose_from > 3 {
            self.order_by_choice(examples)?;
        }
        for built in &mut self.built {
            let candidates: Vec<i64> = built.distractors.iter().map(|d| d.0).collect();
            let vetoed = self.inputs.vetoes.get(&built.example_id);
            let (kept, set_aside) = rules::without_vetoed(&candidates, vetoed);
            self.summary.review_set_aside += set_aside;
            built.distractors.retain(|d| kept.contains(&d.0));
        }
        // Only reviews leave a question with fewer than three: a found ending's question is
        // counted in `build`, a generated gold's here.
        self.summary.generated_gold_too_few_distractors += self
            .built
            .iter()
            .filter(|b| b.distractors.len() < 3 && b.gold_source == "gen-orig")
            .count();
        self.built.retain(|b| b.distractors.len() >= 3);
        Ok(())
    }

    /// Puts the candidates of each question with more than three in [`choice`]'s order.
    fn order_by_choice(&mut self, examples: &[Example]) -> Result<()> {
        let group_of: HashMap<i64, &str> =
            examples.iter().map(|e| (e.id, e.group.as_str())).collect();
        let mut questions = Vec::with_capacity(self.choosable.len());
        for &i in &self.choosable {
            let built = &self.built[i];
            let readings = self.inputs.store.ending_readings(built.example_id)?;
            let reading = |id: i64| readings.get(&id).cloned().unwrap_or_default();
            questions.push(choice::Question {
                group: group_of[&built.example_id].to_string(),
                found: reading(built.gold_ending_id).0,
                candidates: built.distractors.iter().map(|d| reading(d.0)).collect(),
            });
        }
        let orders = choice::order(&questions, self.inputs.seed);
        for (&i, order) in self.choosable.iter().zip(orders) {
            let example_id = self.built[i].example_id;
            if self.usable(example_id, &self.built[i].distractors) > 3 {
                self.summary.chosen_after_annotation += 1;
            }
            let distractors = &mut self.built[i].distractors;
            if distractors.len() > 3 {
                *distractors = order.iter().map(|&k| distractors[k]).collect();
            }
        }
        Ok(())
    }
}

/// What the deciding round of a question produced (see [`Decision::Gold`]).
struct Decided {
    found_rank: Rank,
    example: Built,
    generated_gold: Option<Built>,
}

/// The full CSVs' `gold-source` of a verified example whose found ending is gold: `gold0` when
/// annotators ranked it best, `gold1` when second; `-orig` when the first round decided it,
/// `-reannot` when a later one did.
fn gold_source(found_rank: Rank, round: i64) -> String {
    let which = if found_rank == Rank::Best {
        "gold0"
    } else {
        "gold1"
    };
    let stage = if round == 0 { "orig" } else { "reannot" };
    format!("{which}-{stage}")
}

/// The example whose gold is a generation annotators ranked best above the found ending: kept
/// in the training split only (an evaluation question must have a found ending as its answer),
/// and only with three distractors.
fn generated_gold_example(
    example_id: i64,
    split: Split,
    fold: Option<i64>,
    generated: &Built,
    summary: &mut Summary,
) -> Option<NewAssembled> {
    if split != Split::Train {
        summary.generated_gold_withheld_from_eval += 1;
        None
    } else if generated.distractors.len() < 3 {
        summary.generated_gold_too_few_distractors += 1;
        None
    } else {
        Some(verified(
            example_id,
            split,
            fold,
            "gen-orig".into(),
            generated,
        ))
    }
}

fn verified(
    example_id: i64,
    split: Split,
    fold: Option<i64>,
    gold_source: String,
    b: &Built,
) -> NewAssembled {
    NewAssembled {
        example_id,
        split,
        gold_ending_id: b.gold,
        gold_source,
        gold_type: Some(b.gold_type),
        verified: true,
        fold,
        distractors: b
            .distractors
            .iter()
            .map(|&(ending_id, kind)| (ending_id, Some(kind)))
            .collect(),
    }
}

/// The pool endings never shown to annotators for this context (`shown`) and not kept, in id
/// order: what a re-annotation or a spare round may bring in.
fn unshown(pool: &HashMap<i64, FinalPoint>, shown: &BTreeSet<i64>, keep: &[i64]) -> Vec<i64> {
    let mut fresh: Vec<i64> = pool
        .keys()
        .copied()
        .filter(|e| !shown.contains(e) && !keep.contains(e))
        .collect();
    fresh.sort_unstable();
    fresh
}

/// The endings of a re-annotation task: `keep` plus the first of `fresh` (the context's scored
/// pool endings never shown before, in the order they become distractors), up to the old task's
/// size; `None` when the pool cannot fill it.
fn refill(task: &CurrentTask, keep: &[i64], fresh: Vec<i64>) -> Option<Vec<i64>> {
    let need = task.endings.len().saturating_sub(keep.len());
    if fresh.len() < need {
        return None;
    }
    Some(
        keep.iter()
            .copied()
            .chain(fresh.into_iter().take(need))
            .collect(),
    )
}
