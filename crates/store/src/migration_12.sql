-- afkit project schema, version 12.
-- A scorer model reads each ending after its context; its reading of the ending after the
-- document start alone is no longer taken (`ll_alone` NULL), and readings stored before keep it.
CREATE TABLE scorer_scores_v12 (
    ending_id INTEGER NOT NULL REFERENCES endings(id) ON DELETE CASCADE,
    model     TEXT NOT NULL,             -- SHA-256 of the scorer's GGUF file
    ll_cond   REAL NOT NULL,
    ll_alone  REAL,
    n_tok     INTEGER NOT NULL,
    PRIMARY KEY (ending_id, model)
) WITHOUT ROWID;
INSERT INTO scorer_scores_v12(ending_id, model, ll_cond, ll_alone, n_tok)
    SELECT ending_id, model, ll_cond, ll_alone, n_tok FROM scorer_scores;
DROP TABLE scorer_scores;
ALTER TABLE scorer_scores_v12 RENAME TO scorer_scores;
