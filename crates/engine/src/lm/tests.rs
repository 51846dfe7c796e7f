//! Properties of the model, sampler and features on a tiny random llama written as a real GGUF
//! file (so loading and tokenising run the production code paths), with afkit's CPU kernels and
//! with the generic engine (the code a GPU runs).

use std::collections::HashSet;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::cache::Prefix;
use super::config::LlamaConfig;
use super::features::features;
use super::linear::{fast_bf16_kernel, Kernel};
use super::local::{DecodeGroup, DecodedRow, LocalLm, Stop};
use super::model::LanguageModel;
use super::sampler::{
    acceptable_ending, goes_on_the_last_word, normalise_ending, EndingRule, EndingSampler,
    SampleRequest, SampledEnding, SampledPool, SamplingParams,
};
use crate::device::Compute;
use crate::device::LmProducts;
use crate::fixtures::{write_random_gguf, RANDOM_GGUF_VOCAB};
use crate::seed::Seed;
use crate::simd::{simd_ceiling, SimdLevel};

/// The token ids of a reference file's JSON array (the llama.cpp and transformers comparisons).
pub(super) fn token_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The same text without the sampled tokens, so that its LM features are computed from scratch.
fn text_only(ending: &SampledEnding) -> SampledEnding {
    SampledEnding {
        text: ending.text.clone(),
        tokens: None,
    }
}

fn tiny_config() -> LlamaConfig {
    LlamaConfig {
        vocab: RANDOM_GGUF_VOCAB,
        d_model: 64,
        n_layer: 2,
        n_head: 4,
        n_kv_head: 2,
        d_ff: 128,
        rope_theta: 10_000.0,
        rms_eps: 1e-5,
        arch: Default::default(),
    }
}

/// afkit's CPU kernels first, then the generic engine on the CPU and, in a build with the `cuda`
/// feature, on the first GPU.
fn engines() -> Vec<Compute> {
    let mut engines = vec![
        Compute::cpu_f32(),
        Compute {
            cpu_kernels: false,
            ..Compute::cpu()
        },
    ];
    if cfg!(feature = "cuda") {
        engines.push(Compute {
            device: candle_core::Device::new_cuda(0).expect("a CUDA device"),
            cpu_kernels: false,
            lm_products: crate::device::LmProducts::F32,
        });
    }
    engines
}

fn tiny_lm_on(params: SamplingParams, compute: &Compute) -> LocalLm {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_random_gguf(&path, &tiny_config(), Seed::new(11)).unwrap();
    LocalLm::new(
        LanguageModel::load_on(&path, compute).unwrap(),
        params,
        None,
    )
}

fn params() -> SamplingParams {
    SamplingParams {
        max_tokens: 12,
        batch: 16,
        ..SamplingParams::default()
    }
}

/// Decodes `rows` rows of one context.
fn decode(lm: &LocalLm, prefix: &Prefix, rows: usize, rng: &mut ChaCha8Rng) -> Vec<DecodedRow> {
    let rule = EndingRule::default();
    let mut groups = [DecodeGroup {
        prefix,
        rows,
        rng,
        rule: &rule,
    }];
    lm.decode_groups(&mut groups).unwrap().pop().unwrap()
}

/// A request for `n` endings per prompt, seeded `first_seed`, `first_seed + 1`, ...
fn requests(prompts: &[&str], n: usize, first_seed: Seed) -> Vec<SampleRequest> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| SampleRequest {
            prompt: p.to_string(),
            exclude: vec![],
            n,
            seed: first_seed.plus(i as u64),
            rule: Default::default(),
        })
        .collect()
}

#[test]
fn contexts_decoded_in_one_batch_sample_what_they_sample_alone() {
    for compute in engines() {
        // Four slots for 13 rows: finished rows hand their slot to waiting ones (with the generic
        // engine: at most four rows of a context in lockstep).
        let lm = tiny_lm_on(
            SamplingParams {
                batch: 4,
                ..params()
            },
            &compute,
        );
        let prompts = [
            "A man is seen speaking to the camera. He",
            "Two dogs",
            "A woman in a red coat walks slowly along the beach while the sun sets. She",
        ];
        let prefixes: Vec<_> = prompts.iter().map(|p| lm.prefix(p).unwrap()).collect();
        let mut rngs: Vec<ChaCha8Rng> = (0..3).map(ChaCha8Rng::seed_from_u64).collect();
        let rule = EndingRule::default();
        let mut groups: Vec<DecodeGroup> = prefixes
            .iter()
            .zip(rngs.iter_mut())
            .zip([5, 1, 7])
            .map(|((p, rng), rows)| DecodeGroup {
                prefix: &p.prefix,
                rows,
                rng,
                rule: &rule,
            })
            .collect();
        let together = lm.decode_groups(&mut groups).unwrap();
        // Alone, with a slot for every row (no reuse).
        let roomy = tiny_lm_on(params(), &compute);
        for (i, (p, rows)) in prefixes.iter().zip([5, 1, 7]).enumerate() {
            let alone = decode(
                &lm,
                &p.prefix,
                rows,
                &mut ChaCha8Rng::seed_from_u64(i as u64),
            );
            assert_eq!(together[i].len(), rows);
            for (a, b) in together[i].iter().zip(&alone) {
                assert_eq!(a.tokens, b.tokens, "context {i}");
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() < 1e-4, "context {i}: {x} vs {y}");
                }
            }
        }
        // The same through the sampler interface: pools of several contexts at once equal the
        // pools sampled one by one.
        let requests = requests(&prompts, 6, Seed::new(40));
        let many = lm.sample_many(&requests).unwrap();
        for (request, pool) in requests.iter().zip(&many) {
            let single = roomy.sample(request).unwrap();
            let texts = |p: &super::sampler::SampledPool| -> Vec<String> {
                p.endings.iter().map(|e| e.text.clone()).collect()
            };
            assert_eq!(texts(pool), texts(&single));
            // How many rows were drawn for nothing depends on which rows share the batch.
            if !compute.cpu_kernels {
                assert_eq!(pool.draws, single.draws);
            }
        }
    }
}

/// Continuous batching starts a context's rows only as its pool needs them, yet keeps exactly
/// what decoding every row the budget allows and offering them in row order keeps.
#[test]
fn pools_keep_the_first_acceptable_rows_in_row_order() {
    let lm = tiny_lm_on(
        SamplingParams {
            batch: 5,
            ..params()
        },
        &Compute::cpu(),
    );
    let prompts = ["A man is seen speaking to the camera. He", "Two dogs"];
    let requests = requests(&prompts, 7, Seed::new(70));
    let pools = lm.sample_many(&requests).unwrap();
    for (request, pool) in requests.iter().zip(&pools) {
        let budget = lm.params.max_draws(request.n);
        let prefix = lm.prefix(&request.prompt).unwrap();
        let rows = decode(&lm, &prefix.prefix, budget, &mut request.seed.rng());
        let mut every_row = SampledPool::default();
        let mut seen = request.seen_endings();
        for row in rows {
            let mid_word = lm.begins_mid_word(&request.prompt, &row.tokens).unwrap();
            if row.stop == Stop::SentenceEnd && !mid_word {
                let text = normalise_ending(&lm.model.tokenizer.decode(&row.tokens).unwrap());
                let ending = SampledEnding {
                    text,
                    tokens: Some((row.tokens, row.logprobs)),
                };
                every_row.offer(ending, request, lm.params.max_words, &mut seen);
            }
        }
        assert!(!pool.endings.is_empty());
        assert_eq!(pool.endings, every_row.endings);
        assert!(pool.draws <= budget);
    }
}

#[test]
fn tokenizer_round_trips_text() {
    let lm = tiny_lm_on(params(), &Compute::cpu());
    let tok = &lm.model.tokenizer;
    for text in [
        "The girl dances around the room.",
        "  two  spaces, 1234 digits!",
        "naïve café — ünïcödé ✓",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    // Digits are split one by one (pre-tokenizer `smollm`), merges apply ("Ġthe").
    let ids = tok.encode(" the 42").unwrap();
    assert_eq!(ids.len(), 4, "{ids:?}");
}

#[test]
fn shared_prefix_decoding_matches_full_recomputation() {
    for compute in engines() {
        let lm = tiny_lm_on(params(), &compute);
        let llama = &lm.model.llama;
        let prompt = lm
            .prefix("A man is seen speaking to the camera. He")
            .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let rows = decode(&lm, &prompt.prefix, 8, &mut rng);
        let seqs: Vec<Vec<u32>> = rows.iter().map(|r| r.tokens.clone()).collect();
        // Log-probs recorded while decoding the batch = the same tokens scored as one batch
        // = each scored alone = a plain causal pass over prefix + tokens. With the CPU kernels
        // decoding and scoring are the same packed pass, so they agree to the head's rounding.
        let close = if compute.cpu_kernels { 1e-5 } else { 1e-3 };
        let batch = llama.score_continuations(&prompt.prefix, &seqs).unwrap();
        let mut full_ids = vec![lm.model.tokenizer.doc_start];
        full_ids.extend(lm.model.tokenizer.encode(&prompt.prompt).unwrap());
        for (r, row) in rows.iter().enumerate() {
            let alone = llama
                .score_continuations(&prompt.prefix, &seqs[r..r + 1])
                .unwrap();
            let mut ids = full_ids.clone();
            ids.extend(&row.tokens);
            let (_, full) = llama.prefill(&ids).unwrap();
            let full = &full[full.len() - row.tokens.len()..];
            for j in 0..row.tokens.len() {
                assert!(
                    (row.logprobs[j] - batch[r][j]).abs() < close,
                    "row {r} token {j}"
                );
                assert!(
                    (batch[r][j] - alone[0][j]).abs() < close,
                    "row {r} token {j}"
                );
                assert!((alone[0][j] - full[j]).abs() < 1e-3, "row {r} token {j}");
            }
        }
    }
}

#[test]
fn rows_stop_at_sentence_end_end_of_text_or_the_cap() {
    for compute in engines() {
        let lm = tiny_lm_on(params(), &compute);
        let tok = &lm.model.tokenizer;
        let prompt = lm
            .prefix("Two dogs are running through a field. They")
            .unwrap();
        let rows = decode(&lm, &prompt.prefix, 64, &mut ChaCha8Rng::seed_from_u64(1));
        let mut stops = HashSet::new();
        for row in &rows {
            stops.insert(format!("{:?}", row.stop));
            assert!(row.tokens.iter().all(|&t| !tok.is_end_of_generation(t)));
            let body = &row.tokens[..row.tokens.len().saturating_sub(1)];
            assert!(
                body.iter().all(|&t| !tok.ends_sentence[t as usize]),
                "sentence end inside a row"
            );
            match row.stop {
                Stop::SentenceEnd => {
                    assert!(tok.ends_sentence[*row.tokens.last().unwrap() as usize])
                }
                Stop::TokenCap => assert_eq!(row.tokens.len(), 12),
                Stop::EndOfText => assert!(row.tokens.len() < 12),
                Stop::TooLong => {
                    let words = row
                        .tokens
                        .iter()
                        .filter(|&&t| tok.starts_word[t as usize])
                        .count();
                    assert_eq!(words, 26);
                }
                Stop::Refused(why) => panic!("refused early ({why}) with no rule"),
            }
        }
        assert!(
            stops.contains("SentenceEnd") && stops.contains("TokenCap"),
            "{stops:?}"
        );
    }
}

#[test]
fn sampling_gives_unique_complete_endings_reproducibly() {
    for compute in engines() {
        let lm = tiny_lm_on(params(), &compute);
        let request = |seed: Seed| SampleRequest {
            prompt: "A woman is outside on a frozen lake. She".into(),
            exclude: vec![],
            n: 10,
            seed,
            rule: Default::default(),
        };
        let a = lm.sample(&request(Seed::new(3))).unwrap();
        let texts: Vec<&str> = a.endings.iter().map(|e| e.text.as_str()).collect();
        assert!(!texts.is_empty() && texts.len() <= 10);
        assert_eq!(
            texts.iter().collect::<HashSet<_>>().len(),
            texts.len(),
            "duplicates"
        );
        assert!(texts.iter().all(|t| acceptable_ending(t, 25)));
        assert!(a.draws <= 40, "retry cap ignored: {} draws", a.draws);
        let b = lm.sample(&request(Seed::new(3))).unwrap();
        assert_eq!(a.endings, b.endings, "same seed, different endings");
        let c = lm.sample(&request(Seed::new(4))).unwrap();
        assert_ne!(a.endings, c.endings, "different seeds, same endings");
        // Excluding an ending (the gold) keeps it out.
        let mut excluding = request(Seed::new(3));
        excluding.exclude = vec![format!("  {} ", texts[0])];
        let d = lm.sample(&excluding).unwrap();
        assert!(d.endings.iter().all(|e| e.text != texts[0]));
    }
}

#[test]
fn a_row_stopped_early_is_the_beginning_of_a_row_its_rule_refuses() {
    // The rule refuses an ending whose first word has an odd number of letters, which its first
    // whole word settles: a row stopped for it is the start of a row the pool would refuse.
    fn odd_first(text: &str) -> Option<&'static str> {
        let first = text.split_whitespace().next().unwrap_or("");
        (first.chars().count() % 2 == 1).then_some("odd_first_word")
    }
    // Asked at every word start; the first word is settled on the first call.
    fn first_call(words: &str) -> Option<&'static str> {
        odd_first(words).filter(|_| words.split_whitespace().count() == 1)
    }
    let compute = Compute::cpu_f32();
    let lm = tiny_lm_on(
        SamplingParams {
            max_tokens: 40,
            ..params()
        },
        &compute,
    );
    let tok = &lm.model.tokenizer;
    let prompt = lm
        .prefix("A man sets a ladder against the wall. He")
        .unwrap();
    // The random model rarely writes a space, so many rows are needed for some whole words.
    let decode_with = |rule: &EndingRule| {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut groups = [DecodeGroup {
            prefix: &prompt.prefix,
            rows: 800,
            rng: &mut rng,
            rule,
        }];
        lm.decode_groups(&mut groups).unwrap().pop().unwrap()
    };
    let whole = decode_with(&EndingRule::new(odd_first));
    let early = decode_with(&EndingRule::new(odd_first).refusing_early(first_call));
    let mut stopped_early = 0;
    for (whole, early) in whole.iter().zip(&early) {
        match early.stop {
            Stop::Refused(why) => {
                stopped_early += 1;
                assert_eq!(why, "odd_first_word");
                assert!(early.tokens.len() < whole.tokens.len());
                assert!(whole.tokens.starts_with(&early.tokens));
                let text = normalise_ending(&tok.decode(&whole.tokens).unwrap());
                assert_eq!(odd_first(&text), Some(why), "{text}");
            }
            _ => assert_eq!((&early.tokens, early.stop), (&whole.tokens, whole.stop)),
        }
    }
    assert!(stopped_early > 0, "no row was stopped early");
}

#[test]
fn no_kept_ending_begins_inside_the_prompts_last_word() {
    assert!(goes_on_the_last_word(
        "A lady in a white bra",
        "ids a skirt."
    ));
    assert!(!goes_on_the_last_word(
        "A lady in a white bra",
        " sits down."
    ));
    assert!(!goes_on_the_last_word(
        "A lady in a white bra",
        ", then sits."
    ));
    assert!(!goes_on_the_last_word(
        "A lady in a white bra ",
        "sits down."
    ));
    for compute in engines() {
        let lm = tiny_lm_on(params(), &compute);
        let tok = &lm.model.tokenizer;
        let pool = lm
            .sample(&SampleRequest {
                prompt: "A lady in a lacy black and white bra".into(),
                exclude: vec![],
                n: 20,
                seed: Seed::new(5),
                rule: Default::default(),
            })
            .unwrap();
        // A random model often draws a piece that goes on with "bra"; none is kept.
        assert!(
            pool.rejected.get("mid_word").is_some_and(|&n| n > 0),
            "{pool:?}"
        );
        for ending in &pool.endings {
            let first = ending.tokens.as_ref().unwrap().0[0];
            let piece = tok.decode(&[first]).unwrap();
            assert!(
                tok.starts_word[first as usize] || !goes_on_the_last_word("bra", &piece),
                "{:?} was kept",
                ending.text
            );
        }
    }
}

#[test]
fn features_reuse_sampled_logprobs_exactly() {
    for compute in engines() {
        let lm = tiny_lm_on(params(), &compute);
        let prompt = "A man is kneeling on a frozen lake. He";
        let pool = lm
            .sample(&SampleRequest {
                prompt: prompt.into(),
                exclude: vec![],
                n: 6,
                seed: Seed::new(9),
                rule: Default::default(),
            })
            .unwrap();
        let gold = "is using a tool to drill a hole.";
        let context = ("A man is kneeling on a frozen lake.", "He");
        let f = features(&lm, prompt, prompt, context, gold, &pool.endings, true).unwrap();
        assert_eq!(f.endings.len(), pool.endings.len());
        // Re-scoring the endings from scratch (no sampled log-probs) gives the same features.
        let plain: Vec<_> = pool.endings.iter().map(text_only).collect();
        let g = features(&lm, prompt, prompt, context, gold, &plain, true).unwrap();
        for (x, y) in f.endings.iter().zip(&g.endings) {
            assert!((x.lp_cond - y.lp_cond).abs() < 1e-3);
            assert!((x.lp_alone.unwrap() - y.lp_alone.unwrap()).abs() < 1e-6);
            assert_eq!(x.n_tok, y.n_tok);
        }
        // Without the ending-alone pass, the rest is the same.
        let without = features(&lm, prompt, prompt, context, gold, &pool.endings, false).unwrap();
        for (x, y) in f.endings.iter().zip(&without.endings) {
            assert_eq!((x.lp_cond, x.n_tok), (y.lp_cond, y.n_tok));
            assert_eq!(y.lp_alone, None);
        }
        assert_eq!(f.gold.n_tok, lm.ending_tokens(gold).unwrap().len());
        assert!(
            f.gold.lp_cond < 0.0 && f.gold.lp_alone.is_some_and(|a| a < 0.0) && f.ctx_logprob < 0.0
        );
        assert!(f.gold.lp_final_punct.is_some());
        assert!(f.n_tok_sent1 > 0 && f.n_tok_sent2 > 0);
    }
}

/// The generic engine (candle ops only: the code a GPU runs) samples what afkit's CPU kernels
/// sample from the same seeds, records the log-probs the kernels give the same tokens, and
/// computes the same features.
#[test]
fn generic_engine_samples_and_scores_like_the_cpu_kernels() {
    let kernels = tiny_lm_on(params(), &Compute::cpu_f32());
    for compute in &engines()[1..] {
        generic_engine_matches(&kernels, &tiny_lm_on(params(), compute));
    }
}

fn generic_engine_matches(kernels: &LocalLm, generic: &LocalLm) {
    let prompt = "A man is kneeling on a frozen lake. He";
    let (pk, pg) = (
        kernels.prefix(prompt).unwrap(),
        generic.prefix(prompt).unwrap(),
    );
    let a = decode(kernels, &pk.prefix, 32, &mut ChaCha8Rng::seed_from_u64(8));
    let b = decode(generic, &pg.prefix, 32, &mut ChaCha8Rng::seed_from_u64(8));
    let same = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.tokens == y.tokens)
        .count();
    assert!(same >= 30, "only {same} of 32 rows sampled the same tokens");
    let seqs: Vec<Vec<u32>> = b.iter().map(|r| r.tokens.clone()).collect();
    let scored = kernels
        .model
        .llama
        .score_continuations(&pk.prefix, &seqs)
        .unwrap();
    for (row, want) in b.iter().zip(&scored) {
        assert_eq!(row.logprobs.len(), want.len());
        for (x, y) in row.logprobs.iter().zip(want) {
            assert!((x - y).abs() < 1e-3, "{x} vs {y}");
        }
    }
    let request = SampleRequest {
        prompt: prompt.into(),
        exclude: vec![],
        n: 8,
        seed: Seed::new(2),
        rule: Default::default(),
    };
    let pool = generic.sample(&request).unwrap();
    assert!(!pool.endings.is_empty());
    let plain: Vec<_> = pool.endings.iter().map(text_only).collect();
    let (sent1, gold) = ("A man is kneeling on a frozen lake.", "drills a hole.");
    let f = features(
        generic,
        prompt,
        prompt,
        (sent1, "He"),
        gold,
        &pool.endings,
        true,
    )
    .unwrap();
    let g = features(kernels, prompt, prompt, (sent1, "He"), gold, &plain, true).unwrap();
    assert!((f.ctx_logprob - g.ctx_logprob).abs() < 1e-4);
    for (x, y) in std::iter::once((&f.gold, &g.gold)).chain(f.endings.iter().zip(&g.endings)) {
        assert!((x.lp_cond - y.lp_cond).abs() < 1e-3, "{x:?} vs {y:?}");
        assert!(
            (x.lp_alone.unwrap() - y.lp_alone.unwrap()).abs() < 1e-3,
            "{x:?} vs {y:?}"
        );
        assert_eq!(x.n_tok, y.n_tok);
    }
}

/// With reduced-precision products (bf16 on AMX tiles or with AVX512-BF16) the engine
/// scores within a few hundredths of a nat of the f32 kernels, records while sampling the
/// log-probs its own scoring gives, and from the same seeds samples many of the same rows (about
/// half of 32 here: the random model's flat distributions let a small difference change a draw,
/// and a row differs from its first changed draw on).
#[test]
fn reduced_precision_samples_and_scores_near_the_f32_kernels() {
    if fast_bf16_kernel().is_none() {
        eprintln!("skipped: this CPU has neither AMX tiles nor AVX512-BF16 (or AFKIT_SIMD keeps them off)");
        return;
    }
    samples_and_scores_near_the_f32_kernels(&Compute::cpu(), 8, 0.05);
}

/// The same with 8-bit products (AVX-512 VNNI), whose rounding is coarser: within a few tenths
/// of a nat on the random model, and fewer rows sampled alike.
#[test]
fn int8_products_sample_and_score_near_the_f32_kernels() {
    if !Kernel::supported().contains(&Kernel::Avx512Vnni) || simd_ceiling() < SimdLevel::Avx512 {
        eprintln!("skipped: this CPU has no AVX-512 VNNI (or AFKIT_SIMD keeps it off)");
        return;
    }
    let int8 = Compute {
        lm_products: LmProducts::Int8,
        ..Compute::cpu()
    };
    samples_and_scores_near_the_f32_kernels(&int8, 4, 0.3);
}

/// Decodes 32 rows from one seed with f32 products and with `compute`'s: at least `same` rows
/// alike, each sampled token's recorded log-prob what `compute`'s scoring gives, and that
/// within `tolerance` of the f32 scoring.
fn samples_and_scores_near_the_f32_kernels(compute: &Compute, same: usize, tolerance: f32) {
    let exact = tiny_lm_on(params(), &Compute::cpu_f32());
    let reduced = tiny_lm_on(params(), compute);
    let prompt = "A man is kneeling on a frozen lake. He";
    let (pe, pr) = (
        exact.prefix(prompt).unwrap(),
        reduced.prefix(prompt).unwrap(),
    );
    let (pe, pr) = (&pe.prefix, &pr.prefix);
    let a = decode(&exact, pe, 32, &mut ChaCha8Rng::seed_from_u64(8));
    let b = decode(&reduced, pr, 32, &mut ChaCha8Rng::seed_from_u64(8));
    let alike = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.tokens == y.tokens)
        .count();
    assert!(
        alike >= same,
        "only {alike} of 32 rows sampled the same tokens"
    );
    let seqs: Vec<Vec<u32>> = b.iter().map(|r| r.tokens.clone()).collect();
    let by_exact = exact.model.llama.score_continuations(pe, &seqs).unwrap();
    let by_reduced = reduced.model.llama.score_continuations(pr, &seqs).unwrap();
    for ((row, e), r) in b.iter().zip(&by_exact).zip(&by_reduced) {
        for ((sampled, e), r) in row.logprobs.iter().zip(e).zip(r) {
            assert!((sampled - r).abs() < 1e-3, "sampled {sampled}, scored {r}");
            assert!((e - r).abs() < tolerance, "f32 {e}, reduced {r}");
        }
    }
}

/// Tokens that share a prefix attend to it together, as matrix products, when enough of them
/// run in one pass; a token that attends alone gets the same bits as beside others.
#[test]
fn a_sequence_scores_the_same_alone_and_beside_others_of_its_prefix() {
    let lm = tiny_lm_on(params(), &Compute::cpu());
    let llama = &lm.model.llama;
    let prompt = "A woman ties a rope to a post by the river and pulls it tight. She then";
    let prefix = &lm.prefix(prompt).unwrap().prefix;
    let seq = |text: &str| lm.ending_tokens(text).unwrap();
    // Three tokens: two fed, too few to attend together, so alone they take the one-token path.
    let ending = seq(" walks back to the boat and climbs in.")[..3].to_vec();
    let others = [
        seq(" waves."),
        seq(" checks the knot twice and nods at the camera."),
        seq(" sits down on the grass."),
        seq(" throws the other end into the water to her friend."),
    ];
    let alone = llama
        .score_continuations(prefix, std::slice::from_ref(&ending))
        .unwrap();
    let together: Vec<Vec<u32>> = others
        .iter()
        .cloned()
        .chain(std::iter::once(ending.clone()))
        .collect();
    let beside = llama.score_continuations(prefix, &together).unwrap();
    let bits = |lps: &[f32]| lps.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&alone[0]), bits(&beside[others.len()]));
}
