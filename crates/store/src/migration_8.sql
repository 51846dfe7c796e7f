-- afkit project schema, version 8.
-- Scores of pool endings from further language models (`afkit filter --scorer MODEL`): the
-- summed log-likelihood of the ending after its context (sent1 + " " + sent2) and after the
-- document start alone, and its length in the scorer's tokens. Computed once per ending and model
-- (the first run that asks for the model), read by every later run; a resumed scoring starts at
-- the first context without scores.
CREATE TABLE scorer_scores (
    ending_id INTEGER NOT NULL REFERENCES endings(id) ON DELETE CASCADE,
    model     TEXT NOT NULL,             -- SHA-256 of the scorer's GGUF file
    ll_cond   REAL NOT NULL,
    ll_alone  REAL NOT NULL,
    n_tok     INTEGER NOT NULL,
    PRIMARY KEY (ending_id, model)
) WITHOUT ROWID;

-- The fine-tuned adversary (`afkit filter --discriminator minilm`): its held-out accuracy per
-- iteration and that of the adversary AF acts on (the stylistic ensemble and the fine-tuned model
-- together), NULL where a run has none; and the fine-tuned model's trained weights after the
-- latest iteration that trained it, committed with that iteration, so a resumed run continues
-- from the same model.
ALTER TABLE af_iterations ADD COLUMN acc_minilm REAL;
ALTER TABLE af_iterations ADD COLUMN acc_adversary REAL;
CREATE TABLE af_discriminator_states (
    run_id    INTEGER PRIMARY KEY REFERENCES af_runs(id) ON DELETE CASCADE,
    iteration INTEGER NOT NULL,         -- the iteration that trained it last
    state     BLOB NOT NULL             -- little-endian f32s of the trained layers and the head
);
