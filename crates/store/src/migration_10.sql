-- afkit project schema, version 10.
-- The fluency floor: a second language model reads each AF run's found endings and assigned
-- negatives after their context; negatives it finds less likely, per token, than most found
-- endings are not taken as distractors while fluent ones are left.
CREATE TABLE fluency_scores (
    ending_id INTEGER NOT NULL REFERENCES endings(id) ON DELETE CASCADE,
    model     TEXT NOT NULL,             -- SHA-256 of the reader's GGUF file
    ll_cond   REAL NOT NULL,             -- summed log-likelihood after sent1 + " " + sent2
    n_tok     INTEGER NOT NULL,
    PRIMARY KEY (ending_id, model)
) WITHOUT ROWID;
CREATE TABLE af_fluency (
    run_id    INTEGER PRIMARY KEY REFERENCES af_runs(id) ON DELETE CASCADE,
    reader    TEXT NOT NULL,             -- the name the user gave
    model     TEXT NOT NULL,             -- SHA-256 of its GGUF file
    quantile  REAL NOT NULL,
    threshold REAL NOT NULL              -- per-token log-likelihood under which a negative is refused
);
