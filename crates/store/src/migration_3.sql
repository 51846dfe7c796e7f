-- afkit project schema, version 3.
-- What shaped each pool: the real context + ending pairs shown before its context (style
-- priming), and how many sequences were drawn and why those not kept were rejected.
ALTER TABLE pools ADD COLUMN style_examples TEXT;   -- JSON array of example ids; NULL: none shown
ALTER TABLE pools ADD COLUMN draws INTEGER;         -- sequences sampled; NULL: imported pool
ALTER TABLE pools ADD COLUMN rejected TEXT;         -- JSON object, reason -> draws not kept

-- Growth rounds: more endings sampled for a pool that an AF run found starved (its found ending
-- scored above every candidate), one row per pool and AF run. `pools.produced` counts them too.
CREATE TABLE pool_growth (
    example_id    INTEGER NOT NULL REFERENCES pools(example_id) ON DELETE CASCADE,
    af_run_id     INTEGER NOT NULL REFERENCES af_runs(id) ON DELETE CASCADE,
    generation_id INTEGER NOT NULL REFERENCES generations(id),
    requested     INTEGER NOT NULL,
    produced      INTEGER NOT NULL,
    draws         INTEGER NOT NULL,
    rejected      TEXT NOT NULL,         -- JSON object, reason -> draws not kept
    seconds       REAL NOT NULL,
    finished_at   TEXT NOT NULL,
    PRIMARY KEY (example_id, af_run_id)
);

-- Contexts that `generate` cannot use with its model (its prompt and the longest ending it may
-- sample do not fit the model's positions), with the reason. A later run with the same
-- generation settings skips them instead of failing on them again, and `afkit status` counts
-- them; another model or smaller --max-tokens may still use them.
CREATE TABLE unusable_contexts (
    example_id    INTEGER NOT NULL REFERENCES examples(id) ON DELETE CASCADE,
    generation_id INTEGER NOT NULL REFERENCES generations(id) ON DELETE CASCADE,
    reason        TEXT NOT NULL,
    recorded_at   TEXT NOT NULL,
    PRIMARY KEY (example_id, generation_id)
) WITHOUT ROWID;
