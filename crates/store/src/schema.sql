-- afkit project schema, version 1.
-- One section per pipeline stage; each stage reads the tables of the stages before it.

-- Project-wide key/value settings (creation time, afkit version, recorded seeds).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- ===== ingest =====
-- One row per ingested input file (re-ingesting the same content reuses the row).
CREATE TABLE sources (
    id          INTEGER PRIMARY KEY,
    path        TEXT NOT NULL,
    format      TEXT NOT NULL,           -- activitynet | jsonl | swag-csv
    sha256      TEXT NOT NULL,
    options     TEXT NOT NULL DEFAULT '{}', -- JSON: e.g. {"min_token_count": 4}
    ingested_at TEXT NOT NULL,
    UNIQUE (sha256, format, options)
);

-- Kept examples: a context (sent1 + sent2) with its found ending.
CREATE TABLE examples (
    id          INTEGER PRIMARY KEY,
    ext_id      TEXT NOT NULL UNIQUE,    -- stable id: "<video>#<index>" or the input's id
    grp         TEXT NOT NULL,           -- group for splitting (video id)
    sent1       TEXT NOT NULL,
    sent2       TEXT NOT NULL,
    ending      TEXT NOT NULL,           -- the found (gold) ending
    source_id   INTEGER NOT NULL REFERENCES sources(id),
    gold_source TEXT,                    -- provenance from a SWAG CSV (gold0-orig, ...), else NULL
    added_at    TEXT NOT NULL
);
CREATE INDEX examples_grp ON examples(grp);

-- Input records that did not become examples, one row per record and reason.
CREATE TABLE dropped (
    ext_id    TEXT PRIMARY KEY,
    source_id INTEGER NOT NULL REFERENCES sources(id),
    reason    TEXT NOT NULL              -- no_verb_phrase | short_context | short_ending | long_ending | rare_token
);

-- ===== generate =====
-- One generation job (model + prompt + sampling parameters + seed).
CREATE TABLE generations (
    id           INTEGER PRIMARY KEY,
    backend      TEXT NOT NULL,          -- local | openai | import
    model        TEXT NOT NULL,          -- file name or endpoint model name
    model_sha256 TEXT,
    prompt       TEXT NOT NULL,          -- template name
    params       TEXT NOT NULL,          -- JSON: n_neg, temperature, top_k, top_p, min_p, max_tokens, batch
    seed         INTEGER NOT NULL,
    started_at   TEXT NOT NULL
);

-- A context whose pool is complete (written in the same transaction as its endings).
CREATE TABLE pools (
    example_id    INTEGER PRIMARY KEY REFERENCES examples(id) ON DELETE CASCADE,
    generation_id INTEGER NOT NULL REFERENCES generations(id),
    requested     INTEGER NOT NULL,
    produced      INTEGER NOT NULL,      -- unique endings kept; shortfall = requested - produced
    ctx_logprob   REAL,                  -- mean log-prob of the context tokens
    n_tok_sent1   INTEGER,               -- LM token lengths, inputs of the AF perplexity MLP
    n_tok_sent2   INTEGER,
    seconds       REAL NOT NULL,
    finished_at   TEXT NOT NULL
);

-- Every ending of a context: the found one (is_gold = 1) and the generated candidates,
-- each with the LM features the AF perplexity MLP reads.
CREATE TABLE endings (
    id             INTEGER PRIMARY KEY,
    example_id     INTEGER NOT NULL REFERENCES examples(id) ON DELETE CASCADE,
    text           TEXT NOT NULL,
    is_gold        INTEGER NOT NULL DEFAULT 0,
    generation_id  INTEGER REFERENCES generations(id),
    lp_cond        REAL,                 -- mean log-prob of the ending given the context
    lp_alone       REAL,                 -- mean log-prob of the ending after the document-start token
    lp_final_punct REAL,                 -- log-prob of the ending's final punctuation token
    n_tok_ending   INTEGER,
    UNIQUE (example_id, text)
);
CREATE INDEX endings_example ON endings(example_id, is_gold);

-- ===== filter (adversarial filtering) =====
CREATE TABLE af_runs (
    id          INTEGER PRIMARY KEY,
    k           INTEGER NOT NULL,
    seed        INTEGER NOT NULL,
    params      TEXT NOT NULL,           -- JSON: every hyper-parameter of the run
    started_at  TEXT NOT NULL,
    pool_fingerprint TEXT NOT NULL,      -- SHA-256 over the (context, ending) ids of the pools it filtered
    finished_at TEXT,                    -- set when the final cross-fitted pass is stored
    final_accuracy TEXT,                 -- JSON {mlp, bow, cnn, lstm, ensemble}: cross-fitted accuracy of the final pass
    status      TEXT NOT NULL            -- running | done | abandoned (replaced by a --new-run)
);

CREATE TABLE af_iterations (
    run_id      INTEGER NOT NULL REFERENCES af_runs(id) ON DELETE CASCADE,
    iteration   INTEGER NOT NULL,
    phase       TEXT NOT NULL,           -- mlp | ensemble
    swaps       INTEGER NOT NULL,
    seconds     REAL NOT NULL,
    n_test      INTEGER NOT NULL,
    acc_mlp     REAL,
    acc_bow     REAL,
    acc_cnn     REAL,
    acc_lstm    REAL,
    acc_ensemble REAL,
    finished_at TEXT NOT NULL,
    PRIMARY KEY (run_id, iteration)
);

-- The current assignment: k negatives per context; since_iteration = the iteration that brought
-- the ending in (-1 for the initial random assignment).
CREATE TABLE af_assignments (
    run_id          INTEGER NOT NULL REFERENCES af_runs(id) ON DELETE CASCADE,
    example_id      INTEGER NOT NULL REFERENCES examples(id) ON DELETE CASCADE,
    slot            INTEGER NOT NULL,
    ending_id       INTEGER NOT NULL REFERENCES endings(id) ON DELETE CASCADE,
    since_iteration INTEGER NOT NULL,
    PRIMARY KEY (run_id, example_id, slot),
    UNIQUE (run_id, example_id, ending_id)
);

-- Every swap ever made: the assignment history as a diff.
CREATE TABLE af_swaps (
    run_id        INTEGER NOT NULL REFERENCES af_runs(id) ON DELETE CASCADE,
    iteration     INTEGER NOT NULL,
    example_id    INTEGER NOT NULL,
    slot          INTEGER NOT NULL,
    old_ending_id INTEGER NOT NULL,
    new_ending_id INTEGER NOT NULL
);
CREATE INDEX af_swaps_run ON af_swaps(run_id, iteration);

-- Final cross-fitted pass: the fold each context was scored in (the ensemble that scored it was
-- trained on the other folds) and the ensemble score of the context's gold ending and of EVERY
-- pool ending, assigned or not (comparable within a context only; higher = harder).
CREATE TABLE af_folds (
    run_id     INTEGER NOT NULL REFERENCES af_runs(id) ON DELETE CASCADE,
    example_id INTEGER NOT NULL REFERENCES examples(id) ON DELETE CASCADE,
    fold       INTEGER NOT NULL,
    PRIMARY KEY (run_id, example_id)
);
CREATE TABLE af_scores (
    run_id    INTEGER NOT NULL REFERENCES af_runs(id) ON DELETE CASCADE,
    ending_id INTEGER NOT NULL REFERENCES endings(id) ON DELETE CASCADE,
    score     REAL NOT NULL,
    PRIMARY KEY (run_id, ending_id)
);

-- ===== annotate =====
-- One item to verify: a context and six endings in a recorded shuffled order. A re-annotation
-- (SWAG fn. 6) is a new task with round + 1 that supersedes the old one. Items are handed out in
-- id order, and ids are assigned in a seeded random order of the contexts, so the first M
-- round-0 tasks (replicas > 1) are a random sample of the contexts for measuring agreement.
CREATE TABLE tasks (
    id          INTEGER PRIMARY KEY,
    example_id  INTEGER NOT NULL REFERENCES examples(id) ON DELETE CASCADE,
    run_id      INTEGER NOT NULL REFERENCES af_runs(id),
    round       INTEGER NOT NULL DEFAULT 0,
    replicas    INTEGER NOT NULL,        -- annotators wanted (R for agreement items, else 1)
    seed        INTEGER NOT NULL,        -- the shuffle's seed
    status      TEXT NOT NULL DEFAULT 'open', -- open | superseded
    created_at  TEXT NOT NULL,
    UNIQUE (example_id, round)
);
CREATE INDEX tasks_open ON tasks(status, id);
CREATE TABLE task_endings (
    task_id   INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    position  INTEGER NOT NULL,
    ending_id INTEGER NOT NULL REFERENCES endings(id),
    PRIMARY KEY (task_id, position)
);

-- Who holds which item right now, so concurrent annotators do not collide. A claim is live while
-- its process runs (pid on host) and refreshes seen_at; a stale one (process gone, or not seen for
-- a while) no longer reserves the item for others, but still brings it back first to its annotator.
CREATE TABLE claims (
    task_id    INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    annotator  TEXT NOT NULL,
    claimed_at TEXT NOT NULL,
    seen_at    TEXT NOT NULL,            -- last heartbeat of the holding process
    pid        INTEGER,                  -- holding process; NULL once it is known to be gone
    host       TEXT NOT NULL,
    PRIMARY KEY (task_id, annotator)
);
CREATE INDEX claims_annotator ON claims(annotator);

-- Items an annotator chose not to do (they go to someone else, never back to this annotator).
CREATE TABLE skips (
    task_id    INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    annotator  TEXT NOT NULL,
    skipped_at TEXT NOT NULL,
    PRIMARY KEY (task_id, annotator)
);

-- One complete submission of a task by an annotator (TUI or crowd import).
CREATE TABLE submissions (
    id           INTEGER PRIMARY KEY,
    task_id      INTEGER NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    annotator    TEXT NOT NULL,
    origin       TEXT NOT NULL,          -- tui | crowd
    broken       INTEGER NOT NULL DEFAULT 0, -- flagged as a broken item instead of labelled
    seconds      REAL,                   -- time on the item
    submitted_at TEXT NOT NULL,
    UNIQUE (task_id, annotator)
);
CREATE INDEX submissions_annotator ON submissions(annotator, submitted_at);
CREATE TABLE labels (
    submission_id INTEGER NOT NULL REFERENCES submissions(id) ON DELETE CASCADE,
    ending_id     INTEGER NOT NULL REFERENCES endings(id),
    judgement     TEXT NOT NULL CHECK (judgement IN ('likely', 'unlikely', 'gibberish')),
    rank          TEXT CHECK (rank IN ('best', 'second')),
    PRIMARY KEY (submission_id, ending_id)
);

-- ===== assemble =====
CREATE TABLE splits (
    grp   TEXT PRIMARY KEY,
    split TEXT NOT NULL CHECK (split IN ('train', 'val', 'test'))
);
CREATE TABLE assembled (
    id          INTEGER PRIMARY KEY,
    example_id  INTEGER NOT NULL REFERENCES examples(id) ON DELETE CASCADE,
    split       TEXT NOT NULL,
    gold_ending_id INTEGER NOT NULL REFERENCES endings(id),
    gold_source TEXT NOT NULL,           -- gold0-orig | gold1-orig | gold0-reannot | gold1-reannot | gen-orig | unverified
    gold_type   TEXT,                    -- likely | unlikely | NULL when unverified
    verified    INTEGER NOT NULL,
    fold        INTEGER
);
CREATE TABLE assembled_distractors (
    assembled_id INTEGER NOT NULL REFERENCES assembled(id) ON DELETE CASCADE,
    position     INTEGER NOT NULL,       -- 0 = hardest
    ending_id    INTEGER NOT NULL REFERENCES endings(id),
    type         TEXT,                   -- likely | unlikely | NULL when unverified
    PRIMARY KEY (assembled_id, position)
);

-- ===== export =====
CREATE TABLE exports (
    id         INTEGER PRIMARY KEY,
    dir        TEXT NOT NULL,
    negatives  TEXT NOT NULL,            -- adversarial | random
    seed       INTEGER,
    files      TEXT NOT NULL,            -- JSON: file name -> sha256
    created_at TEXT NOT NULL
);
