-- afkit project schema, version 2.
-- `af_scores` holds a score for every pool ending (25.6 million rows in a 100k-context project
-- with 256 candidates each). As a rowid table it was two B-trees, the rows and the primary-key
-- index; WITHOUT ROWID it is one B-tree keyed by (run_id, ending_id), about half the size on
-- disk, and the final pass's inserts maintain one tree instead of two.
CREATE TABLE af_scores_v2 (
    run_id    INTEGER NOT NULL REFERENCES af_runs(id) ON DELETE CASCADE,
    ending_id INTEGER NOT NULL REFERENCES endings(id) ON DELETE CASCADE,
    score     REAL NOT NULL,
    PRIMARY KEY (run_id, ending_id)
) WITHOUT ROWID;
INSERT INTO af_scores_v2(run_id, ending_id, score) SELECT run_id, ending_id, score FROM af_scores;
DROP TABLE af_scores;
ALTER TABLE af_scores_v2 RENAME TO af_scores;
