-- afkit project schema, version 14.
-- Question reviews. After assembly a reviewer reads a question as a test taker sees it: the
-- context and its four endings, shuffled, the real one not marked. They pick the ending that
-- follows and name any other that could also follow, and any that is broken (ungrammatical, a
-- non-word, cut off). An ending a review named so, or picked over the real one, is never again a
-- distractor of that context: a question must have exactly one right answer, and the labels of
-- the annotation rounds, which judge each ending on its own, miss many of these.
CREATE TABLE review_items (
    id          INTEGER PRIMARY KEY,
    example_id  INTEGER NOT NULL REFERENCES examples(id) ON DELETE CASCADE,
    -- the question's four endings in the order the reviewer sees them (A, B, C, D)
    ending_a    INTEGER NOT NULL REFERENCES endings(id),
    ending_b    INTEGER NOT NULL REFERENCES endings(id),
    ending_c    INTEGER NOT NULL REFERENCES endings(id),
    ending_d    INTEGER NOT NULL REFERENCES endings(id),
    reviewers   INTEGER NOT NULL,        -- reviews wanted
    created_at  TEXT NOT NULL
);
CREATE INDEX review_items_example ON review_items(example_id);
CREATE TABLE reviews (
    id           INTEGER PRIMARY KEY,
    item_id      INTEGER NOT NULL REFERENCES review_items(id) ON DELETE CASCADE,
    reviewer     TEXT NOT NULL,
    pick         INTEGER NOT NULL REFERENCES endings(id),
    submitted_at TEXT NOT NULL,
    UNIQUE (item_id, reviewer)
);
CREATE TABLE review_flags (
    review_id INTEGER NOT NULL REFERENCES reviews(id) ON DELETE CASCADE,
    ending_id INTEGER NOT NULL REFERENCES endings(id),
    flag      TEXT NOT NULL CHECK (flag IN ('plausible', 'broken')),
    PRIMARY KEY (review_id, ending_id, flag)
);
