-- afkit project schema, version 3.
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
