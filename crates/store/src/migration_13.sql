-- afkit project schema, version 13.
-- The final cross-fitted pass also keeps a style score of every ending: the word-level heads'
-- (bag of words, CNN, BiLSTM, subword) held-out scores, each standardised on the found endings
-- of the ending's fold, averaged. NULL in runs without those heads, in runs whose heads found the
-- real endings no more often than chance, and in runs finished before. `assemble` matches
-- distractors to the found endings on it as well, so that the distractors look as real as the
-- found endings to word-level classifiers.
ALTER TABLE af_scores ADD COLUMN style_score REAL;
