-- afkit project schema, version 4.
-- AF's ensemble gained a subword model and a sentence model; their held-out accuracy per
-- iteration (NULL in MLP-only iterations and in runs made before them or without them).
ALTER TABLE af_iterations ADD COLUMN acc_subword REAL;
ALTER TABLE af_iterations ADD COLUMN acc_sentence REAL;

-- The sentence model's input: the MiniLM embedding of `sent2 + " " + ending` for every ending of a
-- pool, computed once (the first `afkit filter` that needs it) and read by every later run.
CREATE TABLE sentence_vectors (
    ending_id INTEGER PRIMARY KEY REFERENCES endings(id) ON DELETE CASCADE,
    model     TEXT NOT NULL,             -- encoder that made it
    vector    BLOB NOT NULL              -- little-endian f32s
);
