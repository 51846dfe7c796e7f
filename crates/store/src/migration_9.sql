-- afkit project schema, version 9.
-- The fine-tuned adversary is trained afresh in every AF iteration (a model carried between
-- iterations had trained on the real endings of contexts a later split holds out), so no run
-- needs its weights stored any more.
DROP TABLE af_discriminator_states;
