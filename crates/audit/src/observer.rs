//! What an audit reports while it works, so that the command line can draw it: the audit itself
//! prints nothing.

/// Every method has a default that does nothing. `Send`: the fits of `--cv` and a language
/// model's questions report from worker threads (through a lock).
pub trait Observer: Send {
    /// Something worth telling the user: a baseline skipped and why, a file without labels.
    fn note(&mut self, _message: &str) {}
    /// A counted step begins, `total` units of `unit` long ("texts embedded", "fits").
    fn counting(&mut self, _total: usize, _unit: &str) {}
    /// `n` more units of the current step are done.
    fn counted(&mut self, _n: usize) {}
}

/// An observer that ignores everything.
pub struct Silent;

impl Observer for Silent {}
