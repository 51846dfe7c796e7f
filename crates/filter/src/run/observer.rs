//! What a run tells its caller while it works ([`Observer`]) and where its time went
//! ([`Timings`]).

use afkit_store::af::{AfRun, IterationRecord, Phase};

/// What `filter` reports while it works. Every method has a default that does nothing.
pub trait Observer {
    /// Something worth telling the user (a resumed run, contexts left out, ...).
    fn note(&mut self, _message: &str) {}
    /// Pool endings given a sentence vector so far, of `total` missing ones.
    fn embedding(&mut self, _done: usize, _total: usize) {}
    /// Pool endings scored by the scorer model `name` so far, of `total` missing ones.
    fn scoring(&mut self, _name: &str, _done: usize, _total: usize) {}
    /// The run is ready: `done` of `total` iterations at most are already stored.
    fn iterations_started(&mut self, _run: &AfRun, _done: usize, _total: usize) {}
    fn phase_started(&mut self, _family: Phase) {}
    /// The phase `family` is over after `iterations` of at most `cap` (fewer: it converged).
    fn phase_ended(&mut self, _family: Phase, _iterations: usize, _cap: usize) {}
    fn iteration_done(&mut self, _record: &IterationRecord, _train_seconds: f64) {}
    fn final_pass_started(&mut self, _folds: usize) {}
    fn fold_done(&mut self) {}
}

/// An observer that does nothing.
pub struct Silent;
impl Observer for Silent {}

/// Seconds this `filter` call spent in each stage of the run (a resumed run counts only the
/// iterations it ran itself).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Timings {
    /// Sentence vectors computed (or read from the shared cache) for endings without one.
    pub sentence_vectors: f64,
    /// Scorer models (`--scorer`) run on endings without their scores.
    pub scorers: f64,
    /// Pools, features and scores read into memory and tokenised.
    pub reading: f64,
    /// The MLP phase's iterations.
    pub mlp_iterations: f64,
    /// The style phase's iterations (the ensemble before the fine-tuned adversary joins).
    pub style_iterations: f64,
    /// The ensemble phase's iterations, the fine-tuned adversary's share left out.
    pub ensemble_iterations: f64,
    /// The fine-tuned adversary (`--discriminator`) in the ensemble's iterations: training it
    /// and scoring the held-out pools with it.
    pub adversary: f64,
    /// The final cross-fitted pass, its scores stored.
    pub final_pass: f64,
}

impl Timings {
    /// Every stage with its seconds, in the order the run goes through them.
    pub fn stages(&self) -> [(&'static str, f64); 8] {
        [
            ("sentence vectors", self.sentence_vectors),
            ("scorer models", self.scorers),
            ("reading pools", self.reading),
            ("MLP iterations", self.mlp_iterations),
            ("style iterations", self.style_iterations),
            ("ensemble iterations", self.ensemble_iterations),
            ("fine-tuned adversary", self.adversary),
            ("final pass", self.final_pass),
        ]
    }

    /// Counts one iteration of `family` that took `seconds`, `adversary_seconds` of them spent
    /// on the fine-tuned adversary.
    pub(crate) fn add_iteration(&mut self, family: Phase, seconds: f64, adversary_seconds: f64) {
        self.adversary += adversary_seconds;
        match family {
            Phase::Mlp => self.mlp_iterations += seconds,
            Phase::Style => self.style_iterations += seconds,
            Phase::Ensemble => self.ensemble_iterations += seconds - adversary_seconds,
        }
    }
}
