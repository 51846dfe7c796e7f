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
