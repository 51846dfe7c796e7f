-- afkit project schema, version 11.
-- Pools travel between projects in pool bundles (`afkit pool export` / `afkit pool import`). A
-- growth round answered an AF run of the project that sampled it; in a project that imported the
-- pool that run does not exist, so there `af_run_id` is NULL and `bundle_af_run` keeps the id
-- the run had in the project that grew the pool (as the bundle names it). Exactly one of the two
-- is set; a round is still one row per pool and run.
CREATE TABLE pool_growth_v11 (
    example_id    INTEGER NOT NULL REFERENCES pools(example_id) ON DELETE CASCADE,
    af_run_id     INTEGER REFERENCES af_runs(id) ON DELETE CASCADE,
    bundle_af_run INTEGER,
    generation_id INTEGER NOT NULL REFERENCES generations(id),
    requested     INTEGER NOT NULL,
    produced      INTEGER NOT NULL,
    draws         INTEGER NOT NULL,
    rejected      TEXT NOT NULL,         -- JSON object, reason -> draws not kept
    seconds       REAL NOT NULL,
    finished_at   TEXT NOT NULL,
    CHECK ((af_run_id IS NULL) <> (bundle_af_run IS NULL)),
    UNIQUE (example_id, af_run_id),
    UNIQUE (example_id, bundle_af_run)
);
INSERT INTO pool_growth_v11(example_id, af_run_id, generation_id, requested, produced, draws,
                            rejected, seconds, finished_at)
    SELECT example_id, af_run_id, generation_id, requested, produced, draws, rejected, seconds,
           finished_at
    FROM pool_growth ORDER BY rowid;
DROP TABLE pool_growth;
ALTER TABLE pool_growth_v11 RENAME TO pool_growth;
