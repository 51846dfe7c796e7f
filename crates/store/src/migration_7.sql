-- afkit project schema, version 7.
-- The final cross-fitted pass also keeps the sentence model's score of every ending (NULL when
-- the run had no sentence model): `assemble --unverified` matches distractors to the found
-- endings on it as well as on the ensemble's score, because a sentence-embedding classifier
-- still told apart distractors matched on the ensemble's score alone.
ALTER TABLE af_scores ADD COLUMN sentence_score REAL;
