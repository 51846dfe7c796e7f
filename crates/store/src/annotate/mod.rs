//! Annotate's tables, by concern: [`tasks`] (the items to verify, the recorded hand-out policy,
//! and the re-annotation tasks that assemble queues through [`crate::Store::create_reannotation_task`]:
//! the one place where a later stage writes annotate's tables, kept here so that neither stage
//! imports the other), [`claims`] (who holds which item, and whether its process still runs) and
//! [`labels`] (submissions, skips, their labels and undo).
//!
//! The orders items are handed out in are the annotate stage's (it makes the tasks in its seeded
//! order and gives a session its preferred tasks); which item an annotator gets next in them is
//! decided where it is claimed. Every write that decides who gets what runs in a
//! `BEGIN IMMEDIATE` transaction: it takes the file's write lock before reading, so two
//! annotator processes never both see an item as free.

pub mod claims;
pub mod labels;
pub mod tasks;

#[cfg(test)]
mod tests;
